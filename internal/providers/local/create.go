package local

import (
	"bufio"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/sandgate/sandgate/internal/procfs"
	"github.com/sandgate/sandgate/internal/providers"
	"github.com/sandgate/sandgate/internal/providers/local/jail"
	"github.com/sandgate/sandgate/internal/rootfs"
)

func validateSpec(spec providers.CreateSpec) error {
	var problems []string
	if !idPattern.MatchString(spec.ID) {
		problems = append(problems, "sandbox id must be 1-63 lowercase letters, digits or dashes")
	}
	keys := slices.Sorted(func(yield func(string) bool) {
		for k := range spec.Options {
			if !yield(k) {
				return
			}
		}
	})
	for _, k := range keys {
		problems = append(problems, fmt.Sprintf("unknown provider option %q (local takes none)", k))
	}
	if spec.Workdir != "" && (!filepath.IsAbs(spec.Workdir) || filepath.Clean(spec.Workdir) != spec.Workdir) {
		problems = append(problems, "workdir must be an absolute, clean path")
	}
	if err := providers.CheckEnv(spec.Env); err != nil {
		problems = append(problems, err.Error())
	}
	r := spec.Resources
	if r.CPU != nil && *r.CPU <= 0 {
		problems = append(problems, "resources.cpu must be positive")
	}
	if r.MemoryMiB != nil && *r.MemoryMiB <= 0 {
		problems = append(problems, "resources.memory_mib must be positive")
	}
	if r.DiskGiB != nil && *r.DiskGiB != 0 && *r.DiskGiB*(1<<30) < jail.MinDiskBytes {
		problems = append(problems, fmt.Sprintf("resources.disk_gib must be 0 (the default) or at least %g (%d MiB)", float64(jail.MinDiskBytes)/(1<<30), jail.MinDiskBytes>>20))
	}
	if (r.GPU != nil && *r.GPU > 0) || (r.GPUType != nil && *r.GPUType != "") {
		problems = append(problems, "the local provider has no GPUs")
	}
	if len(problems) > 0 {
		return providers.Errorf(providers.ErrInvalid, "%s", strings.Join(problems, "; "))
	}
	return nil
}

// Create makes a sandbox and returns once its agent answers. Options must
// be empty. A resource the spec leaves unset (or disk_gib 0) gets the
// provider's default limit. On error nothing is left behind.
func (l *Local) Create(ctx context.Context, spec providers.CreateSpec) (providers.Sandbox, error) {
	if err := validateSpec(spec); err != nil {
		return providers.Sandbox{}, err
	}
	if spec.Workdir == "" {
		spec.Workdir = defaultWorkdir
	}
	if spec.ReadyTimeout <= 0 {
		spec.ReadyTimeout = defaultReadyTimeout
	}
	// Before anything is made: an unknown image changes nothing.
	var img rootfs.Image
	if spec.Image != "" {
		var err error
		if img, err = l.image(ctx, spec.Image); err != nil {
			return providers.Sandbox{}, err
		}
	}
	if spec.ShmBytes != 0 && l.isolation != IsolationNamespaces {
		return providers.Sandbox{}, providers.Errorf(providers.ErrUnsupported, "shm_size needs isolation %q: with %q a sandbox shares the host's /dev/shm", IsolationNamespaces, l.isolation)
	}
	var snap snapshotRecord
	if spec.Snapshot != "" {
		var err error
		if snap, err = l.snapshotRecord(spec.Snapshot); err != nil {
			return providers.Sandbox{}, err
		}
		// The source's environment travels with its files, under the
		// request's.
		env := maps.Clone(snap.Env)
		if env == nil {
			env = map[string]string{}
		}
		maps.Copy(env, spec.Env)
		spec.Env = env
	}
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return providers.Sandbox{}, providers.Errorf(providers.ErrUnavailable, "provider is closed")
	}
	if l.creating[spec.ID] || l.boxes[spec.ID] != nil {
		l.mu.Unlock()
		return providers.Sandbox{}, providers.Errorf(providers.ErrConflict, "sandbox %s already exists", spec.ID)
	}
	var idBase uint32
	if l.isolation == IsolationNamespaces {
		var err error
		if idBase, err = l.allocRange(spec.ID); err != nil {
			l.mu.Unlock()
			return providers.Sandbox{}, providers.Wrap(providers.ErrUnavailable, err, "no id range left for a sandbox")
		}
	}
	l.creating[spec.ID] = true
	l.mu.Unlock()
	ok := false
	defer func() {
		l.mu.Lock()
		delete(l.creating, spec.ID)
		l.mu.Unlock()
		if !ok {
			l.freeRange(idBase)
		}
	}()
	res := l.withDefaults(spec.Resources)

	dir := filepath.Join(l.boxesDir, spec.ID)
	if err := os.Mkdir(dir, 0o700); err != nil {
		if errors.Is(err, os.ErrExist) {
			return providers.Sandbox{}, providers.Errorf(providers.ErrConflict, "sandbox %s already exists", spec.ID)
		}
		return providers.Sandbox{}, providers.Wrap(providers.ErrUnavailable, err, "cannot create sandbox directory")
	}
	st := persisted{ID: spec.ID, Isolation: l.isolation, Workdir: spec.Workdir, Env: spec.Env, Created: time.Now().UTC(), IDBase: idBase}
	defer func() {
		if !ok {
			ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), deleteTimeout)
			defer cancel()
			if err := destroy(ctx, dir, st); err != nil {
				l.log.Error("local: cleanup after failed create", "sandbox", spec.ID, "err", err)
			}
		}
	}()

	readyCtx, cancel := context.WithTimeout(ctx, spec.ReadyTimeout)
	defer cancel()
	cfg := jail.Config{
		ID: spec.ID, Dir: dir, Private: l.private, Workdir: spec.Workdir, Isolation: l.isolation,
		IDBase: idBase, ShmBytes: cmp.Or(spec.ShmBytes, l.shm), Seccomp: l.seccomp,
		Hostname: spec.Hostname, CapAdd: spec.CapAdd,
	}
	cgroups, skipped, err := createCgroups(spec.ID, res, l.pidsMax)
	if err != nil {
		return providers.Sandbox{}, providers.Wrap(providers.ErrUnavailable, err, "cannot apply resource limits")
	}
	st.Cgroups, cfg.Cgroups = cgroups, setupCgroups(cgroups)
	if len(skipped) > 0 {
		l.log.Warn("local: cgroup controllers not writable; limits not applied", "sandbox", spec.ID, "controllers", skipped)
	}
	if img.Dir != "" {
		// The image's environment (PATH and the like) under the request's.
		env := make(map[string]string, len(img.Config.Env)+len(spec.Env))
		for _, kv := range img.Config.Env {
			if k, v, ok := strings.Cut(kv, "="); ok {
				env[k] = v
			}
		}
		for k, v := range spec.Env {
			env[k] = v
		}
		st.Env, st.Image = env, spec.Image
	}
	extra := map[string]any{"isolation": l.isolation}
	if l.isolation == IsolationNamespaces {
		if res.DiskGiB != nil {
			// Whole 1 MiB units: the filesystem's size, and its template's name.
			cfg.DiskBytes = int64(*res.DiskGiB*(1<<10)) << 20
			cfg.DiskFS, cfg.Mkfs, cfg.DiskTemplates = l.diskFS, l.mkfs, l.stateDir+"/disk-templates"
			if l.mkfs == "" {
				return providers.Sandbox{}, providers.Errorf(providers.ErrInvalid, "this host cannot enforce disk limits (no loop devices or mkfs)")
			}
		}
		cfg.Lower, cfg.Binds = l.view.dir, l.view.binds
		st.View = l.view.dir
		if img.Dir != "" {
			cfg.Lower, cfg.Binds, cfg.Image = img.Dir, nil, true
			st.View = ""
		}
		st.DiskBytes, st.DiskFS = cfg.DiskBytes, cfg.DiskFS
		cfg.Layers, st.Layers, st.Snapshot = snap.Layers, snap.Layers, spec.Snapshot
		if cfg.Volumes, err = l.volumeBinds(spec.Volumes); err != nil {
			return providers.Sandbox{}, err
		}
	} else if len(spec.Volumes) > 0 {
		return providers.Sandbox{}, providers.Errorf(providers.ErrUnsupported, "volumes need isolation namespaces")
	}
	cfg.Env = st.Env
	var disk *os.File
	if cfg.DiskBytes > 0 {
		if disk = l.disks.take(cfg.DiskBytes, dir+"/"+jail.DiskImage); disk != nil {
			defer disk.Close() // setup holds its own
			cfg.DiskFD = true
		}
	}
	var pids *os.File // the forker joins its pids cgroup itself (jail.Config.PidsFD)
	if d := st.Cgroups["pids"]; d != "" {
		if pids, err = os.OpenFile(d+"/tasks", os.O_WRONLY, 0); err == nil {
			defer pids.Close()
			cfg.PidsFD = true
		}
	}
	pid, err := l.startInit(readyCtx, dir, cfg, &st, disk, pids)
	if err != nil {
		return providers.Sandbox{}, err
	}
	ps, err := procfs.ReadStat("/proc", pid)
	if err != nil {
		return providers.Sandbox{}, providers.Wrap(providers.ErrUnavailable, err, "sandbox init exited during start")
	}
	st.StartTime = ps.StartTime
	if err := limitWithoutCgroup(pid, st.Cgroups, res); err != nil {
		return providers.Sandbox{}, providers.Wrap(providers.ErrUnavailable, err, "cannot apply resource limits")
	}
	if err := writeState(dir, st); err != nil {
		return providers.Sandbox{}, providers.Wrap(providers.ErrUnavailable, err, "cannot record sandbox state")
	}
	sb := &sandbox{id: spec.ID, dir: dir, st: st}
	sb.watch()
	defer func() {
		if !ok {
			sb.unwatch()
		}
	}()
	// A group's link (a veth, addresses, the router's pairs: 1.2-1.6 ms
	// here) is made while init starts its agent, instead of after: the
	// service's JoinGroup then finds it made. BenchmarkCreateGroupVolume,
	// alternated three times: 1.13-1.24x a plain create -> 1.09-1.16x.
	joined := l.joinEarly(spec.ID, spec.Group, pid)
	defer func() {
		if err := <-joined; err != nil || !ok {
			l.detachEgress(spec.ID)
		}
	}()
	c, err := sb.agent(readyCtx)
	if err != nil {
		return providers.Sandbox{}, providers.Wrap(providers.ErrUnavailable, err, "sandbox agent does not answer")
	}
	defer func() {
		if !ok {
			sb.dropHost()
		}
	}()
	if c.Forker() <= 0 {
		return providers.Sandbox{}, providers.Errorf(providers.ErrUnavailable, "sandbox agent did not name its forker thread")
	}
	if !cfg.PidsFD { // else init's forker joined before it answered
		if err := joinPids(st.Cgroups["pids"], pid, c.Forker()); err != nil {
			return providers.Sandbox{}, providers.Wrap(providers.ErrUnavailable, err, "cannot apply the process limit")
		}
	}
	if spec.Entrypoint != nil {
		if err := c.Spawn(readyCtx, spec.Entrypoint); err != nil {
			if k := providers.Kind(err); k != nil {
				return providers.Sandbox{}, providers.Errorf(k, "entrypoint: %s", sb.clientMsg(providers.Message(err)))
			}
			return providers.Sandbox{}, providers.Wrap(providers.ErrUnavailable, err, "sandbox agent does not answer")
		}
	}
	l.mu.Lock()
	l.boxes[spec.ID] = sb
	l.mu.Unlock()
	ok = true
	return providers.Sandbox{ID: spec.ID, Workdir: spec.Workdir, Extra: extra}, nil
}

// image resolves a create's image name to a root filesystem in the image
// directory, else (with Options.DockerImages) the docker daemon's image of
// that name: an entry's name there (a root filesystem directory, or a
// tarball with an optional selector, "all.tar:repo:tag") or an absolute
// path under it. Every other name is ErrInvalid, naming the images there
// and how to add one: a registry reference such as "python:3.13-slim"
// included, since the local provider never pulls and running the host's
// view instead would leave the caller believing they run that image. So is
// any image with isolation "none" or without an image directory. A
// tarball that cannot be unpacked is ErrUnavailable.
func (l *Local) image(ctx context.Context, name string) (rootfs.Image, error) {
	if l.isolation == IsolationNone {
		return rootfs.Image{}, providers.Errorf(providers.ErrInvalid,
			"image %q: with isolation %q the local provider runs commands on the host and cannot run an image; leave image unset", name, IsolationNone)
	}
	if l.store == nil {
		return rootfs.Image{}, providers.Errorf(providers.ErrInvalid,
			"image %q: this gateway has no local image directory (--local-images) nor the docker daemon's images (--local-docker-images) and runs no images; leave image unset for the host's view", name)
	}
	// The image directory first (the operator's choice), then the docker
	// daemon's store.
	notHere := func() (rootfs.Image, error) {
		img, found, err := l.dockerImage(ctx, name)
		if err != nil {
			return img, providers.Wrap(providers.ErrUnavailable, err, fmt.Sprintf("cannot export or unpack image %q from the docker daemon", name))
		}
		if found {
			return img, nil
		}
		return img, l.unknownImage(name)
	}
	if l.images == "" {
		return notHere()
	}
	p := name
	if !filepath.IsAbs(p) {
		p = filepath.Join(l.images, p)
	}
	p = filepath.Clean(p)
	if !strings.HasPrefix(p, l.images+"/") {
		if filepath.IsAbs(name) {
			return rootfs.Image{}, providers.Errorf(providers.ErrInvalid, "image %q: the local provider runs images from its image directory only", name)
		}
		return notHere()
	}
	img, err := l.store.Resolve(ctx, p)
	switch {
	case err == nil:
		return img, nil
	case errors.Is(err, rootfs.ErrNotFound), errors.Is(err, rootfs.ErrNotLocal):
		return notHere()
	case errors.Is(err, rootfs.ErrInvalid):
		return img, providers.Errorf(providers.ErrInvalid, "%s", strings.ReplaceAll(err.Error(), l.images+"/", ""))
	}
	return img, providers.Wrap(providers.ErrUnavailable, err, "cannot unpack the image")
}

// maxImageNames bounds the image names an unknown-image error lists.
const maxImageNames = 20

// unknownImage is the ErrInvalid for an image name that is not in the image
// directory: what the directory holds and how to add an image. It names
// the directory by its flag, not its path (a host path is not the
// caller's business).
func (l *Local) unknownImage(name string) error {
	names := l.imageNames()
	have := "it holds no image"
	if len(names) > 0 {
		quoted := make([]string, 0, maxImageNames+1)
		for _, n := range names[:min(len(names), maxImageNames)] {
			quoted = append(quoted, strconv.Quote(n))
		}
		if len(names) > maxImageNames {
			quoted = append(quoted, fmt.Sprintf("and %d more", len(names)-maxImageNames))
		}
		have = "it has " + strings.Join(quoted, ", ")
	}
	file := strings.NewReplacer("/", "-", ":", "-", "@", "-").Replace(strings.Trim(name, "/"))
	if file == "" || file == "." || file == ".." {
		file = "image"
	}
	if !strings.HasSuffix(file, ".tar") {
		file += ".tar"
	}
	daemon := ""
	if l.dockerImages != nil {
		daemon = ", nor has the local docker daemon an image of that name (`docker load` or `docker build` one there)"
	}
	return providers.Errorf(providers.ErrInvalid,
		"image %q is not in the local provider's image directory (%s)%s. The local provider never pulls an image: "+
			"to add one, put a root filesystem directory, a docker save or an OCI layout tarball in the directory "+
			"given by --local-images (default <state-dir>/images), e.g. `docker save %s > <images dir>/%s`, "+
			"and create with {\"image\": %q}; leave image unset for the host's view",
		name, have, daemon, name, file, file)
}

// imageNames lists the image directory's entries that may be images
// (directories and regular files, symlinks to them included; no hidden
// names), sorted.
func (l *Local) imageNames() []string {
	if l.images == "" {
		return nil
	}
	entries, err := os.ReadDir(l.images)
	if err != nil {
		l.log.Warn("local: reading the image directory", "err", err)
		return nil
	}
	var names []string
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), ".") {
			continue
		}
		fi, err := os.Stat(filepath.Join(l.images, e.Name()))
		if err == nil && (fi.IsDir() || fi.Mode().IsRegular()) {
			names = append(names, e.Name())
		}
	}
	return names // os.ReadDir sorts by name
}

// CheckImage reports whether a create naming image would find it (see
// image), unpacking a tarball into the cache if it is not there yet: the
// service checks its warm pools' images at start-up with it. "" (the
// host's view) is always fine.
func (l *Local) CheckImage(ctx context.Context, image string) error {
	if image == "" {
		return nil
	}
	_, err := l.image(ctx, image)
	return err
}

// withDefaults is r with the provider's default limits where r sets none.
func (l *Local) withDefaults(r providers.Resources) providers.Resources {
	if r.MemoryMiB == nil {
		r.MemoryMiB = l.limits.MemoryMiB
	}
	if r.CPU == nil {
		r.CPU = l.limits.CPU
	}
	if r.DiskGiB == nil || *r.DiskGiB == 0 {
		r.DiskGiB = l.limits.DiskGiB
	}
	return r
}

// startInit starts the sandbox's init through the setup process and waits
// until init reports ready. It records init's pid in st as soon as it is
// known, so a failed start can be cleaned up. disk, if not nil, is the
// sandbox's disk made ahead (cfg.DiskFD), and pids its pids cgroup's
// tasks file (cfg.PidsFD), handed to setup.
func (l *Local) startInit(ctx context.Context, dir string, cfg jail.Config, st *persisted, disk, pids *os.File) (int, error) {
	subdirs := []string{"lower", "root", "rw"}
	if cfg.Isolation == IsolationNone {
		subdirs = []string{"fs", "fs" + cfg.Workdir}
	}
	for _, d := range subdirs {
		if err := os.MkdirAll(dir+"/"+d, 0o755); err != nil {
			return 0, providers.Wrap(providers.ErrUnavailable, err, "cannot create sandbox directory")
		}
	}
	lf, err := listenAgent(dir)
	if err != nil {
		return 0, providers.Wrap(providers.ErrUnavailable, err, "cannot create agent socket")
	}
	defer lf.Close()
	logf, err := os.OpenFile(dir+"/"+logName, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return 0, providers.Wrap(providers.ErrUnavailable, err, "cannot create init log")
	}
	defer logf.Close()
	rr, rw, err := os.Pipe()
	if err != nil {
		return 0, providers.Wrap(providers.ErrUnavailable, err, "cannot create readiness pipe")
	}
	defer rr.Close()
	arg, _ := json.Marshal(cfg)

	cfgR, err := configPipe(arg)
	if err != nil {
		return 0, providers.Wrap(providers.ErrUnavailable, err, "cannot create config pipe")
	}
	defer cfgR.Close()

	cmd := exec.Command(l.initBin, jail.SetupArg)
	cmd.Env = []string{}
	cmd.Dir = "/"
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.ExtraFiles = []*os.File{lf, rw, cfgR}
	// jail.FDDisk and jail.FDPids; nil: closed in setup.
	cmd.ExtraFiles = append(cmd.ExtraFiles, disk, pids)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if cfg.Isolation == IsolationNamespaces {
		cmd.SysProcAttr.Cloneflags = syscall.CLONE_NEWNS
	}
	err = cmd.Start()
	rw.Close()
	if err != nil {
		return 0, providers.Wrap(providers.ErrUnavailable, err, "cannot start sandbox setup")
	}
	// The deadline follows ctx until the final drain below takes over.
	var mu sync.Mutex
	draining := false
	stop := context.AfterFunc(ctx, func() {
		mu.Lock()
		defer mu.Unlock()
		if !draining {
			rr.SetReadDeadline(time.Now())
		}
	})
	defer stop()

	br := bufio.NewReader(rr)
	pid, err := readReady(br, st)
	if err == nil {
		// Setup exits right after starting init.
		cmd.Wait()
		return pid, nil
	}
	// Init may be running although readiness failed (a deadline, say):
	// setup reports its pid before exiting, so once setup is gone the pid
	// is in the pipe if it will ever be. destroy then kills init.
	if st.Pid == 0 {
		waitSetup(cmd)
		mu.Lock()
		draining = true
		rr.SetReadDeadline(time.Now().Add(100 * time.Millisecond))
		mu.Unlock()
		readReady(br, st)
	} else {
		waitSetup(cmd)
	}
	if ctx.Err() != nil {
		return 0, providers.Wrap(providers.ErrUnavailable, ctx.Err(), "sandbox did not become ready in time")
	}
	if tl := tail(dir + "/" + logName); tl != "" {
		err = fmt.Errorf("%w; init log: %s", err, tl)
	}
	return 0, providers.Wrap(providers.ErrUnavailable, err, "sandbox init failed")
}

// waitSetup waits for the setup process, which exits at once unless it
// is stuck in the kernel; then it is killed.
func waitSetup(cmd *exec.Cmd) {
	t := time.AfterFunc(5*time.Second, func() { cmd.Process.Kill() })
	cmd.Wait()
	t.Stop()
}

// readReady reads the readiness pipe until it has both init's ready and
// setup's report of init's pid (they race: setup writes after init has
// started), or an error. It records the pid in st as soon as it arrives.
func readReady(br *bufio.Reader, st *persisted) (int, error) {
	ready := false
	for !ready || st.Pid == 0 {
		line, err := br.ReadBytes('\n')
		if err != nil {
			return 0, fmt.Errorf("init exited before ready: %w", err)
		}
		var m jail.ReadyMsg
		if err := json.Unmarshal(line, &m); err != nil {
			return 0, fmt.Errorf("readiness pipe: %w", err)
		}
		switch {
		case m.Error != "":
			return 0, errors.New(m.Error)
		case m.Pid > 0:
			st.Pid = m.Pid
		case m.Ready:
			ready = true
		}
	}
	return st.Pid, nil
}

// tail returns the end of a log file, for error causes (never shown to
// clients).
func tail(path string) string {
	b, _ := os.ReadFile(path)
	if len(b) > 2048 {
		b = b[len(b)-2048:]
	}
	return strings.TrimSpace(string(b))
}

// configPipe returns the read end of a pipe that holds raw (small enough
// for the pipe buffer) and is closed for writing.
func configPipe(raw []byte) (*os.File, error) {
	r, w, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	defer w.Close()
	if _, err := w.Write(raw); err != nil {
		r.Close()
		return nil, err
	}
	return r, nil
}

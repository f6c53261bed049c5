package sandbox

import (
	"context"
	"fmt"
	"math"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"

	"github.com/sandgate/sandgate/internal/providers"
	"github.com/sandgate/sandgate/internal/store"
)

// Volume is storage of a fixed size owned by one API key, mounted by
// any number of its sandboxes (see store.Volume).
type Volume = store.Volume

// VolumeInfo is a volume with the sandboxes that mount it now.
type VolumeInfo struct {
	Volume
	MountedBy []string
}

// VolumeRequest is one mount asked for at create: a volume of the
// caller's key (by name or id) or a host directory under one of the
// operator's roots (Options.VolumeRoots), at MountPath, read-only or not,
// optionally only the directory SubPath inside it.
type VolumeRequest struct {
	Volume    string
	HostPath  string
	MountPath string
	ReadOnly  bool
	SubPath   string
}

// MaxVolumesPerSandbox bounds a create's volume mounts.
const MaxVolumesPerSandbox = 16

// volumeNamePattern: a DNS label, so that it reads the same in a PVC's
// labels and a docker volume's name.
var volumeNamePattern = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$`)

func newVolumeID() string { return "vol-" + randomID(20) }

// volumes is the volume half of the service. Its maps are guarded by
// Service.mu.
type volumes struct {
	byID    map[string]Volume
	pending map[string]int  // creates in flight that mount the volume
	busy    map[string]bool // being made or deleted: not listed, not mountable
}

// volumer returns the provider's Volumer and the store's VolumeStore,
// or ErrUnsupported.
func (s *Service) volumer() (providers.Volumer, store.VolumeStore, error) {
	p, ok := s.p.(providers.Volumer)
	if !ok {
		return nil, nil, providers.Errorf(providers.ErrUnsupported, "provider %s has no volumes", s.p.Name())
	}
	st, ok := s.st.(store.VolumeStore)
	if !ok {
		return nil, nil, providers.Errorf(providers.ErrUnsupported, "volumes are not kept by this gateway's state store")
	}
	return p, st, nil
}

// loadVolumes reads the volumes at start-up.
func (s *Service) loadVolumes(ctx context.Context) error {
	var vs []Volume
	if st, ok := s.st.(store.VolumeStore); ok {
		var err error
		if vs, err = st.LoadVolumes(ctx); err != nil {
			return err
		}
	}
	s.loadVolumesFrom(vs)
	for _, v := range vs {
		s.slots.addVolume(v.Creator, v.SizeBytes>>20, false)
	}
	return nil
}

// loadVolumesFrom sets the known volumes to vs.
func (s *Service) loadVolumesFrom(vs []Volume) {
	s.vols = volumes{byID: map[string]Volume{}, pending: map[string]int{}, busy: map[string]bool{}}
	for _, v := range vs {
		s.vols.byID[v.ID] = v
	}
}

// CreateVolume makes a volume of sizeGiB (fractions allowed, at least
// 64 MiB) named name for the caller's key: a name the key already uses is
// ErrConflict; the key's disk quota counts its volumes with its
// sandboxes' disks.
func (s *Service) CreateVolume(ctx context.Context, c Caller, name string, sizeGiB float64) (Volume, error) {
	creator, err := s.authorizeKey(c)
	if err != nil {
		return Volume{}, err
	}
	var bad providers.InvalidFields
	if !volumeNamePattern.MatchString(name) {
		bad.Add("name", "must be 1-63 lowercase letters, digits or dashes, starting and ending with a letter or digit")
	}
	size := int64(math.Ceil(sizeGiB*1024)) << 20
	if !(sizeGiB > 0) || size < 64<<20 || sizeGiB > 1<<20 {
		bad.Add("size_gib", "must be at least 0.0625 (64 MiB) and at most 1048576")
	}
	if err := bad.Err(); err != nil {
		return Volume{}, err
	}
	p, st, err := s.volumer()
	if err != nil {
		return Volume{}, err
	}
	v := Volume{ID: newVolumeID(), Name: name, SizeBytes: size, Creator: creator, Provider: s.p.Name(), CreatedAt: s.opts.Clock.Now()}
	s.mu.Lock()
	for _, o := range s.vols.byID {
		if o.Creator == creator && o.Name == name {
			s.mu.Unlock()
			return Volume{}, providers.Errorf(providers.ErrConflict, "this key has a volume named %q (%s)", name, o.ID)
		}
	}
	// Reserved now, so that two creates of one name cannot both pass.
	s.vols.byID[v.ID] = v
	s.vols.busy[v.ID] = true // not mountable until made
	s.mu.Unlock()
	made := false
	defer func() {
		s.mu.Lock()
		delete(s.vols.busy, v.ID)
		if !made {
			delete(s.vols.byID, v.ID)
		}
		s.mu.Unlock()
	}()
	if err := s.slots.addVolume(creator, size>>20, true); err != nil {
		return Volume{}, err
	}
	defer func() {
		if !made {
			s.slots.addVolume(creator, -size>>20, false)
		}
	}()
	if err := p.CreateVolume(ctx, v.ID, size); err != nil {
		return Volume{}, fmt.Errorf("create volume: %w", err)
	}
	if err := st.PutVolume(ctx, v); err != nil {
		if derr := p.DeleteVolume(context.WithoutCancel(ctx), v.ID); derr != nil {
			s.log.Error("delete an unrecorded volume", "volume", v.ID, "err", derr)
		}
		return Volume{}, err
	}
	made = true
	s.log.Info("volume created", "volume", v.ID, "size", size)
	return v, nil
}

// Volumes lists the caller's key's volumes, oldest first.
func (s *Service) Volumes(ctx context.Context, c Caller) ([]VolumeInfo, error) {
	creator, err := s.authorizeKey(c)
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	out := []VolumeInfo{}
	for _, v := range s.vols.byID {
		if v.Creator == creator && !s.vols.busy[v.ID] {
			out = append(out, s.volumeInfo(v))
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].CreatedAt.Before(out[j].CreatedAt) })
	return out, nil
}

// GetVolume describes the caller's volume named ref (a name or an id);
// another key's is not found.
func (s *Service) GetVolume(ctx context.Context, c Caller, ref string) (VolumeInfo, error) {
	creator, err := s.authorizeKey(c)
	if err != nil {
		return VolumeInfo{}, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	v, err := s.ownVolume(creator, ref)
	if err != nil {
		return VolumeInfo{}, err
	}
	return s.volumeInfo(v), nil
}

// ownVolume finds creator's volume by name or id. s.mu is held.
func (s *Service) ownVolume(creator, ref string) (Volume, error) {
	for _, v := range s.vols.byID {
		if v.Creator == creator && (v.ID == ref || v.Name == ref) && !s.vols.busy[v.ID] {
			return v, nil
		}
	}
	return Volume{}, providers.Errorf(providers.ErrNotFound, "volume %s not found", ref)
}

// mountedBy returns the sandboxes that mount volume id. s.mu is held.
func (s *Service) mountedBy(id string) []string {
	var ids []string
	for _, b := range s.boxes {
		if slices.Contains(b.rec.Volumes, id) {
			ids = append(ids, b.rec.ID)
		}
	}
	sort.Strings(ids)
	return ids
}

func (s *Service) volumeInfo(v Volume) VolumeInfo {
	return VolumeInfo{Volume: v, MountedBy: s.mountedBy(v.ID)}
}

// DeleteVolume deletes the caller's volume ref (a name or an id) and its
// storage: ErrConflict while a sandbox mounts it (delete those first).
func (s *Service) DeleteVolume(ctx context.Context, c Caller, ref string) error {
	creator, err := s.authorizeKey(c)
	if err != nil {
		return err
	}
	p, st, err := s.volumer()
	if err != nil {
		return err
	}
	s.mu.Lock()
	v, err := s.ownVolume(creator, ref)
	if err != nil {
		s.mu.Unlock()
		return err
	}
	users := s.mountedBy(v.ID)
	if n := s.vols.pending[v.ID]; n > 0 {
		users = append(users, fmt.Sprintf("%d being created", n))
	}
	if len(users) > 0 {
		s.mu.Unlock()
		return providers.Errorf(providers.ErrConflict, "volume %s is mounted by %s: delete those sandboxes first", v.Name, strings.Join(users, ", "))
	}
	s.vols.busy[v.ID] = true
	s.mu.Unlock()
	err = p.DeleteVolume(ctx, v.ID)
	if err == nil || providers.Kind(err) == providers.ErrNotFound {
		err = st.DeleteVolume(context.WithoutCancel(ctx), v.ID)
	}
	s.mu.Lock()
	delete(s.vols.busy, v.ID)
	if err == nil {
		delete(s.vols.byID, v.ID)
	}
	s.mu.Unlock()
	if err != nil {
		return fmt.Errorf("delete volume %s: %w", v.ID, err)
	}
	s.slots.addVolume(creator, -v.SizeBytes>>20, false)
	s.log.Info("volume deleted", "volume", v.ID)
	return nil
}

// gymVolumes turns NeMo Gym's provider_options.volumes (OpenSandbox's
// shape: name, one source of host {path} or pvc {claimName}, mountPath,
// readOnly or accessMode RO/RW, subPath) into volume requests; a pvc's
// claimName names one of the caller's volumes.
func gymVolumes(v any, bad *providers.InvalidFields) []VolumeRequest {
	list, ok := v.([]any)
	if !ok {
		bad.Add("provider_options.volumes", "must be a list")
		return nil
	}
	var out []VolumeRequest
	for i, e := range list {
		field := fmt.Sprintf("provider_options.volumes[%d]", i)
		m, ok := e.(map[string]any)
		if !ok {
			bad.Add(field, "must be an object")
			continue
		}
		str := func(m map[string]any, k string) string {
			s, ok := m[k].(string)
			if _, present := m[k]; present && !ok {
				bad.Add(field+"."+k, "must be a string")
			}
			return s
		}
		var r VolumeRequest
		for k := range m {
			switch k {
			case "name", "host", "pvc", "mountPath", "readOnly", "accessMode", "subPath":
			default:
				bad.Add(field+"."+k, "unknown key (want name, host, pvc, mountPath, readOnly, accessMode, subPath)")
			}
		}
		host, isHost := m["host"].(map[string]any)
		pvc, isPVC := m["pvc"].(map[string]any)
		switch {
		case isHost == isPVC:
			bad.Add(field, "needs exactly one source: host {path} or pvc {claimName}")
		case isHost:
			r.HostPath = str(host, "path")
		default:
			r.Volume = str(pvc, "claimName")
		}
		r.MountPath, r.SubPath = str(m, "mountPath"), str(m, "subPath")
		if ro, present := m["readOnly"]; present {
			b, ok := ro.(bool)
			if !ok {
				bad.Add(field+".readOnly", "must be a boolean")
			}
			r.ReadOnly = b
		}
		switch str(m, "accessMode") {
		case "":
		case "RO":
			r.ReadOnly = true
		case "RW":
			if r.ReadOnly {
				bad.Add(field+".accessMode", "RW contradicts readOnly")
			}
		default:
			bad.Add(field+".accessMode", "must be RO or RW")
		}
		out = append(out, r)
	}
	return out
}

// resolveVolumes checks creator's volume requests and turns them into the
// provider's mounts and the ids of the volumes they use. Every problem is
// reported (added to bad).
func (s *Service) resolveVolumes(creator string, reqs []VolumeRequest, bad *providers.InvalidFields) ([]providers.VolumeMount, []string) {
	if len(reqs) == 0 {
		return nil, nil
	}
	if len(reqs) > MaxVolumesPerSandbox {
		bad.Add("volumes", "at most %d mounts", MaxVolumesPerSandbox)
		return nil, nil
	}
	var out []providers.VolumeMount
	var ids []string
	targets := map[string]bool{}
	for i, r := range reqs {
		field := fmt.Sprintf("volumes[%d]", i)
		m := providers.VolumeMount{ReadOnly: r.ReadOnly}
		switch mp := r.MountPath; {
		case !path.IsAbs(mp):
			bad.Add(field+".mount_path", "must be an absolute path")
		case path.Clean(mp) == "/":
			bad.Add(field+".mount_path", "must not be /")
		case underAny(path.Clean(mp), "/proc", "/dev", "/sys"):
			bad.Add(field+".mount_path", "must not be in /proc, /dev or /sys")
		case checkPath(mp) != nil:
			bad.Add(field+".mount_path", "%s", checkPath(mp))
		case targets[path.Clean(mp)]:
			bad.Add(field+".mount_path", "%s is mounted twice", path.Clean(mp))
		default:
			m.MountPath = path.Clean(mp)
			targets[m.MountPath] = true
		}
		if sp := r.SubPath; sp != "" {
			clean := path.Clean(sp)
			switch {
			case path.IsAbs(sp):
				bad.Add(field+".sub_path", "must be relative to the volume")
			case clean == ".." || strings.HasPrefix(clean, "../") || slices.Contains(strings.Split(sp, "/"), ".."):
				bad.Add(field+".sub_path", "must not contain ..")
			case strings.ContainsRune(sp, 0):
				bad.Add(field+".sub_path", "must not contain NUL")
			default:
				m.SubPath = clean
			}
		}
		switch {
		case (r.Volume == "") == (r.HostPath == ""):
			bad.Add(field, "needs exactly one of volume and host_path")
		case r.Volume != "":
			s.mu.Lock()
			v, err := s.ownVolume(creator, r.Volume)
			s.mu.Unlock()
			if err != nil {
				bad.Add(field+".volume", "%s", providers.Message(err))
				break
			}
			m.Volume = v.ID
			if !slices.Contains(ids, v.ID) {
				ids = append(ids, v.ID)
			}
		default:
			hp, err := s.allowedHostPath(r.HostPath)
			if err != nil {
				bad.Add(field+".host_path", "%s", err)
				break
			}
			m.HostPath = hp
		}
		out = append(out, m)
	}
	return out, ids
}

// allowedHostPath resolves p (symlinks and ".." included) and accepts it
// only inside one of the operator's volume roots, as a directory.
func (s *Service) allowedHostPath(p string) (string, error) {
	if len(s.opts.VolumeRoots) == 0 {
		return "", fmt.Errorf("host paths are not allowed on this gateway (it has no --volume-root)")
	}
	if !filepath.IsAbs(p) {
		return "", fmt.Errorf("must be an absolute path")
	}
	real, err := filepath.EvalSymlinks(p)
	if err == nil {
		for _, root := range s.opts.VolumeRoots {
			if r, rerr := filepath.EvalSymlinks(root); rerr == nil && (real == r || strings.HasPrefix(real, r+"/")) {
				fi, err := os.Stat(real)
				if err != nil || !fi.IsDir() {
					return "", fmt.Errorf("%s is not a directory", p)
				}
				return real, nil
			}
		}
	}
	return "", fmt.Errorf("%s is not under an allowed volume root", p)
}

// underAny reports whether p is one of dirs or inside one.
func underAny(p string, dirs ...string) bool {
	for _, d := range dirs {
		if p == d || strings.HasPrefix(p, d+"/") {
			return true
		}
	}
	return false
}

// holdVolumes marks ids as mounted by a create in flight, unless one is
// gone or being deleted; the returned func undoes it.
func (s *Service) holdVolumes(ids []string) (func(), error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, id := range ids {
		if _, ok := s.vols.byID[id]; !ok || s.vols.busy[id] {
			return nil, providers.Errorf(providers.ErrNotFound, "volume %s not found (deleted meanwhile)", id)
		}
	}
	for _, id := range ids {
		s.vols.pending[id]++
	}
	return func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		for _, id := range ids {
			if s.vols.pending[id]--; s.vols.pending[id] <= 0 {
				delete(s.vols.pending, id)
			}
		}
	}, nil
}

// volumeUsage is what key's volumes hold: how many and their bytes.
func (s *Service) volumeUsage(key string) (n int, bytes int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, v := range s.vols.byID {
		if v.Creator == key && !s.vols.busy[v.ID] {
			n++
			bytes += v.SizeBytes
		}
	}
	return n, bytes
}

// prepareVolumes moves NeMo Gym's provider_options.volumes into
// req.Volumes and resolves them (req.mounts, req.volumeIDs). A bad mount
// is reported together with every other problem of the request.
func (s *Service) prepareVolumes(creator string, req *CreateRequest) error {
	var bad providers.InvalidFields
	if v, ok := req.ProviderOptions["volumes"]; ok {
		req.Volumes = append(slices.Clip(req.Volumes), gymVolumes(v, &bad)...)
		req.ProviderOptions = without(req.ProviderOptions, "volumes")
	}
	req.mounts, req.volumeIDs = s.resolveVolumes(creator, req.Volumes, &bad)
	if len(bad) == 0 {
		return nil
	}
	// The rest of the request's problems too, in one answer.
	check := *req
	if err := check.validate(s.opts.Ceilings, s.opts.CapAddAllow); err != nil {
		if more, ok := err.(providers.InvalidFields); ok {
			bad = append(bad, more...)
		}
	}
	return bad
}

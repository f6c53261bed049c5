package sandbox

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/sandgate/sandgate/internal/providers"
)

// Warm pools keep ready sandboxes per create spec (image, workdir,
// resources). A create whose spec matches a pool, asking for nothing only
// a fresh sandbox can have (an entrypoint, ports, provider options, a
// snapshot), claims one: it gets its files, env, metadata and TTL then
// (the env is applied to every command and session of the sandbox, not
// to the sandbox's own start), and the pool refills in the background. An
// empty pool, or no matching one, is a normal create. Pool sandboxes have
// no record: they are never listed, are deleted when the service closes,
// and a restarted gateway deletes any left (orphans) and makes new ones.

// PoolSpec is one warm pool: Count ready sandboxes of this spec.
type PoolSpec struct {
	Image     string              `json:"image,omitempty"`
	Workdir   string              `json:"workdir,omitempty"` // "" = the default workdir
	Resources providers.Resources `json:"resources"`
	Count     int                 `json:"count"`
}

// MaxPoolSize is the most sandboxes one pool keeps.
const MaxPoolSize = 1000

// Key names the spec: what a matching create has, canonically.
func (p PoolSpec) Key() string {
	w := p.Workdir
	if w == "" {
		w = defaultWorkdir
	}
	f := func(v *float64) string {
		if v == nil {
			return ""
		}
		return strconv.FormatFloat(*v, 'g', -1, 64)
	}
	i := func(v *int64) string {
		if v == nil {
			return ""
		}
		return strconv.FormatInt(*v, 10)
	}
	k := "image=" + p.Image + ",workdir=" + w
	if p.Resources.CPU != nil {
		k += ",cpu=" + f(p.Resources.CPU)
	}
	if p.Resources.MemoryMiB != nil {
		k += ",memory_mib=" + i(p.Resources.MemoryMiB)
	}
	if p.Resources.DiskGiB != nil {
		k += ",disk_gib=" + f(p.Resources.DiskGiB)
	}
	return k
}

// ParsePool parses SPEC=N, SPEC being comma-separated key=value pairs of
// image, workdir, cpu, memory_mib and disk_gib (any may be left out:
// "workdir=/workspace=4" is 4 sandboxes of the provider's default image).
func ParsePool(s string) (PoolSpec, error) {
	i := strings.LastIndexByte(s, '=')
	if i < 0 {
		return PoolSpec{}, fmt.Errorf("pool %q: want SPEC=N", s)
	}
	n, err := strconv.Atoi(s[i+1:])
	if err != nil || n < 1 || n > MaxPoolSize {
		return PoolSpec{}, fmt.Errorf("pool %q: N must be 1 to %d", s, MaxPoolSize)
	}
	p := PoolSpec{Count: n}
	if spec := s[:i]; spec != "" {
		for _, kv := range strings.Split(spec, ",") {
			k, v, ok := strings.Cut(kv, "=")
			if !ok {
				return PoolSpec{}, fmt.Errorf("pool %q: %q is not key=value", s, kv)
			}
			switch k {
			case "image":
				p.Image = v
			case "workdir":
				p.Workdir = v
			case "cpu", "disk_gib":
				x, err := strconv.ParseFloat(v, 64)
				if err != nil || !(x > 0) || math.IsInf(x, 1) {
					return PoolSpec{}, fmt.Errorf("pool %q: %s must be a positive number", s, k)
				}
				if k == "cpu" {
					p.Resources.CPU = &x
				} else {
					p.Resources.DiskGiB = &x
				}
			case "memory_mib":
				x, err := strconv.ParseInt(v, 10, 64)
				if err != nil || x <= 0 {
					return PoolSpec{}, fmt.Errorf("pool %q: memory_mib must be a positive integer", s)
				}
				p.Resources.MemoryMiB = &x
			default:
				return PoolSpec{}, fmt.Errorf("pool %q: unknown key %q (have image, workdir, cpu, memory_mib, disk_gib)", s, k)
			}
		}
	}
	if err := checkPoolWorkdir(p.Workdir); err != nil {
		return PoolSpec{}, fmt.Errorf("pool %q: %w", s, err)
	}
	return p, nil
}

func checkPoolWorkdir(w string) error {
	if w == "" {
		return nil
	}
	if !strings.HasPrefix(w, "/") {
		return errors.New("workdir must be absolute")
	}
	return checkPath(w)
}

// pool is one warm pool's state, guarded by Service.mu.
type pool struct {
	spec   PoolSpec
	key    string
	ready  []providers.Sandbox // made, not claimed
	making int
	wake   chan struct{} // a claim: refill
}

// imageChecker is implemented by providers that can tell at start-up
// whether a create naming an image would find it (local: its image
// directory). A warm pool of an image the provider does not have fails
// the start instead of retrying its creates forever.
type imageChecker interface {
	CheckImage(ctx context.Context, image string) error
}

// startPools checks the pools (and their images, where the provider can)
// and starts one filler per pool.
func (s *Service) startPools(ctx context.Context, specs []PoolSpec) error {
	if len(specs) == 0 {
		return nil
	}
	if s.shared != nil {
		return errors.New("warm pools are not supported with a shared state store (several replicas) yet")
	}
	s.pools = map[string]*pool{}
	for _, sp := range specs {
		if sp.Count < 1 || sp.Count > MaxPoolSize {
			return fmt.Errorf("pool %s: count must be 1 to %d", sp.Key(), MaxPoolSize)
		}
		if err := checkPoolWorkdir(sp.Workdir); err != nil {
			return fmt.Errorf("pool %s: %w", sp.Key(), err)
		}
		if ic, ok := s.p.(imageChecker); ok {
			if err := ic.CheckImage(ctx, sp.Image); err != nil {
				return fmt.Errorf("pool %s: %w", sp.Key(), err)
			}
		}
		var over providers.InvalidFields
		s.opts.Ceilings.checkResources(sp.Resources, &over)
		if len(over) > 0 {
			return fmt.Errorf("pool %s is over the gateway's ceilings: %w", sp.Key(), over)
		}
		if sp.Workdir == "" {
			sp.Workdir = defaultWorkdir
		}
		k := sp.Key()
		if s.pools[k] != nil {
			return fmt.Errorf("pool %s is given twice", k)
		}
		s.pools[k] = &pool{spec: sp, key: k, wake: make(chan struct{}, 1)}
	}
	fillCtx, cancel := context.WithCancel(context.Background())
	s.poolCancel = cancel
	for _, p := range s.pools {
		s.poolWG.Add(1)
		go s.fill(fillCtx, p)
	}
	return nil
}

// fill keeps p at its count until ctx ends, making one sandbox at a time;
// a failed create is retried after a pause that doubles up to a minute.
func (s *Service) fill(ctx context.Context, p *pool) {
	defer s.poolWG.Done()
	backoff := time.Second
	for {
		s.mu.Lock()
		need := p.spec.Count - len(p.ready) - p.making
		if need > 0 {
			p.making++
		}
		s.mu.Unlock()
		if need <= 0 {
			select {
			case <-ctx.Done():
				return
			case <-p.wake:
			}
			continue
		}
		sb, err := s.p.Create(ctx, providers.CreateSpec{
			ID: newSandboxID(), Image: p.spec.Image, Workdir: p.spec.Workdir,
			Resources: p.spec.Resources, ReadyTimeout: s.opts.DefaultReadyTimeout,
		})
		s.mu.Lock()
		p.making--
		if err == nil {
			p.ready = append(p.ready, sb)
		}
		s.mu.Unlock()
		if err == nil {
			backoff = time.Second
			continue
		}
		if ctx.Err() != nil {
			return
		}
		s.log.Warn("warm pool: create failed", "pool", p.key, "err", err, "retry_in", backoff)
		t := time.NewTimer(backoff)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
		backoff = min(2*backoff, time.Minute)
	}
}

// claim takes a ready sandbox from the pool req matches, if any.
func (s *Service) claim(req CreateRequest) (providers.Sandbox, bool) {
	if s.pools == nil || req.SnapshotID != "" || len(req.Entrypoint) > 0 || len(req.Ports) > 0 || len(req.ProviderOptions) > 0 || req.shmBytes != 0 || len(req.mounts) > 0 ||
		req.Group != "" || req.Hostname != "" || len(req.CapAdd) > 0 {
		return providers.Sandbox{}, false
	}
	k := PoolSpec{Image: req.Image, Workdir: req.Workdir, Resources: req.Resources}.Key()
	s.mu.Lock()
	defer s.mu.Unlock()
	p := s.pools[k]
	if p == nil {
		return providers.Sandbox{}, false
	}
	if len(p.ready) == 0 {
		s.m.PoolMisses.WithLabelValues(k).Inc()
		return providers.Sandbox{}, false
	}
	sb := p.ready[0]
	p.ready = p.ready[1:]
	s.m.PoolClaims.WithLabelValues(k).Inc()
	select {
	case p.wake <- struct{}{}:
	default:
	}
	return sb, true
}

// PoolReady counts the ready sandboxes per pool, by PoolSpec.Key (the
// sandgate_pool_ready metric).
func (s *Service) PoolReady() map[string]int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := make(map[string]int, len(s.pools))
	for k, p := range s.pools {
		n[k] = len(p.ready)
	}
	return n
}

// stopPools stops the fillers and deletes the ready sandboxes.
func (s *Service) stopPools() {
	if s.pools == nil {
		return
	}
	s.poolCancel()
	s.poolWG.Wait()
	s.mu.Lock()
	var ids []string
	for _, p := range s.pools {
		for _, sb := range p.ready {
			ids = append(ids, sb.ID)
		}
		p.ready = nil
	}
	s.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for _, id := range ids {
		if err := s.p.Delete(ctx, id); err != nil && !errors.Is(err, providers.ErrNotFound) {
			s.log.Warn("warm pool: delete", "sandbox", id, "err", err)
		}
	}
}

// mergeEnv is base with over on top (nil when both are empty).
func mergeEnv(base, over map[string]string) map[string]string {
	if len(base) == 0 {
		return over
	}
	m := make(map[string]string, len(base)+len(over))
	for k, v := range base {
		m[k] = v
	}
	for k, v := range over {
		m[k] = v
	}
	return m
}

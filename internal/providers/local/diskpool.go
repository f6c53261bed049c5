package local

import (
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/sandgate/sandgate/internal/providers/local/jail"
)

// A sandbox's disk (jail/disk.go) is most of a cold create: copying the
// template, binding a loop device and mounting the filesystem take 20-150
// ms on a busy 2-core machine, against ~40 ms for all the rest. The
// provider keeps a few disks of the default size made ahead: fresh from
// the template, never used, each a detached mount (part of no mount
// namespace, so nothing shows on the host) with its image in the pool
// directory. A create of that size takes one, moves its image into the
// sandbox's directory and hands the mount to setup (jail.Config.DiskFD),
// which attaches it as it would its own; the pool makes the next one in
// the background. A create that finds none makes its disk itself, as
// before.

// DefaultDiskPool is how many disks the pool keeps ready.
const DefaultDiskPool = 2

// diskPoolRetry is how long the pool waits after failing to make a disk.
const diskPoolRetry = 10 * time.Second

type diskPool struct {
	dir, fs, mkfs, templates string
	size                     int64
	want                     int
	log                      *slog.Logger

	mu     sync.Mutex
	ready  []pooledDisk
	seq    int
	closed bool
	wake   chan struct{} // a disk was taken
	stop   chan struct{}
	done   chan struct{}
}

type pooledDisk struct {
	img string
	mnt *os.File // the detached mount
}

// newDiskPool starts a pool of want disks of size bytes in dir (emptied
// first: what a previous gateway left is unmounted already, its
// descriptors gone with it).
func newDiskPool(dir, fs, mkfs, templates string, size int64, want int, log *slog.Logger) (*diskPool, error) {
	if err := os.RemoveAll(dir); err != nil {
		return nil, err
	}
	if err := os.Mkdir(dir, 0o700); err != nil {
		return nil, err
	}
	p := &diskPool{dir: dir, fs: fs, mkfs: mkfs, templates: templates, size: size, want: want, log: log,
		wake: make(chan struct{}, 1), stop: make(chan struct{}), done: make(chan struct{})}
	go p.fill()
	return p, nil
}

// take returns a ready disk of size bytes with its image moved to img,
// or nil (none ready, another size, no pool). The caller closes the
// mount once setup holds it.
func (p *diskPool) take(size int64, img string) *os.File {
	if p == nil || size != p.size {
		return nil
	}
	p.mu.Lock()
	if len(p.ready) == 0 {
		p.mu.Unlock()
		return nil
	}
	d := p.ready[0]
	p.ready = p.ready[1:]
	p.mu.Unlock()
	select {
	case p.wake <- struct{}{}:
	default:
	}
	if err := os.Rename(d.img, img); err != nil {
		p.log.Warn("local: disk pool: move a disk's image", "err", err)
		d.mnt.Close()
		os.Remove(d.img)
		return nil
	}
	return d.mnt
}

// fill keeps want disks ready until close.
func (p *diskPool) fill() {
	defer close(p.done)
	for {
		p.mu.Lock()
		n := len(p.ready)
		p.seq++
		img := fmt.Sprintf("%s/%d.img", p.dir, p.seq)
		p.mu.Unlock()
		if n >= p.want {
			select {
			case <-p.wake:
				continue
			case <-p.stop:
				return
			}
		}
		mfd, err := jail.MakeDisk(p.fs, p.mkfs, p.templates, img, p.size)
		if err != nil {
			os.Remove(img)
			p.log.Warn("local: disk pool: make a disk (creates make their own)", "err", err)
			t := time.NewTimer(diskPoolRetry)
			select {
			case <-t.C:
				continue
			case <-p.stop:
				t.Stop()
				return
			}
		}
		d := pooledDisk{img: img, mnt: os.NewFile(uintptr(mfd), filepath.Base(img))}
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			d.release()
			return
		}
		p.ready = append(p.ready, d)
		p.mu.Unlock()
	}
}

// release unmounts a disk nobody took and removes its image (the loop
// device clears itself once the mount is gone).
func (d pooledDisk) release() {
	d.mnt.Close()
	os.Remove(d.img)
}

// close stops the pool and releases the disks it holds; again, nothing.
func (p *diskPool) close() {
	if p == nil {
		return
	}
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return
	}
	p.closed = true
	ready := p.ready
	p.ready = nil
	p.mu.Unlock()
	close(p.stop)
	<-p.done
	for _, d := range ready {
		d.release()
	}
	os.Remove(p.dir)
}

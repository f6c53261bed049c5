package local

import (
	"fmt"

	"github.com/sandgate/sandgate/internal/providers/local/jail"
)

// ID ranges. Each sandbox owns jail.IDMapSize host uids and gids starting at its
// IDBase: sandbox root is host uid IDBase, never host root, so a file or
// kernel object that is not the sandbox's own is as foreign to sandbox
// root as to any unprivileged user. Ranges are numbered from the
// provider's base (Options.IDBase); a sandbox's base is recorded in its
// state.json, so the allocation is rebuilt from disk at start-up and a
// range is free again once the sandbox's directory is gone.

// maxRanges bounds the allocation: base + maxRanges*jail.IDMapSize stays far
// below the 32-bit id space (and its 65534/4294967295 specials).
const maxRanges = 16384

// rangeBase is the first host id of range i.
func rangeBase(base uint32, i int) uint32 { return base + uint32(i)*jail.IDMapSize }

// rangeIndex is the inverse of rangeBase, or -1 if id is not a range start.
func rangeIndex(base, id uint32) int {
	if id < base || (id-base)%jail.IDMapSize != 0 {
		return -1
	}
	return int((id - base) / jail.IDMapSize)
}

// allocRange returns the lowest free range's base and marks it used for
// id. l.mu is held.
func (l *Local) allocRange(id string) (uint32, error) {
	for i := 0; i < maxRanges; i++ {
		if _, used := l.ranges[i]; !used {
			l.ranges[i] = id
			return rangeBase(l.idBase, i), nil
		}
	}
	return 0, fmt.Errorf("all %d id ranges are in use", maxRanges)
}

// freeRange gives a sandbox's range back.
func (l *Local) freeRange(base uint32) {
	if base == 0 {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if i := rangeIndex(l.idBase, base); i >= 0 {
		delete(l.ranges, i)
	}
}

package sandbox

import (
	"errors"
	"fmt"
	"math"
	"regexp"
	"strconv"
	"strings"

	"github.com/sandgate/sandgate/internal/providers"
)

// shmSizePattern is Docker's size string (go-units' RAMInBytes, as
// `--shm-size` and Compose's shm_size take it): a number and an optional
// binary unit, b, k, m, g, t or p, optionally followed by "b" or "ib".
var shmSizePattern = regexp.MustCompile(`^(\d+(?:\.\d+)?)\s*(?:([kmgtp])i?)?b?$`)

// parseShmSize reads a create's shm_size: a JSON number of bytes, or a
// string in Docker's form ("268435456", "64m", "1g", "512MiB"), units
// binary.
func parseShmSize(v any) (int64, error) {
	var f float64
	switch x := v.(type) {
	case float64:
		if x != math.Trunc(x) {
			return 0, errors.New("must be a whole number of bytes")
		}
		f = x
	case int:
		f = float64(x)
	case int64:
		f = float64(x)
	case string:
		m := shmSizePattern.FindStringSubmatch(strings.ToLower(strings.TrimSpace(x)))
		if m == nil {
			return 0, fmt.Errorf("%q is not a size: bytes, or a number with a unit k, m, g or t (e.g. \"64m\", \"1g\")", x)
		}
		n, err := strconv.ParseFloat(m[1], 64)
		if err != nil {
			return 0, fmt.Errorf("%q is not a size", x)
		}
		if m[2] != "" {
			n *= float64(int64(1) << (10 * (strings.Index("kmgtp", m[2]) + 1)))
		}
		f = n
	default:
		return 0, errors.New("must be a number of bytes or a size string")
	}
	if f > float64(providers.MaxShmBytes) {
		return math.MaxInt64, nil // over the bound, which checkShmSize names
	}
	return int64(f), nil
}

// checkShmSize checks a /dev/shm of n bytes: at least 1 MiB (a tmpfs of
// size 0 would be unbounded), at most MaxShmBytes and the sandbox's
// memory when it gives one (the tmpfs's pages are its memory).
func checkShmSize(n int64, memoryMiB *int64) error {
	switch {
	case n < 1<<20:
		return fmt.Errorf("must be at least 1 MiB (1048576 bytes); it is %d", n)
	case n > providers.MaxShmBytes:
		return fmt.Errorf("must be at most %d bytes (64 GiB); it is %d", providers.MaxShmBytes, n)
	case memoryMiB != nil && *memoryMiB > 0 && n > *memoryMiB<<20:
		return fmt.Errorf("must be at most resources.memory_mib (%d MiB): /dev/shm is the sandbox's memory; it is %d bytes", *memoryMiB, n)
	}
	return nil
}

package jail

import (
	"fmt"
	"maps"
	"slices"

	"golang.org/x/sys/unix"
)

// DefaultHostname is a sandbox's host name when its create names none.
const DefaultHostname = "sandbox"

// defaultDropped are the capabilities the forker thread drops from its
// bounding set, so that commands never hold them (in the sandbox's own user
// namespace, where init holds all): mount and unmount (which could uncover
// what a mount hides), ptrace, and network administration. A create's
// cap_add keeps the ones it lists.
var defaultDropped = map[string]uintptr{
	"SYS_ADMIN":  unix.CAP_SYS_ADMIN,
	"SYS_PTRACE": unix.CAP_SYS_PTRACE,
	"NET_ADMIN":  unix.CAP_NET_ADMIN,
}

// droppedCaps are the capabilities to drop for a create that adds add
// (names without CAP_, upper case). A name that commands hold anyway is
// no error (the service checks names against the operator's allow-list).
func droppedCaps(add []string) ([]uintptr, error) {
	var out []uintptr
	for _, name := range slices.Sorted(maps.Keys(defaultDropped)) {
		if !slices.Contains(add, name) {
			out = append(out, defaultDropped[name])
		}
	}
	for _, name := range add {
		if name == "" {
			return nil, fmt.Errorf("cap_add: empty name")
		}
	}
	return out, nil
}

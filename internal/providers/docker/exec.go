package docker

import (
	"context"
	"crypto/rand"
	"encoding/hex"

	"github.com/docker/docker/api/types"
	"github.com/docker/docker/api/types/container"
)

// execSpec is one exec as the provider makes it.
type execSpec struct {
	Cmd        []string
	User       string
	WorkingDir string
	Env        []string
	Stdin      bool
	Tty        bool
}

type startedExec struct {
	id string
	hj types.HijackedResponse
}

// startExec creates and starts an exec with stdout and stderr attached.
func (d *Docker) startExec(ctx context.Context, id string, s execSpec) (startedExec, error) {
	created, err := d.cli.ContainerExecCreate(ctx, id, container.ExecOptions{
		User:         s.User,
		Tty:          s.Tty,
		AttachStdin:  s.Stdin,
		AttachStdout: true,
		AttachStderr: !s.Tty,
		Env:          s.Env,
		WorkingDir:   s.WorkingDir,
		Cmd:          s.Cmd,
		// The escape sequence only applies to TTY stdin; make it one
		// nobody types so ^P stays usable in a shell.
		DetachKeys: detachKeys,
	})
	if err != nil {
		return startedExec{}, d.kind(err, "exec in %s", id)
	}
	hj, err := d.cli.ContainerExecAttach(ctx, created.ID, container.ExecAttachOptions{Tty: s.Tty})
	if err != nil {
		return startedExec{}, d.kind(err, "exec in %s", id)
	}
	return startedExec{id: created.ID, hj: hj}, nil
}

// detachKeys is the TTY detach sequence the daemon watches for: long and
// unlikely, since the daemon holds back a typed prefix of it.
const detachKeys = "ctrl-^,ctrl-],ctrl-^,ctrl-]"

func newNonce() string {
	b := make([]byte, 16)
	rand.Read(b)
	return hex.EncodeToString(b)
}

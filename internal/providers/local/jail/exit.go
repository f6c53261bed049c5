package jail

import (
	"os"

	"golang.org/x/sys/unix"
)

// InitFatalSignals are the signals that crash a Go program when another
// process sends them. Init, as a pid namespace's init, cannot die of a
// signal sent from inside the namespace; on one of these it exits with
// InitSignalExit plus the signal's number instead, which exitReason
// reads as death by that signal. (SIGHUP, SIGINT, SIGTERM and the like are
// ignored: see runInit.)
var InitFatalSignals = []os.Signal{
	unix.SIGILL, unix.SIGTRAP, unix.SIGABRT, unix.SIGBUS, unix.SIGFPE,
	unix.SIGSEGV, unix.SIGSTKFLT, unix.SIGSYS,
}

// InitSignalExit + n is init's exit status after a fatal signal n (the
// shell's convention).
const InitSignalExit = 128

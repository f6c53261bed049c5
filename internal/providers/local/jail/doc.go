// Package jail is the local provider's in-sandbox half: setup, which
// stages a sandbox's root in a mount namespace of its own, and init, the
// sandbox's PID 1 and its agent (package agent's server, whose forks and
// file lookups run on one thread under the seccomp filter the gateway
// compiled). The gateway (package local) and the agent binary both link
// it, and it links neither the image nor the profile libraries: the agent
// binary starts a sandbox several times faster than the gateway's own.
//
// Both run as hidden subcommands of whichever binary the gateway names
// (SetupArg, InitArg, ProbeArg), caught by this package's init function
// before main.
package jail

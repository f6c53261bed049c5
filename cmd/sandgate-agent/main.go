// Command sandgate-agent is sandgate's in-sandbox agent (package
// internal/agent): a static binary the gateway makes available inside
// every sandbox of a provider that runs one. It also holds the local
// provider's setup and init (the hidden subcommands of package
// providers/local/jail, caught by its init function): a small binary
// starts them several times faster than the gateway's own.
package main

import (
	"os"

	"github.com/sandgate/sandgate/internal/agent"
	_ "github.com/sandgate/sandgate/internal/providers/local/jail"
)

func main() { os.Exit(agent.Main(os.Args[1:])) }

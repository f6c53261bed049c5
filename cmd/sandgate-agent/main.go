// Command sandgate-agent is sandgate's in-sandbox agent (package
// internal/agent): a static binary the gateway makes available inside
// every sandbox of a provider that runs one.
package main

import (
	"os"

	"github.com/sandgate/sandgate/internal/agent"
)

func main() { os.Exit(agent.Main(os.Args[1:])) }

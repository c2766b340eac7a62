// Command moat-agent is the agent inside every sandbox: PID 1 of the
// sandbox, serving the OpenSandbox execd API (internal/execd) on port
// 44772 and starting the user's entrypoint as its child.
//
//	moat-agent [--config FILE] [--port N] [--listen ADDR] [--state-dir DIR] [--log-level L] [-- CMD...]
//
// It is its own artifact, static (CGO_ENABLED=0) and lean: it links only
// what the agent needs (deps_test.go guards its dependency list, deps.txt),
// so that it starts in a few milliseconds and stays small in memory. moat
// carries it (internal/agentbin) and the runtimes mount it into sandboxes.
package main

import (
	"os"

	"github.com/moat-sandbox/moat/internal/execd"
)

func main() {
	os.Exit(execd.Main(os.Args[1:], os.Stderr))
}

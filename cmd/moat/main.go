// Command moat is the single moat binary: the lifecycle server (`moat serve`),
// the Kubernetes controller, the MCP server and the CLI verbs. It carries
// the in-sandbox agent (cmd/moat-agent, see internal/agentbin); `moat
// execd` runs the same agent code, for existing command lines. The server
// verbs are Linux only; the client verbs build for darwin and windows.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/moat-sandbox/moat/internal/cli"
)

func main() {
	// The agent alias (`moat execd`) is PID 1 in a sandbox and handles
	// signals itself; everything else is cancelled on SIGINT/SIGTERM.
	if code, ok := cli.FastPath(os.Args[1:]); ok {
		os.Exit(code)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := cli.Execute(ctx, os.Args[1:])
	stop()
	os.Exit(code)
}

// Command moat is the single moat binary: the lifecycle server (`moat serve`),
// the in-sandbox agent (`moat execd`), the Kubernetes controller, the MCP
// server and the CLI verbs.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/moat-sandbox/moat/internal/cli"
)

func main() {
	// The agent (`moat execd`) is PID 1 in a sandbox and handles signals
	// itself; everything else is cancelled on SIGINT/SIGTERM.
	if len(os.Args) > 1 && os.Args[1] == "execd" {
		os.Exit(cli.RunExecd(os.Args[2:]))
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := cli.Execute(ctx, os.Args[1:])
	stop()
	os.Exit(code)
}

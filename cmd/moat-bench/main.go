// Command moat-bench runs moat's benchmarks and scale drivers (`moat-bench
// create|pool|fork|load|k8s`, see internal/bench/benchcli). It is a binary
// of its own so that the lab (benchmarks, scale drivers, their loopback
// registry and fixtures) stays out of the moat binary users install; `moat
// bench ARGS` runs it. The Kubernetes benchmarks run moat itself as
// processes: the moat next to this binary, or --moat.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/moat-sandbox/moat/internal/bench/benchcli"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	root := benchcli.NewCommand()
	root.SetArgs(os.Args[1:])
	err := root.ExecuteContext(ctx)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "moat-bench:", err)
		os.Exit(1)
	}
}

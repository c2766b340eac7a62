package cli

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"strings"

	"github.com/spf13/cobra"

	"github.com/moat-sandbox/moat/internal/execd"
)

// RunExecd runs the in-sandbox agent with its own flag parsing (it bypasses
// cobra so that PID 1 starts fast) and returns the exit code: 0 after a
// clean shutdown, 2 for bad arguments, 1 for other failures.
func RunExecd(args []string) int {
	cfg, err := execd.ParseArgs(args, os.Getenv)
	if err != nil {
		fmt.Fprintln(os.Stderr, "moat execd:", err)
		return 2
	}
	var level slog.Level
	level.UnmarshalText([]byte(strings.ToUpper(cfg.LogLevel)))
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
	if err := execd.Run(context.Background(), cfg, log); err != nil {
		log.Error("execd failed", "err", err)
		return 1
	}
	return 0
}

func newExecdCommand() *cobra.Command {
	return &cobra.Command{
		Use:                "execd",
		Short:              "Run the in-sandbox agent (started by moat inside each sandbox)",
		DisableFlagParsing: true,
		RunE: func(cmd *cobra.Command, args []string) error {
			return &ExitError{Code: RunExecd(args)}
		},
	}
}

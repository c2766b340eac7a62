package execd

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
)

// Main runs the agent as a program: args are its command line after the
// program name (a leading "execd", the verb of `moat execd`, is accepted
// so that one command line starts either binary). Logs go to stderr. It
// returns the exit code: 0 after a clean shutdown, 2 for bad arguments,
// 1 for other failures.
func Main(args []string, stderr io.Writer) int {
	if len(args) > 0 && args[0] == "execd" {
		args = args[1:]
	}
	cfg, err := ParseArgs(args, os.Getenv)
	if err != nil {
		fmt.Fprintln(stderr, "moat-agent:", err)
		return 2
	}
	var level slog.Level
	level.UnmarshalText([]byte(strings.ToUpper(cfg.LogLevel)))
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level}))
	if err := Run(context.Background(), cfg, log); err != nil {
		log.Error("agent failed", "err", err)
		return 1
	}
	return 0
}

package execd

import (
	"context"
	"encoding/json"
	"log/slog"
	"os"
)

// helperEnv makes the test binary act as the agent (see TestMain), so agent
// tests can run it as a separate process, e.g. as PID 1 of a new PID
// namespace.
const helperEnv = "EXECD_TEST_HELPER"

func runHelper() int {
	var args []string
	if err := json.Unmarshal([]byte(os.Getenv(helperEnv)), &args); err != nil {
		return 2
	}
	cfg, err := ParseArgs(args, os.Getenv)
	if err != nil {
		os.Stderr.WriteString("helper: " + err.Error() + "\n")
		return 2
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	if err := Run(context.Background(), cfg, log); err != nil {
		os.Stderr.WriteString("helper: " + err.Error() + "\n")
		return 1
	}
	return 0
}

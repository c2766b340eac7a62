package cli

import (
	"github.com/spf13/cobra"
)

// RunExecd runs the in-sandbox agent with its own flag parsing (it bypasses
// cobra so that PID 1 starts fast) and returns the exit code. Owned by the
// execd work: replace this stub.
func RunExecd(args []string) int {
	return 1
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

package cli

import (
	"os"

	"github.com/spf13/cobra"

	"github.com/moat-sandbox/moat/internal/execd"
)

// RunExecd runs the in-sandbox agent, as `moat execd` (an alias of the
// moat-agent artifact, kept for existing command lines), bypassing cobra
// so that it starts fast. It returns the exit code (see execd.Main).
func RunExecd(args []string) int { return execd.Main(args, os.Stderr) }

func newExecdCommand() *cobra.Command {
	return &cobra.Command{
		Use:                "execd",
		Short:              "Run the in-sandbox agent (an alias of moat-agent, which moat carries)",
		DisableFlagParsing: true,
		RunE: func(cmd *cobra.Command, args []string) error {
			return &ExitError{Code: RunExecd(args)}
		},
	}
}

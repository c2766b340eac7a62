// Package cli implements the moat command tree (cobra). Each noun lives in
// its own file and contributes one constructor to NewRoot.
package cli

import (
	"context"
	"errors"
	"fmt"
	"os"

	"github.com/spf13/cobra"

	"github.com/moat-sandbox/moat/internal/errdefs"
)

// NewRoot builds the command tree.
func NewRoot() *cobra.Command {
	root := &cobra.Command{
		Use:           "moat",
		Short:         "moat: a self-hostable, OpenSandbox-compatible sandbox platform for AI agents",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.AddCommand(platformCommands()...)
	root.AddCommand(
		newControllerCommand(),
		newNodeCommand(),
		newSandboxCommand(),
		newExecCommand(),
		newCommandCommand(),
		newFilesCommand(),
		newShellCommand(),
		newPoolCommand(),
		newTemplateCommand(),
		newSnapshotCommand(),
		newVaultCommand(),
		newVolumeCommand(),
		newMCPCommand(),
		newKeyCommand(),
		newTenantCommand(),
		newVersionCommand(),
	)
	return root
}

// Execute runs the command tree with args and returns the process exit code.
func Execute(ctx context.Context, args []string) int {
	root := NewRoot()
	root.SetArgs(args)
	err := root.ExecuteContext(ctx)
	if err == nil {
		return 0
	}
	var ee *ExitError
	if errors.As(err, &ee) {
		return ee.Code
	}
	fmt.Fprintln(os.Stderr, "moat:", err)
	return ExitCode(err)
}

// ExitError makes the CLI exit with Code without printing anything more
// (used by `moat exec` to pass a command's exit code through).
type ExitError struct{ Code int }

func (e *ExitError) Error() string { return fmt.Sprintf("exit status %d", e.Code) }

// ExitCode maps an error class to a process exit code.
func ExitCode(err error) int {
	switch {
	case errdefs.IsNotFound(err):
		return 4
	case errdefs.IsInvalidArgument(err):
		return 2
	case errdefs.IsConflict(err), errdefs.IsFailedPrecondition(err), errdefs.IsAlreadyExists(err):
		return 3
	default:
		return 1
	}
}

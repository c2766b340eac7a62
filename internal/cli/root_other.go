//go:build !linux

package cli

import (
	"github.com/spf13/cobra"
)

// platformCommands: the server-side verbs (serve, doctor, execd, image, bench)
// are Linux only; on other platforms moat is the client (the CLI verbs,
// `moat mcp`, `moat controller`).
func platformCommands() []*cobra.Command { return nil }

// FastPath has nothing to run outside Linux (see root_linux.go).
func FastPath(args []string) (code int, ok bool) { return 0, false }

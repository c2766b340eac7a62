package cli

import "github.com/spf13/cobra"

// newImageCommand is the `moat image` noun (pull, import, ls, rm). Owned by
// the image work: replace this stub.
func newImageCommand() *cobra.Command {
	return &cobra.Command{Use: "image", Short: "Manage local images"}
}

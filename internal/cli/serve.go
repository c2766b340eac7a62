package cli

import "github.com/spf13/cobra"

func newServeCommand() *cobra.Command {
	return &cobra.Command{Use: "serve", Short: "Run the lifecycle API server"}
}

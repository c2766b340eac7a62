package cli

import (
	"log/slog"
	"os"

	"github.com/spf13/cobra"

	"github.com/moat-sandbox/moat/internal/bench"
)

func newBenchForkCommand() *cobra.Command {
	var o bench.ForkBenchOptions
	cmd := &cobra.Command{
		Use:   "fork",
		Short: "snapshot a sandbox, then fork N from it cold and from a warm fork pool",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if o.APIKey == "" {
				o.APIKey = os.Getenv("MOAT_API_KEY")
			}
			log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
			return bench.RunFork(cmd.Context(), o, cmd.OutOrStdout(), log)
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.Server, "server", "", "base URL of a running server (default: start one in-process)")
	f.StringVar(&o.APIKey, "api-key", "", "API key for --server (default $MOAT_API_KEY)")
	f.StringVar(&o.Image, "image", "", "image reference (default: in-process busybox)")
	f.StringVar(&o.RuntimeClass, "runtime-class", "crun", "runtime class of the forks")
	f.IntVarP(&o.N, "count", "n", 100, "sandboxes to fork")
	f.BoolVar(&o.SkipCold, "skip-cold", false, "skip the cold fork")
	return cmd
}

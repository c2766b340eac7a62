package benchcli

import (
	"log/slog"

	"github.com/spf13/cobra"

	"github.com/moat-sandbox/moat/internal/bench"
)

func newBenchForkCommand() *cobra.Command {
	var o bench.ForkBenchOptions
	cmd := &cobra.Command{
		Use:   "fork",
		Short: "snapshot a sandbox, then fork N from it cold and from a warm fork pool",
		Args:  cobra.NoArgs,
		RunE: benchRun(&o.Target, func(cmd *cobra.Command, log *slog.Logger) error {
			return bench.RunFork(cmd.Context(), o, cmd.OutOrStdout(), log)
		}),
	}
	benchTargetFlags(cmd, &o.Target)
	f := cmd.Flags()
	f.StringVar(&o.RuntimeClass, "runtime-class", "crun", "runtime class of the forks")
	f.IntVarP(&o.N, "count", "n", 100, "sandboxes to fork")
	f.BoolVar(&o.SkipCold, "skip-cold", false, "skip the cold forks")
	f.BoolVar(&o.APIOnly, "cold-only", false, "stop after the cold forks (no fork pool)")
	f.BoolVar(&o.SkipWarm, "skip-warm", false, "skip the warm fork pool")
	f.StringVar(&o.Memory, "memory", "", `memory limit of the source (e.g. "256Mi"; default: the server's)`)
	f.IntVar(&o.FillMiB, "fill-mib", 0, "memory the source holds in a /dev/shm file before the snapshot")
	return cmd
}

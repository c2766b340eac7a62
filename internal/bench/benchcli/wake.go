package benchcli

import (
	"log/slog"

	"github.com/spf13/cobra"

	"github.com/moat-sandbox/moat/internal/bench"
)

func newBenchWakeCommand() *cobra.Command {
	var o bench.WakeBenchOptions
	cmd := &cobra.Command{
		Use:   "wake",
		Short: "time the wake of idle-paused and idle-hibernated sandboxes until the held request is answered",
		Args:  cobra.NoArgs,
		RunE: benchRun(&o.Target, func(cmd *cobra.Command, log *slog.Logger) error {
			return bench.RunWake(cmd.Context(), o, cmd.OutOrStdout(), log)
		}),
	}
	benchTargetFlags(cmd, &o.Target)
	f := cmd.Flags()
	f.StringSliceVar(&o.Classes, "runtime-class", []string{"runc", "runsc"}, "runtime classes to measure")
	f.IntVarP(&o.Rounds, "rounds", "n", 10, "idle pauses and wakes per sandbox")
	f.IntVar(&o.FillMiB, "fill-mib", 48, "memory each sandbox holds (a file of random bytes in /dev/shm) before it idles")
	return cmd
}

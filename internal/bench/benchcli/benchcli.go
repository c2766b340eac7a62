// Package benchcli is the command tree of moat-bench (cmd/moat-bench):
// the benchmarks and scale drivers, kept out of the moat binary users
// install. `moat bench ARGS` runs `moat-bench ARGS` (internal/cli).
package benchcli

import (
	"fmt"
	"log/slog"
	"os"
	"runtime/pprof"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/moat-sandbox/moat/internal/bench"
)

// NewCommand builds the moat-bench command tree.
func NewCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:           "moat-bench",
		Short:         "Measure moat (prints figures); also run as moat bench",
		SilenceUsage:  true,
		SilenceErrors: true,
		// moat-bench is run by hand and by make; no shell completion.
		CompletionOptions: cobra.CompletionOptions{DisableDefaultCmd: true},
	}
	var o bench.CreateBenchOptions
	var classes string
	create := &cobra.Command{
		Use:   "create",
		Short: "p50/p99 of create -> Running -> first command",
		Long: `Creates N sandboxes per runtime class, one after another (or --concurrency
at once), timing POST /v1/sandboxes until Running plus the first command
through the agent, then deletes them. Without --server, an in-process
server with a throw-away state directory is started on loopback, with a
busybox image (from the host's busybox-static) in a loopback registry.`,
		Args: cobra.NoArgs,
		RunE: benchRun(&o.Target, func(cmd *cobra.Command, log *slog.Logger) error {
			if classes != "" {
				o.Classes = strings.Split(classes, ",")
			}
			return bench.RunCreate(cmd.Context(), o, cmd.OutOrStdout(), log)
		}),
	}
	benchTargetFlags(create, &o.Target)
	f := create.Flags()
	f.StringVar(&classes, "runtime-class", "runc,crun", "comma-separated runtime classes to measure")
	f.StringVar(&o.Runtime, "runtime", "oci", "backend of the in-process server: oci or docker (use --runtime-class docker)")
	f.IntVarP(&o.N, "count", "n", 100, "sandboxes per runtime class")
	f.IntVarP(&o.Concurrency, "concurrency", "c", 1, "creates in flight at once")
	cmd.AddCommand(create, newBenchPoolCommand(), newBenchForkCommand(), newBenchWakeCommand(), newBenchOverheadCommand(), newBenchLoadCommand(), newBenchK8sCommand())
	return cmd
}

func newBenchPoolCommand() *cobra.Command {
	var o bench.PoolBenchOptions
	cmd := &cobra.Command{
		Use:   "pool",
		Short: "warm claim p50/p99, batch from a warm pool, cold batch, memory per sandbox",
		Args:  cobra.NoArgs,
		RunE: benchRun(&o.Target, func(cmd *cobra.Command, log *slog.Logger) error {
			return bench.RunPool(cmd.Context(), o, cmd.OutOrStdout(), log)
		}),
	}
	benchTargetFlags(cmd, &o.Target)
	f := cmd.Flags()
	f.StringVar(&o.RuntimeClass, "runtime-class", "crun", "runtime class of the pool sandboxes")
	f.IntVar(&o.Claims, "claims", 100, "single warm claims to time")
	f.IntVar(&o.Batch, "batch", 100, "size of the batch from a warm pool")
	f.IntVar(&o.Cold, "cold", 1000, "sandboxes to create cold in one batch (0 = skip)")
	return cmd
}

func newBenchLoadCommand() *cobra.Command {
	var o bench.LoadBenchOptions
	cmd := &cobra.Command{
		Use:   "load",
		Short: "sustained create/exec/delete: per-interval throughput, errors, p50/p99, server RSS",
		Long: `Runs --concurrency loops of create -> first command -> delete for --duration,
printing per --interval: cycles/s, errors by step, create and cycle p50/p99,
the server's RSS (from /proc/<--server-pid>/status; this process for the
in-process server; else process_resident_memory_bytes from /metrics) and
how many sandboxes the server holds, then a summary with the RSS trend.`,
		Args: cobra.NoArgs,
		RunE: benchRun(&o.Target, func(cmd *cobra.Command, log *slog.Logger) error {
			return bench.RunLoad(cmd.Context(), o, cmd.OutOrStdout(), log)
		}),
	}
	benchTargetFlags(cmd, &o.Target)
	f := cmd.Flags()
	f.StringVar(&o.RuntimeClass, "runtime-class", "", "runtime class (default: the server's)")
	f.StringVar(&o.Runtime, "runtime", "oci", "backend of the in-process server: oci or docker")
	f.IntVarP(&o.Concurrency, "concurrency", "c", 8, "create/exec/delete loops at once")
	f.DurationVar(&o.Duration, "duration", time.Minute, "how long to sustain the load")
	f.DurationVar(&o.Interval, "interval", 10*time.Second, "reporting interval")
	f.IntVar(&o.ServerPID, "server-pid", 0, "PID of a local server, for its RSS")
	f.StringVar(&o.ServerRoot, "server-root", "", "--root of a local server: also count its goroutines, open files, mounts, netns, IPs per interval")
	f.StringVar(&o.ServerRunRoot, "server-run-root", "", "--run-root of that server (mounts and netns files under it)")
	f.StringVar(&o.CgroupParent, "server-cgroup-parent", "", "--cgroup-parent of that server (its sandbox cgroups are counted)")
	return cmd
}

// benchTargetFlags binds the flags every bench verb shares to t.
func benchTargetFlags(cmd *cobra.Command, t *bench.Target) {
	f := cmd.Flags()
	f.StringVar(&t.Server, "server", "", "base URL of a running server (default: start one in-process)")
	f.StringVar(&t.APIKey, "api-key", "", "API key for --server (default $MOAT_API_KEY)")
	f.StringVar(&t.Image, "image", "", "image reference (default: in-process busybox)")
	f.String("log-level", "warn", "log level of the in-process server (debug shows the create phases: `oci: created`)")
	f.String("cpuprofile", "", "write a CPU profile of this process (with the in-process server) to the file")
}

// benchRun adapts a bench runner to cobra's RunE: the API key defaults to
// $MOAT_API_KEY and the in-process server logs warnings to stderr.
func benchRun(t *bench.Target, run func(cmd *cobra.Command, log *slog.Logger) error) func(*cobra.Command, []string) error {
	return func(cmd *cobra.Command, _ []string) error {
		if t.APIKey == "" {
			t.APIKey = os.Getenv("MOAT_API_KEY")
		}
		level := slog.LevelWarn
		if s, _ := cmd.Flags().GetString("log-level"); s != "" {
			if err := level.UnmarshalText([]byte(s)); err != nil {
				return fmt.Errorf("--log-level: %w", err)
			}
		}
		if path, _ := cmd.Flags().GetString("cpuprofile"); path != "" {
			f, err := os.Create(path)
			if err != nil {
				return err
			}
			defer f.Close()
			if err := pprof.StartCPUProfile(f); err != nil {
				return err
			}
			defer pprof.StopCPUProfile()
		}
		return run(cmd, slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level})))
	}
}

package benchcli

import (
	"os"

	"github.com/spf13/cobra"

	"github.com/moat-sandbox/moat/internal/bench"
)

func newBenchOverheadCommand() *cobra.Command {
	var o bench.OverheadBenchOptions
	cmd := &cobra.Command{
		Use:   "overhead",
		Short: "p50/p90 of create and of the exec round trip on two servers side by side (e.g. without and with auditing)",
		Long: `Measures two running servers in one run, alternating between them sample by
sample: create -> Running -> first command, and the exec round trip of
` + "`true`" + ` on a running sandbox, both through the server proxy (the SDKs'
use_server_proxy path, which the audit trail records). Server A is the
baseline, B the variant (make bench-overhead starts A with --audit-trail off
and --audit-log off, B with both on and OTLP export to a collector). Prints
p50/p90 of each, how much B's p50 is above A's, and the noise floor (the
difference between the p50s of A's two halves, each with as many samples taken first as second).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			for _, t := range []*bench.Target{&o.A, &o.B} {
				if t.APIKey == "" {
					t.APIKey = os.Getenv("MOAT_API_KEY")
				}
			}
			return bench.RunOverhead(cmd.Context(), o, cmd.OutOrStdout())
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.A.Server, "server-a", "", "base URL of the baseline server")
	f.StringVar(&o.A.APIKey, "api-key-a", "", "API key of --server-a (default $MOAT_API_KEY)")
	f.StringVar(&o.B.Server, "server-b", "", "base URL of the server compared with it")
	f.StringVar(&o.B.APIKey, "api-key-b", "", "API key of --server-b (default $MOAT_API_KEY)")
	f.StringVar(&o.Image, "image", "", "image reference both servers can pull")
	f.StringVar(&o.RuntimeClass, "runtime-class", "crun", "runtime class of the sandboxes")
	f.IntVar(&o.Creates, "creates", 100, "timed creates per server")
	f.IntVar(&o.Execs, "execs", 500, "timed exec round trips per server")
	f.IntVar(&o.Warmup, "warmup", 20, "exec round trips per server before the timed ones")
	return cmd
}

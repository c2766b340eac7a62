package cli

import (
	"github.com/go-logr/logr"
	"github.com/spf13/cobra"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/moat-sandbox/moat/internal/k8s/bench"
)

func newBenchK8sCommand() *cobra.Command {
	var o bench.Options
	cmd := &cobra.Command{
		Use:   "k8s",
		Short: "pool fill, and wall time and API writes to deliver N sandboxes from a warm Pool and cold",
		Long: `Starts a throw-away control plane (kube-apiserver and etcd from
scripts/build-k8s-tools.sh, kwok for fake nodes) and ` + "`moat controller`" + ` as its
own process at its default flags (behind a loopback proxy that counts its
API writes), then times the fill of a Pool of N, one BatchSandbox of N from
the warm Pool and one of N created cold.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			ctrllog.SetLogger(logr.Discard())
			_, err := bench.Run(cmd.Context(), o, cmd.OutOrStdout())
			return err
		},
	}
	f := cmd.Flags()
	f.IntVarP(&o.N, "count", "n", 100, "sandboxes per batch")
	f.IntVar(&o.Nodes, "nodes", 4, "fake nodes")
	f.StringArrayVar(&o.ControllerArgs, "controller-arg", nil, "extra flag for moat controller (repeatable), e.g. --controller-arg=--kube-api-qps=5")
	return cmd
}

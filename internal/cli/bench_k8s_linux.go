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
		Short: "moat's Kubernetes path on a cluster: pool fill, warm and cold batches (wall, API writes); create -> first command",
		Long: `Runs ` + "`moat controller`" + ` as its own process at its default flags (behind a
loopback proxy that counts its API writes) against the cluster of
--kubeconfig, which must have moat's CRDs installed, in a namespace of its
own (deleted at the end). It then times:

  with -n N:      the fill of a Pool of N, and one BatchSandbox of N from the
                  warm Pool and one created cold (fake nodes such as kwok's
                  suit large N);
  with --image:   create -> Running -> first command of one sandbox at a
                  time (--creates of them, through the kubernetes runtime of
                  moat serve), and a BatchSandbox of --warm sandboxes from a
                  warm Pool until each answered a command (real nodes whose
                  pod IPs this host reaches; --agent-image must be an image
                  holding moat, as for moat controller).

make bench-k8s and make bench-k8s-node bring up throw-away clusters (kwok's
fake nodes; a real single-node cluster) and run it.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			ctrllog.SetLogger(logr.Discard())
			_, err := bench.Run(cmd.Context(), o, cmd.OutOrStdout())
			return err
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.Kubeconfig, "kubeconfig", "", "the cluster's kubeconfig (default $KUBECONFIG, ~/.kube/config, or in-cluster)")
	f.IntVarP(&o.N, "count", "n", 100, "pool and batch size of the batch figures (0 = skip them)")
	f.StringVar(&o.Image, "image", "", "an image the nodes can run (sh, echo, tail): measure real sandboxes with it")
	f.StringVar(&o.AgentImage, "agent-image", "", "the controller's --agent-image (default moat:bench, for fake nodes)")
	f.IntVar(&o.Creates, "creates", 10, "single sandboxes to time (with --image)")
	f.IntVar(&o.Warm, "warm", 10, "size of the warm batch of real sandboxes (with --image)")
	f.DurationVar(&o.Timeout, "timeout", 0, "bound of each phase (default 5m)")
	f.StringArrayVar(&o.ControllerArgs, "controller-arg", nil, "extra flag for moat controller (repeatable), e.g. --controller-arg=--kube-api-qps=5")
	return cmd
}

package benchcli

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"

	"github.com/go-logr/logr"
	"github.com/spf13/cobra"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/moat-sandbox/moat/internal/bench/k8s"
	"github.com/moat-sandbox/moat/internal/bench/k8s/scale"
)

func newBenchK8sCommand() *cobra.Command {
	var o k8s.Options
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
fake nodes; a real single-node cluster) and run it. moat-bench k8s claims
measures claims through the Lifecycle API at cluster scale.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			return runK8sBench(&o.Moat, func() error { _, err := k8s.Run(cmd.Context(), o, cmd.OutOrStdout()); return err })
		},
	}
	f := cmd.Flags()
	k8sFlags(cmd, &o.Kubeconfig, &o.Moat)
	f.IntVarP(&o.N, "count", "n", 100, "pool and batch size of the batch figures (0 = skip them)")
	f.StringVar(&o.Image, "image", "", "an image the nodes can run (sh, echo, tail): measure real sandboxes with it")
	f.StringVar(&o.AgentImage, "agent-image", "", "the controller's --agent-image (default moat:bench, for fake nodes)")
	f.IntVar(&o.Creates, "creates", 10, "single sandboxes to time (with --image)")
	f.IntVar(&o.Warm, "warm", 10, "size of the warm batch of real sandboxes (with --image)")
	f.StringVar(&o.Class, "runtime-class", "", "RuntimeClass of the real sandboxes (with --image; default: the node's default runtime)")
	f.DurationVar(&o.Timeout, "timeout", 0, "bound of each phase (default 5m)")
	f.StringArrayVar(&o.ControllerArgs, "controller-arg", nil, "extra flag for moat controller (repeatable), e.g. --controller-arg=--k8s-api-qps=5")
	cmd.AddCommand(newBenchK8sClaimsCommand())
	return cmd
}

func newBenchK8sClaimsCommand() *cobra.Command {
	var o scale.Options
	cmd := &cobra.Command{
		Use:   "claims",
		Short: "claims through the Lifecycle API at cluster scale: throughput, latency, API writes; ledger checked",
		Long: `Runs ` + "`moat controller`" + ` and --replicas replicas of ` + "`moat serve --runtime kubernetes`" + `
as processes at their defaults (each server behind a loopback proxy that
counts its API writes) against the cluster of --kubeconfig, which must have
moat's CRDs installed, in a namespace of its own (deleted at the end). It
makes a Pool of --pool warm pods through the Lifecycle API, then --workers
clients spread over the replicas make --claims single claims (poolRef) and
--batches batches of --batch one after another, and, with --crd, claims of one through the CRD path
(a BatchSandbox each) for comparison; with --policy, single claims with a
network policy (each sets its pod's egress sidecar) in turn with plain ones. The agents of the pods are never
called: fake nodes such as kwok's suit it (make bench-k8s-claims brings up
a throw-away control plane with kwok's nodes and runs it).

Before any figure, the ledger is checked: every claim answered, each
claimed sandbox owns exactly one pod in the pool's allocation table, no pod
is owned twice, every replica lists every sandbox. A failed check is an
error and prints no figures.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			return runK8sBench(&o.Moat, func() error { _, err := scale.Run(cmd.Context(), o, cmd.OutOrStdout()); return err })
		},
	}
	f := cmd.Flags()
	k8sFlags(cmd, &o.Kubeconfig, &o.Moat)
	f.IntVar(&o.Pool, "pool", 1000, "warm pods in the pool")
	f.IntVar(&o.Batch, "batch", 100, "size of a batch claim")
	f.IntVar(&o.Batches, "batches", 1, "batch claims, one after another through the replicas in turn")
	f.IntVar(&o.Claims, "claims", 0, "single claims (default: the rest of the pool)")
	f.IntVar(&o.CRDClaims, "crd", 0, "claims of one through the CRD path, after the others")
	f.IntVar(&o.PolicyClaims, "policy", 0, "single claims with a network policy after the others, each followed by one without (the pods need an egress API at their IPs: the test harness's stand-in sidecars on kwok)")
	f.IntVar(&o.Replicas, "replicas", 2, "server replicas")
	f.IntVar(&o.Workers, "workers", 16, "concurrent clients")
	f.DurationVar(&o.Timeout, "timeout", 0, "bound of the pool's fill (default 10m)")
	return cmd
}

// runK8sBench runs a Kubernetes benchmark with the moat binary it runs
// as processes resolved (moatBinary) and controller-runtime's logger set
// to discard (unset, controller-runtime prints a warning with a stack
// trace into the figures' output).
func runK8sBench(moat *string, run func() error) error {
	bin, err := moatBinary(*moat)
	if err != nil {
		return err
	}
	*moat = bin
	ctrllog.SetLogger(logr.Discard())
	return run()
}

// moatBinary is the moat binary the Kubernetes benchmarks run as `moat
// controller` and `moat serve`: --moat, else $MOAT_BIN (which `moat
// bench` sets to itself), else the moat next to this executable (make
// build puts both in bin/), else moat on $PATH.
func moatBinary(flag string) (string, error) {
	if flag != "" {
		return flag, nil
	}
	if p := os.Getenv("MOAT_BIN"); p != "" {
		return p, nil
	}
	if exe, err := os.Executable(); err == nil {
		if p := filepath.Join(filepath.Dir(exe), "moat"); isFile(p) {
			return p, nil
		}
	}
	p, err := exec.LookPath("moat")
	if err != nil {
		return "", fmt.Errorf("no moat binary to run: set --moat or $MOAT_BIN, or put moat next to moat-bench or on $PATH")
	}
	return p, nil
}

func isFile(p string) bool {
	st, err := os.Stat(p)
	return err == nil && st.Mode().IsRegular()
}

// k8sFlags binds the flags the Kubernetes benchmarks share.
func k8sFlags(cmd *cobra.Command, kubeconfig, moat *string) {
	cmd.Flags().StringVar(kubeconfig, "kubeconfig", "", "the cluster's kubeconfig (default $KUBECONFIG, ~/.kube/config, or in-cluster)")
	cmd.Flags().StringVar(moat, "moat", "", "the moat binary to run as controller and servers (default $MOAT_BIN, the moat next to moat-bench, or moat on $PATH)")
}

package cli

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/go-logr/logr"
	"github.com/spf13/cobra"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/moat-sandbox/moat/config/crd"
	"github.com/moat-sandbox/moat/internal/agentbin"
	"github.com/moat-sandbox/moat/internal/atomicfile"
	"github.com/moat-sandbox/moat/internal/k8s/controller"
	"github.com/moat-sandbox/moat/internal/k8s/kclient"
)

// serviceAccountNamespace holds the namespace of the pod a process runs in.
const serviceAccountNamespace = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"

func newControllerCommand() *cobra.Command {
	var (
		opts        controller.Options
		kc          string
		installCRDs bool
		logLevel    string
		policy      bool
	)
	cmd := &cobra.Command{
		Use:   "controller",
		Short: "Run the Kubernetes controller of OpenSandbox's Pool, BatchSandbox and SandboxSnapshot resources",
		Long: `Run moat's Kubernetes controller for OpenSandbox's resources
(sandbox.opensandbox.io/v1alpha1): manifests written for OpenSandbox's
controller work unchanged.

Pools keep warm sandbox pods; a BatchSandbox takes its sandboxes from its
pool in one step, recorded with a single write of its alloc-status and
endpoints annotations, and creates the rest. Pods get the moat agent from
--agent-image through an init container (moat controller copy-agent) and
run it as their entrypoint, with the container's own command as its child.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			var level slog.Level
			if err := level.UnmarshalText([]byte(logLevel)); err != nil {
				return fmt.Errorf("log-level %q: %w", logLevel, err)
			}
			ctrl.SetLogger(logr.FromSlogHandler(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level})))
			cfg, err := kclient.Load(kc)
			if err != nil {
				return err
			}
			if installCRDs {
				if err := applyCRDs(cmd.Context(), cfg); err != nil {
					return err
				}
			}
			opts.Isolation.Disabled = !policy
			if !cmd.Flags().Changed("sandbox-ingress-namespace") {
				// In a pod: its own namespace (the controller runs tasks
				// through the sandboxes' agents).
				if ns, err := os.ReadFile(serviceAccountNamespace); err == nil && strings.TrimSpace(string(ns)) != "" {
					opts.Isolation.FromNamespaces = []string{strings.TrimSpace(string(ns))}
				}
			}
			mgr, err := controller.New(cfg, opts)
			if err != nil {
				return err
			}
			return mgr.Start(cmd.Context())
		},
	}
	f := cmd.Flags()
	f.StringVar(&kc, "kubeconfig", "", "kubeconfig file (default $KUBECONFIG, ~/.kube/config, or in-cluster)")
	f.StringVar(&opts.AgentImage, "agent-image", envOr("MOAT_AGENT_IMAGE", "moat:latest"), "image holding /moat for the agent init container ($MOAT_AGENT_IMAGE)")
	f.StringVar(&opts.Namespace, "namespace", "", "watch only this namespace (default all)")
	f.BoolVar(&opts.LeaderElection, "leader-elect", false, "elect one active replica (a Lease)")
	f.StringVar(&opts.LeaderElectionNamespace, "leader-elect-namespace", "", "namespace of the election lease")
	f.StringVar(&opts.MetricsAddr, "metrics-addr", "", "serve Prometheus metrics here (default off)")
	f.StringVar(&opts.HealthAddr, "health-addr", "", "serve /healthz and /readyz here (default off)")
	f.IntVar(&opts.CreateConcurrency, "create-concurrency", 32, "pod creates/deletes in flight per reconcile")
	f.Float32Var(&opts.QPS, "k8s-api-qps", kclient.DefaultQPS, "API requests per second (client-side rate limit)")
	f.IntVar(&opts.Burst, "k8s-api-burst", kclient.DefaultBurst, "API request burst (client-side rate limit)")
	// The spelling of moat serve's flags; the old one stays, hidden, for
	// deployments that still pass it.
	f.Float32Var(&opts.QPS, "kube-api-qps", kclient.DefaultQPS, "")
	f.IntVar(&opts.Burst, "kube-api-burst", kclient.DefaultBurst, "")
	f.MarkDeprecated("kube-api-qps", "use --k8s-api-qps")
	f.MarkDeprecated("kube-api-burst", "use --k8s-api-burst")
	f.BoolVar(&installCRDs, "install-crds", false, "create or update the CRDs before starting")
	f.BoolVar(&policy, "sandbox-network-policy", true, "keep a NetworkPolicy ("+controller.IsolationPolicyName+") in every sandbox namespace that denies ingress to sandbox pods except from the node, --sandbox-ingress-namespace and --sandbox-ingress-cidr (needs a CNI that enforces NetworkPolicy)")
	f.StringSliceVar(&opts.Isolation.FromNamespaces, "sandbox-ingress-namespace", nil, "namespace whose pods may reach sandbox pods (an in-cluster moat server, the ingress path); repeatable (default: the controller's own namespace when it runs in a pod)")
	f.StringSliceVar(&opts.Isolation.FromCIDRs, "sandbox-ingress-cidr", nil, "address block that may reach the agent and egress API ports of sandbox pods (an out-of-cluster moat server); repeatable")
	f.DurationVar(&opts.PauseTimeout, "pause-timeout", 10*time.Second, "how long a BatchSandbox's spec.pause waits for the nodes' moat node to confirm it before it is undone (PauseFailed)")
	f.StringVar(&opts.SnapshotRegistry.Host, "snapshot-registry", "", "registry host[:port][/prefix] SandboxSnapshots' images are pushed to by moat node (default: snapshots are refused)")
	f.BoolVar(&opts.SnapshotRegistry.Insecure, "snapshot-registry-insecure", false, "speak plain HTTP to the snapshot registry")
	f.DurationVar(&opts.CommitTimeout, "commit-timeout", 5*time.Minute, "how long a SandboxSnapshot waits for moat node's commit and push before it is Failed")
	f.StringVar(&logLevel, "log-level", "info", "log level: debug, info, warn, error")
	cmd.AddCommand(newCopyAgentCommand(), newEgressSidecarCommand())
	return cmd
}

// newCopyAgentCommand is the agent init container's entrypoint: it writes
// the agent this moat carries (internal/agentbin) to DEST, an emptyDir the
// sandbox container runs it from, so the sandbox image needs no moat of
// its own. A moat built without its agent copies itself instead (its
// `moat execd` alias serves as the agent).
func newCopyAgentCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "copy-agent DEST",
		Short: "Write the in-sandbox agent to DEST (the agent init container's job)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			err := agentbin.WriteTo(args[0])
			if errors.Is(err, agentbin.ErrMissing) {
				return copySelf(args[0])
			}
			return err
		},
	}
}

func copySelf(dest string) error {
	self, err := os.Executable()
	if err != nil {
		return err
	}
	src, err := os.Open(self)
	if err != nil {
		return err
	}
	defer src.Close()
	return atomicfile.WriteFrom(dest, src, 0o755)
}

// applyCRDs creates moat's CRDs, or updates them to this binary's version.
func applyCRDs(ctx context.Context, cfg *rest.Config) error {
	objs, err := crd.Objects()
	if err != nil {
		return err
	}
	scheme := kclient.Scheme()
	if err := apiextensionsv1.AddToScheme(scheme); err != nil {
		return err
	}
	c, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		return err
	}
	for _, o := range objs {
		err := c.Create(ctx, o)
		if apierrors.IsAlreadyExists(err) {
			cur := o.DeepCopy()
			if err = c.Get(ctx, client.ObjectKeyFromObject(o), cur); err == nil {
				o.ResourceVersion = cur.ResourceVersion
				err = c.Update(ctx, o)
			}
		}
		if err != nil {
			return fmt.Errorf("install crd %s: %w", o.Name, err)
		}
	}
	return nil
}

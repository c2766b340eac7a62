package server

import (
	"cmp"
	"context"
	"fmt"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/moat-sandbox/moat/internal/egress/mitm"
	"github.com/moat-sandbox/moat/internal/egress/vault"
	"github.com/moat-sandbox/moat/internal/errdefs"
	"github.com/moat-sandbox/moat/internal/image"
	"github.com/moat-sandbox/moat/internal/k8s/kclient"
	"github.com/moat-sandbox/moat/internal/k8s/kstore"
	"github.com/moat-sandbox/moat/internal/k8s/lease"
	"github.com/moat-sandbox/moat/internal/lifecycle"
	"github.com/moat-sandbox/moat/internal/runtime/kubernetes"
	"github.com/moat-sandbox/moat/internal/store"
)

// KubernetesConfig configures Runtime "kubernetes".
type KubernetesConfig struct {
	// Kubeconfig is the client configuration file ("" = $KUBECONFIG,
	// ~/.kube/config, or the in-cluster service account).
	Kubeconfig string
	// Namespace holds the sandboxes (default "default").
	Namespace string
	// Pool, if set, is the Pool sandboxes are claimed from when they match
	// its template.
	Pool string
	// AgentImage overrides the controller's agent image.
	AgentImage string
	// RequestFraction is the share of a sandbox's limits its pod requests
	// (0 = requests equal limits).
	RequestFraction float64
	// QPS and Burst are the client-side rate limit of the server's API
	// clients (default kclient.DefaultQPS and DefaultBurst, as `moat
	// controller`: client-go's own 5/s held each replica to a few claims
	// per second).
	QPS   float32
	Burst int
	// OrphanGrace is how old a sandbox without a record must be before
	// the leading replica deletes it (default 10m, longer than a create may take; see lifecycle).
	OrphanGrace time.Duration
	// InlineMoveAfter is how long a record a warm claim wrote into its
	// pool's allocation table stays there, once its shard is short of
	// room, before the store moves it to a Secret of its own (default
	// 200ms; see kstore: a record with room stays until its first update).
	InlineMoveAfter time.Duration
	// TenantNamespaces puts each tenant's sandboxes, pods, secrets and
	// volumes in a namespace of its own: the tenants file's, else
	// "<TenantNamespacePrefix>-<tenant>"; the default tenant's is
	// Namespace unless the file names one. Implied by a tenants file.
	TenantNamespaces bool
	// TenantNamespacePrefix is the prefix of tenant namespaces (default
	// Namespace).
	TenantNamespacePrefix string
	// IngressNamespaces may reach sandbox pods in tenant namespaces
	// (default: Namespace and the server's own namespace in a pod).
	IngressNamespaces []string
}

// serviceAccountNamespace is the file holding a pod's own namespace.
const serviceAccountNamespace = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"

// tenantNamespaces is the backend's tenant placement (nil: one namespace).
func tenantNamespaces(cfg Config, d deps) *kubernetes.TenantNamespaces {
	k := cfg.Kubernetes
	if !k.TenantNamespaces && len(cfg.fileTenants) == 0 {
		return nil
	}
	tn := &kubernetes.TenantNamespaces{Namespaces: map[string]string{}, Prefix: k.TenantNamespacePrefix, Quota: d.quota,
		IngressNamespaces: slices.Clone(k.IngressNamespaces)}
	for _, ft := range cfg.fileTenants {
		if ft.Namespace != "" {
			tn.Namespaces[ft.Name] = ft.Namespace
		}
	}
	tn.Lookup = d.named // the file as reread, when the server watches it
	if len(tn.IngressNamespaces) == 0 {
		tn.IngressNamespaces = []string{cmp.Or(k.Namespace, "default")}
		if b, err := os.ReadFile(serviceAccountNamespace); err == nil {
			if own := strings.TrimSpace(string(b)); own != "" && !slices.Contains(tn.IngressNamespaces, own) {
				tn.IngressNamespaces = append(tn.IngressNamespaces, own)
			}
		}
	}
	return tn
}

// newKubernetes builds the kubernetes backend. Network policies are
// enforced inside each pod by its egress sidecar, which the server drives
// through its egress API; the server must run where pod IPs are reachable
// (in the cluster).
func newKubernetes(ctx, run context.Context, cfg Config, d deps) (backend, error) {
	rc, err := kclient.Load(cfg.Kubernetes.Kubeconfig)
	if err != nil {
		return backend{}, fmt.Errorf("%w: %v", errdefs.ErrInvalidArgument, err)
	}
	rc.QPS, rc.Burst = cfg.Kubernetes.QPS, cfg.Kubernetes.Burst
	if rc.QPS <= 0 {
		rc.QPS = kclient.DefaultQPS
	}
	if rc.Burst <= 0 {
		rc.Burst = kclient.DefaultBurst
	}
	upstreamCA, err := cfg.vaultUpstreamCA()
	if err != nil {
		return backend{}, fmt.Errorf("%w: %v", errdefs.ErrInvalidArgument, err)
	}
	rt, err := kubernetes.New(rc, kubernetes.Config{
		Namespace:  cfg.Kubernetes.Namespace,
		Scope:      cfg.Bridge,
		Pool:       cfg.Kubernetes.Pool,
		AgentImage: cfg.Kubernetes.AgentImage,

		RequestFraction: cfg.Kubernetes.RequestFraction,
		DNSUpstreams:    cfg.DNSUpstreams,
		VaultUpstreamCA: upstreamCA,
		Tenants:         tenantNamespaces(cfg, d),
		Logger:          d.log,
	})
	if err != nil {
		return backend{}, err
	}
	// Stateless: the records live in the API server (shared by every
	// replica of this server), the background duties run on the elected
	// leader, events stay in each replica's memory.
	// A warm claim's sandbox record goes in the claim's write of the
	// pool's allocation table; the store reads it there and moves it to
	// a Secret of its own.
	st, err := kstore.New(rc, kstore.Options{Namespace: rt.Namespace(), Scope: cfg.Bridge, Inline: rt.InlineRecords(), InlineBucket: lifecycle.Bucket,
		MoveAfter: cfg.Kubernetes.InlineMoveAfter})
	if err != nil {
		rt.Close()
		return backend{}, err
	}
	rt.EnableInlineRecords(st.InlineChanged)
	el, err := lease.Run(run, rc, rt.Namespace(), "moat-serve-"+cfg.Bridge)
	if err != nil {
		st.Close()
		rt.Close()
		return backend{}, err
	}
	return backend{rt: rt, egress: kubeEgress{rt.Egress(), d.audit}, images: clusterImages{}, store: st, events: store.NewMemory(), leader: el.IsLeader, shared: st.Shared,
		close: func() error { st.Close(); return rt.Close() }}, nil
}

// kubeEgress is the runtime's Egress with the credentials its sidecars'
// proxies withhold recorded in the audit trail too, as on the native
// runtime.
type kubeEgress struct {
	*kubernetes.Egress
	audit *auditHooks
}

// AttachProxy implements credvault.CredentialProxy.
func (k kubeEgress) AttachProxy(ctx context.Context, id string, ca *mitm.CA, state *vault.State, withheld func(context.Context, mitm.Withheld)) error {
	return k.Egress.AttachProxy(ctx, id, ca, state, k.audit.withheld(id, withheld))
}

// clusterImages leaves images to the cluster: the kubelet pulls the
// reference itself, so nothing is stored locally.
type clusterImages struct{}

func (clusterImages) Ensure(ctx context.Context, ref string, auth *image.Auth) (image.Image, error) {
	if auth != nil {
		return image.Image{}, fmt.Errorf("%w: registry credentials are not supported by the kubernetes runtime (use an imagePullSecret on the service account)", errdefs.ErrInvalidArgument)
	}
	return image.Image{Name: ref}, nil
}

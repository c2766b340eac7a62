package server

import (
	"context"
	"fmt"

	"github.com/moat-sandbox/moat/internal/errdefs"
	"github.com/moat-sandbox/moat/internal/image"
	"github.com/moat-sandbox/moat/internal/k8s/kubeconfig"
	"github.com/moat-sandbox/moat/internal/runtime/kubernetes"
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
}

// newKubernetes builds the kubernetes backend. Sandboxes get no egress
// policy support here (that is the cluster's NetworkPolicy's job), and the
// server must run where pod IPs are reachable (in the cluster).
func newKubernetes(ctx, run context.Context, cfg Config, d deps) (backend, error) {
	rc, err := kubeconfig.Load(cfg.Kubernetes.Kubeconfig)
	if err != nil {
		return backend{}, fmt.Errorf("%w: %v", errdefs.ErrInvalidArgument, err)
	}
	rt, err := kubernetes.New(rc, kubernetes.Config{
		Namespace:  cfg.Kubernetes.Namespace,
		Scope:      cfg.Bridge,
		Pool:       cfg.Kubernetes.Pool,
		AgentImage: cfg.Kubernetes.AgentImage,

		RequestFraction: cfg.Kubernetes.RequestFraction,
	})
	if err != nil {
		return backend{}, err
	}
	return backend{rt: rt, images: clusterImages{}, close: rt.Close}, nil
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

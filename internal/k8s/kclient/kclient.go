// Package kclient is the client set-up that moat's Kubernetes processes
// share (the controller, the kubernetes backend, the store, the
// benchmarks): where the configuration comes from (an explicit file, else
// $KUBECONFIG or ~/.kube/config, else the in-cluster service account),
// its client-side rate limits, and the scheme with moat's types.
package kclient

import (
	"fmt"
	"os"

	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	sbv1 "github.com/moat-sandbox/moat/api/v1alpha1"
)

// Load returns the client configuration from path ("" = the defaults).
func Load(path string) (*rest.Config, error) {
	if path == "" && os.Getenv("KUBECONFIG") == "" {
		if cfg, err := rest.InClusterConfig(); err == nil {
			return cfg, nil
		}
	}
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	rules.ExplicitPath = path
	cfg, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, &clientcmd.ConfigOverrides{}).ClientConfig()
	if err != nil {
		return nil, fmt.Errorf("kubeconfig: %w", err)
	}
	return cfg, nil
}

// Client rate limits of `moat controller` (--k8s-api-qps,
// --k8s-api-burst) and of `moat serve --runtime kubernetes`: a pool of
// 100 fills in about a second on kwok, and a burst of pod creates does
// not starve the status writes.
const (
	DefaultQPS   = 200
	DefaultBurst = 400
)

// RateLimited returns a copy of cfg with the QPS and burst of opts (or the
// defaults) applied.
func RateLimited(cfg *rest.Config, qps float32, burst int) *rest.Config {
	c := rest.CopyConfig(cfg)
	if qps <= 0 {
		qps = DefaultQPS
	}
	if burst <= 0 {
		burst = DefaultBurst
	}
	c.QPS, c.Burst = qps, burst
	c.RateLimiter = nil
	return c
}

// Scheme returns a scheme with the core types and moat's.
func Scheme() *runtime.Scheme {
	s := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(s); err != nil {
		panic(err) // static registration; cannot fail
	}
	if err := sbv1.AddToScheme(s); err != nil {
		panic(err)
	}
	return s
}

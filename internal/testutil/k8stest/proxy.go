package k8stest

import (
	"k8s.io/client-go/rest"

	"github.com/moat-sandbox/moat/internal/bench/k8s/apiwrites"
)

// WriteCounter counts API writes (see apiwrites.Counter).
type WriteCounter = apiwrites.Counter

// CountingProxy is a loopback proxy counting another process's writes
// (see apiwrites.Proxy).
type CountingProxy = apiwrites.Proxy

// StartCountingProxy starts an apiwrites.Proxy to cfg's API server
// counting into w, its kubeconfig written into dir.
func StartCountingProxy(cfg *rest.Config, w *WriteCounter, dir string) (*CountingProxy, error) {
	return apiwrites.StartProxy(cfg, w, dir)
}

// Total sums counts.
func Total(counts map[string]int) int { return apiwrites.Total(counts) }

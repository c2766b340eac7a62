package kubernetes_test

import (
	"context"
	"net/netip"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/moat-sandbox/moat/internal/egress/mitm"
	"github.com/moat-sandbox/moat/internal/egress/policy"
	"github.com/moat-sandbox/moat/internal/egress/vault"
	"github.com/moat-sandbox/moat/internal/k8s/kclient"
	"github.com/moat-sandbox/moat/internal/runtime"
	"github.com/moat-sandbox/moat/internal/runtime/kubernetes"
	"github.com/moat-sandbox/moat/internal/runtime/runtimetest"
)

// nodeEgress is the conformance suite's egress harness on the real node:
// sandboxes with a policy start under it in their pod (the egress
// sidecar), changes go through the sidecar's egress API as the server
// sends them, and the outside host is two plain pods of the test's
// namespace (not sandboxes: the isolation policy does not select them)
// that answer the banner on port 7000.
type nodeEgress struct {
	eg      *kubernetes.Egress
	allowed string
	denied  string
}

var (
	_ runtimetest.EgressInside  = (*nodeEgress)(nil)
	_ runtimetest.EgressUpdater = (*nodeEgress)(nil)
)

func newNodeEgress(t *testing.T, f *nodeFixture, rt runtime.Runtime) runtimetest.EgressHarness {
	t.Helper()
	nr := rt.(nodeRuntime)
	c, err := client.New(f.node.Config, client.Options{Scheme: kclient.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	var ips []string
	for _, name := range []string{"outside-a", "outside-b"} {
		zero := int64(0)
		p := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Namespace: nr.ns, Name: name},
			Spec: corev1.PodSpec{
				TerminationGracePeriodSeconds: &zero,
				Containers: []corev1.Container{{Name: "banner", Image: f.image,
					Command: []string{"sh", "-c", "while true; do echo " + runtimetest.Banner + " | nc -l -p 7000; done"}}},
			},
		}
		if err := c.Create(ctx, p); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Delete(context.Background(), p) })
		ips = append(ips, waitPodIP(t, c, p))
	}
	return &nodeEgress{eg: nr.k.Egress(), allowed: ips[0], denied: ips[1]}
}

func waitPodIP(t *testing.T, c client.Client, p *corev1.Pod) string {
	t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	for {
		if err := c.Get(context.Background(), client.ObjectKeyFromObject(p), p); err != nil {
			t.Fatal(err)
		}
		if p.Status.Phase == corev1.PodRunning && p.Status.PodIP != "" {
			return p.Status.PodIP
		}
		if time.Now().After(deadline) {
			t.Fatalf("pod %s not running: %+v", p.Name, p.Status)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func (h *nodeEgress) Spec(p policy.NetworkPolicy) *runtime.Egress {
	return &runtime.Egress{Token: "runtimetest-egress-token", Policy: p}
}

func (h *nodeEgress) Attach(ctx context.Context, id string, ip netip.Addr, p policy.NetworkPolicy) error {
	return h.eg.Attach(ctx, id, ip, p)
}

func (h *nodeEgress) Update(ctx context.Context, id string, p policy.NetworkPolicy) error {
	_, err := h.eg.Modify(ctx, id, func(policy.NetworkPolicy) (policy.NetworkPolicy, error) { return p, nil })
	return err
}

func (h *nodeEgress) Outside() (string, string) { return h.allowed, h.denied }

// nodeVault is the conformance suite's vault harness on the real node:
// the server's Egress pushes the vault to the pod's sidecar, and the
// upstream is the test's own server on the node's bridge address.
type nodeVault struct {
	*nodeEgress
	gw string
}

func (h *nodeVault) AttachProxy(ctx context.Context, id string, ca *mitm.CA, state *vault.State, withheld func(context.Context, mitm.Withheld)) error {
	return h.eg.AttachProxy(ctx, id, ca, state, withheld)
}

func (h *nodeVault) SetProxyRules(ctx context.Context, id string, ca *mitm.CA, state *vault.State) error {
	return h.eg.SetProxyRules(ctx, id, ca, state)
}

func (h *nodeVault) Upstream() string { return h.gw }

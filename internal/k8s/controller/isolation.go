package controller

import (
	"context"
	"fmt"
	"sync"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	sbv1 "github.com/moat-sandbox/moat/api/v1alpha1"
	"github.com/moat-sandbox/moat/internal/egress/sidecar"
)

// +kubebuilder:rbac:groups=networking.k8s.io,resources=networkpolicies,verbs=get;create;update

// IsolationPolicyName is the NetworkPolicy the controller keeps in every
// namespace it makes sandbox pods in.
const IsolationPolicyName = "moat-sandbox-isolation"

// Isolation configures the NetworkPolicy that keeps sandbox pods from
// reaching each other. Every pod the controller makes carries
// LabelManaged; the policy selects those pods and admits ingress only
// from the peers below (and, as NetworkPolicy defines, from the node the
// pod runs on: a moat server or controller on the host network). Egress
// is left alone (moat's egress control is the server's job). The policy
// is only as good as the cluster's CNI: one that enforces NetworkPolicy
// (Calico, Cilium, ...) is required for sandbox-to-sandbox isolation.
type Isolation struct {
	// Disabled turns the policy off (the cluster's own policies isolate
	// the sandboxes).
	Disabled bool
	// FromNamespaces are namespaces whose pods may reach sandbox pods on
	// every port: where an in-cluster moat server, the controller and the
	// ingress path run.
	FromNamespaces []string
	// FromCIDRs are address blocks that may reach the agent port
	// (AgentPort) and the egress sidecar's API port of sandbox pods: an
	// out-of-cluster moat server or ingress gateway.
	FromCIDRs []string
}

// IsolationPolicy returns the NetworkPolicy iso makes in namespace ns.
func IsolationPolicy(ns string, iso Isolation) *networkingv1.NetworkPolicy {
	var rules []networkingv1.NetworkPolicyIngressRule
	for _, n := range iso.FromNamespaces {
		rules = append(rules, networkingv1.NetworkPolicyIngressRule{From: []networkingv1.NetworkPolicyPeer{{
			NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"kubernetes.io/metadata.name": n}},
		}}})
	}
	if len(iso.FromCIDRs) > 0 {
		tcp, port, eport := corev1.ProtocolTCP, intstr.FromInt32(AgentPort), intstr.FromInt32(sidecar.Port)
		r := networkingv1.NetworkPolicyIngressRule{Ports: []networkingv1.NetworkPolicyPort{{Protocol: &tcp, Port: &port}, {Protocol: &tcp, Port: &eport}}}
		for _, c := range iso.FromCIDRs {
			r.From = append(r.From, networkingv1.NetworkPolicyPeer{IPBlock: &networkingv1.IPBlock{CIDR: c}})
		}
		rules = append(rules, r)
	}
	return &networkingv1.NetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: IsolationPolicyName,
			Labels: map[string]string{sbv1.LabelManaged: sbv1.ManagedBy}},
		Spec: networkingv1.NetworkPolicySpec{
			PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{sbv1.LabelManaged: sbv1.ManagedBy}},
			PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress},
			Ingress:     rules,
		},
	}
}

// isolator makes the isolation policy of each namespace once per
// controller run, before the first sandbox pod there: pods are never
// created unprotected, and a steady state costs no API request.
type isolator struct {
	c    client.Client
	api  client.Reader
	opts Isolation
	mu   sync.Mutex
	done map[string]bool
}

func newIsolator(c client.Client, api client.Reader, opts Isolation) *isolator {
	return &isolator{c: c, api: api, opts: opts, done: map[string]bool{}}
}

// ensure creates (or brings up to date) the policy of namespace ns.
func (s *isolator) ensure(ctx context.Context, ns string) error {
	if s.opts.Disabled {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.done[ns] {
		return nil
	}
	want := IsolationPolicy(ns, s.opts)
	var have networkingv1.NetworkPolicy
	err := s.api.Get(ctx, client.ObjectKeyFromObject(want), &have)
	switch {
	case apierrors.IsNotFound(err):
		if err := s.c.Create(ctx, want); err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("create network policy %s/%s: %w", ns, want.Name, err)
		}
	case err != nil:
		return fmt.Errorf("get network policy %s/%s: %w", ns, want.Name, err)
	case !equality.Semantic.DeepEqual(have.Spec, want.Spec):
		have.Spec = want.Spec
		if err := s.c.Update(ctx, &have); err != nil {
			return fmt.Errorf("update network policy %s/%s: %w", ns, want.Name, err)
		}
	}
	s.done[ns] = true
	return nil
}

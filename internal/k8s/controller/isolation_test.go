package controller_test

import (
	"context"
	"testing"
	"time"

	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	sbv1 "github.com/moat-sandbox/moat/api/v1alpha1"
	"github.com/moat-sandbox/moat/internal/egress/sidecar"
	"github.com/moat-sandbox/moat/internal/k8s/controller"
)

// TestIsolationPolicy: before its first sandbox pod in a namespace, the
// controller makes the isolation NetworkPolicy there (sandbox pods admit
// ingress only from the configured namespaces and, on the agent port,
// CIDRs); a policy edited by hand is put back by the next controller;
// with the policy disabled none is made.
func TestIsolationPolicy(t *testing.T) {
	c, ns := setup(t)
	ctx := context.Background()
	iso := controller.Isolation{FromNamespaces: []string{"moat-system"}, FromCIDRs: []string{"192.0.2.0/24"}}
	_, stop := startControllerWith(t, controller.Options{AgentImage: "moat:test", Namespace: ns, Isolation: iso})
	if err := c.Create(ctx, &sbv1.BatchSandbox{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "b"},
		Spec: sbv1.BatchSandboxSpec{Replicas: ptr(int32(1)), Template: template()}}); err != nil {
		t.Fatal(err)
	}
	waitBatch(t, c, ns, "b")
	var pol networkingv1.NetworkPolicy
	key := client.ObjectKey{Namespace: ns, Name: controller.IsolationPolicyName}
	if err := c.Get(ctx, key, &pol); err != nil {
		t.Fatalf("no isolation policy after the first sandbox pod: %v", err)
	}
	sp := pol.Spec
	if sp.PodSelector.MatchLabels[sbv1.LabelManaged] != sbv1.ManagedBy || len(sp.PolicyTypes) != 1 || sp.PolicyTypes[0] != networkingv1.PolicyTypeIngress {
		t.Errorf("policy selects %v for %v, want the managed sandbox pods, ingress", sp.PodSelector, sp.PolicyTypes)
	}
	if len(sp.Ingress) != 2 ||
		sp.Ingress[0].From[0].NamespaceSelector.MatchLabels["kubernetes.io/metadata.name"] != "moat-system" || len(sp.Ingress[0].Ports) != 0 ||
		sp.Ingress[1].From[0].IPBlock.CIDR != "192.0.2.0/24" || len(sp.Ingress[1].Ports) != 2 ||
		sp.Ingress[1].Ports[0].Port.IntValue() != controller.AgentPort || sp.Ingress[1].Ports[1].Port.IntValue() != sidecar.Port {
		t.Errorf("ingress rules %+v", sp.Ingress)
	}
	for _, p := range pods(t, c, ns, nil) {
		if p.Labels[sbv1.LabelManaged] != sbv1.ManagedBy {
			t.Errorf("sandbox pod %s is not selected by the policy (labels %v)", p.Name, p.Labels)
		}
	}

	// Opened by hand: the next controller restores it.
	stop()
	pol.Spec.Ingress = []networkingv1.NetworkPolicyIngressRule{{}}
	if err := c.Update(ctx, &pol); err != nil {
		t.Fatal(err)
	}
	startControllerWith(t, controller.Options{AgentImage: "moat:test", Namespace: ns, Isolation: iso})
	if err := c.Create(ctx, &sbv1.BatchSandbox{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "b2"},
		Spec: sbv1.BatchSandboxSpec{Replicas: ptr(int32(1)), Template: template()}}); err != nil {
		t.Fatal(err)
	}
	waitBatch(t, c, ns, "b2")
	if err := c.Get(ctx, key, &pol); err != nil {
		t.Fatal(err)
	}
	if want := controller.IsolationPolicy(ns, iso); !equality.Semantic.DeepEqual(pol.Spec, want.Spec) {
		t.Errorf("policy not restored: %+v", pol.Spec)
	}

	// Disabled: no policy.
	c2, ns2 := setup(t)
	startControllerWith(t, controller.Options{AgentImage: "moat:test", Namespace: ns2, Isolation: controller.Isolation{Disabled: true}})
	if err := c2.Create(ctx, &sbv1.BatchSandbox{ObjectMeta: metav1.ObjectMeta{Namespace: ns2, Name: "b"},
		Spec: sbv1.BatchSandboxSpec{Replicas: ptr(int32(1)), Template: template()}}); err != nil {
		t.Fatal(err)
	}
	waitBatch(t, c2, ns2, "b")
	time.Sleep(100 * time.Millisecond)
	if err := c2.Get(ctx, client.ObjectKey{Namespace: ns2, Name: controller.IsolationPolicyName}, &pol); !apierrors.IsNotFound(err) {
		t.Errorf("disabled isolation: policy get = %v, want not found", err)
	}
}

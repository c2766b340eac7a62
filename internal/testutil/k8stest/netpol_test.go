package k8stest

import (
	"os/exec"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

func pod(ns, name, ip string, lbl map[string]string) corev1.Pod {
	return corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: lbl},
		Spec:   corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Ports: []corev1.ContainerPort{{Name: "web", ContainerPort: 8080, Protocol: corev1.ProtocolTCP}}}}},
		Status: corev1.PodStatus{Phase: corev1.PodRunning, PodIP: ip}}
}

// TestPolicyRules: the node's enforcer turns policies into per-pod chains
// that accept exactly the rules' sources and ports and drop the rest; pods
// no policy selects get no chain; the script is valid nft.
func TestPolicyRules(t *testing.T) {
	sbx := map[string]string{"role": "sandbox"}
	tcp := corev1.ProtocolTCP
	agent, web := intstr.FromInt32(44772), intstr.FromString("web")
	pols := []networkingv1.NetworkPolicy{{
		ObjectMeta: metav1.ObjectMeta{Namespace: "a", Name: "iso"},
		Spec: networkingv1.NetworkPolicySpec{
			PodSelector: metav1.LabelSelector{MatchLabels: sbx},
			PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress},
			Ingress: []networkingv1.NetworkPolicyIngressRule{
				{From: []networkingv1.NetworkPolicyPeer{{NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"kubernetes.io/metadata.name": "sys"}}}}},
				{From: []networkingv1.NetworkPolicyPeer{{IPBlock: &networkingv1.IPBlock{CIDR: "10.9.0.0/16", Except: []string{"10.9.1.0/24"}}}},
					Ports: []networkingv1.NetworkPolicyPort{{Protocol: &tcp, Port: &agent}, {Port: &web}}},
			},
		},
	}, {
		// Egress only: selects nothing for ingress.
		ObjectMeta: metav1.ObjectMeta{Namespace: "b", Name: "egress"},
		Spec:       networkingv1.NetworkPolicySpec{PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeEgress}},
	}}
	pods := []corev1.Pod{
		pod("a", "s1", "10.250.0.2", sbx),
		pod("a", "s2", "10.250.0.3", sbx),
		pod("a", "other", "10.250.0.4", nil),
		pod("sys", "server", "10.250.0.5", nil),
		pod("b", "b1", "10.250.0.6", nil),
	}
	ended := pod("a", "ended", "10.250.0.7", sbx)
	ended.Status.Phase = corev1.PodFailed
	pods = append(pods, ended)
	nss := []corev1.Namespace{
		{ObjectMeta: metav1.ObjectMeta{Name: "a", Labels: map[string]string{"kubernetes.io/metadata.name": "a"}}},
		{ObjectMeta: metav1.ObjectMeta{Name: "sys", Labels: map[string]string{"kubernetes.io/metadata.name": "sys"}}},
		{ObjectMeta: metav1.ObjectMeta{Name: "b", Labels: map[string]string{"kubernetes.io/metadata.name": "b"}}},
	}
	script := policyRules("moat-knp-test", "mkn-test", pols, pods, nss)
	want := []string{
		"ip daddr 10.250.0.2 jump pod_10_250_0_2",
		"ip daddr 10.250.0.3 jump pod_10_250_0_3",
		"ip saddr { 10.250.0.5 } accept",
		"ip saddr 10.9.0.0/16 ip saddr != { 10.9.1.0/24 } tcp dport 44772 accept",
		"ip saddr 10.9.0.0/16 ip saddr != { 10.9.1.0/24 } tcp dport 8080 accept",
		"tcp flags & (syn | ack) != syn accept",
		`iifname "mkn-test" oifname "mkn-test" ct state established,related accept`,
	}
	for _, w := range want {
		if !strings.Contains(script, w) {
			t.Errorf("script lacks %q:\n%s", w, script)
		}
	}
	for _, ip := range []string{"10.250.0.4", "10.250.0.6", "10.250.0.7"} {
		if strings.Contains(script, "daddr "+ip) {
			t.Errorf("pod %s is selected by no ingress policy, yet has a chain:\n%s", ip, script)
		}
	}
	if strings.Count(script, "    drop\n") != 4 { // two pods, two tables
		t.Errorf("want a final drop in each of the 4 pod chains:\n%s", script)
	}
	cmd := exec.Command("nft", "-c", "-f", "-") // check only: nothing is applied
	cmd.Stdin = strings.NewReader(script)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("nft -c: %v: %s\n%s", err, out, script)
	}
}

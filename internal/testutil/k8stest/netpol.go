package k8stest

import (
	"bytes"
	"context"
	"fmt"
	"net/netip"
	"os/exec"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
)

// The node enforces NetworkPolicy ingress rules, as a cluster with a
// policy-enforcing CNI (Calico, Cilium, ...) does, so that what moat
// creates is tested for what it does: every pod a policy selects admits
// only what the policy's ingress rules allow, from other pods on the
// node's bridge. Traffic from the node itself is always admitted (as
// NetworkPolicy defines). Egress rules are not enforced (moat makes none).
//
// Two nftables tables named after the bridge carry the rules: a bridge
// family table on the forward hook (pod to pod on the bridge) and an inet
// table on the forward hook for pod traffic the host routes back onto the
// bridge. The kernel lacks bridge conntrack, so the bridge table is
// stateless: for TCP it drops the opening SYN (an established flow's
// other segments pass), other protocols are dropped unless allowed.
// The rules follow pods and policies through watches: a pod's rules are
// in place moments after its address is published (a CNI has them before
// the pod starts).

// enforcePolicies reconciles the node's policy tables until ctx ends:
// on every change of a pod, policy or namespace (watches), so the rules
// of a new pod are in place as soon as its address is published.
func (n *Node) enforcePolicies(ctx context.Context) {
	cs, err := kubernetes.NewForConfig(n.Config)
	if err != nil {
		return
	}
	f := informers.NewSharedInformerFactory(cs, 0)
	changed := make(chan struct{}, 1)
	poke := cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { notify(changed) },
		UpdateFunc: func(any, any) { notify(changed) },
		DeleteFunc: func(any) { notify(changed) },
	}
	pods, pols, nss := f.Core().V1().Pods(), f.Networking().V1().NetworkPolicies(), f.Core().V1().Namespaces()
	for _, inf := range []cache.SharedIndexInformer{pods.Informer(), pols.Informer(), nss.Informer()} {
		inf.AddEventHandler(poke)
	}
	f.Start(ctx.Done())
	defer f.Shutdown()
	f.WaitForCacheSync(ctx.Done())
	var last string
	for {
		select {
		case <-ctx.Done():
			return
		case <-changed:
		case <-time.After(5 * time.Second): // retry a failed apply
		}
		pl, err1 := pols.Lister().List(labels.Everything())
		po, err2 := pods.Lister().List(labels.Everything())
		ns, err3 := nss.Lister().List(labels.Everything())
		if err1 != nil || err2 != nil || err3 != nil {
			continue
		}
		script := policyRules(n.policyTable(), n.bridge, deref(pl), deref(po), deref(ns))
		if script != last {
			if err := n.nft(script); err == nil {
				last = script
			}
		}
	}
}

func notify(c chan struct{}) {
	select {
	case c <- struct{}{}:
	default:
	}
}

func deref[T any](l []*T) []T {
	out := make([]T, len(l))
	for i, x := range l {
		out[i] = *x
	}
	return out
}

// policyTable is the name of the node's policy tables.
func (n *Node) policyTable() string { return "moat-knp-" + n.bridge }

func (n *Node) nft(script string) error {
	cmd := exec.Command("nft", "-f", "-")
	cmd.Stdin = strings.NewReader(script)
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("k8stest: nft: %v: %s", err, out)
	}
	return nil
}

// removePolicyTables deletes the node's policy tables.
func (n *Node) removePolicyTables() error {
	t := n.policyTable()
	return n.nft(fmt.Sprintf("table bridge %s {}\ndelete table bridge %s\ntable inet %s {}\ndelete table inet %s\n", t, t, t, t))
}

// policyRules renders the node's policy tables (see enforcePolicies) for
// the given policies, pods and namespaces.
func policyRules(table, bridge string, pols []networkingv1.NetworkPolicy, pods []corev1.Pod, nss []corev1.Namespace) string {
	nsLabels := map[string]labels.Set{}
	for _, ns := range nss {
		nsLabels[ns.Name] = labels.Set(ns.Labels)
	}
	type target struct {
		pod   *corev1.Pod
		rules []string // nft rule bodies, each ending in accept
	}
	targets := map[string]*target{}
	var live []*corev1.Pod
	for i := range pods {
		p := &pods[i]
		if p.Spec.HostNetwork || p.Status.PodIP == "" || p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
			continue
		}
		if a, err := netip.ParseAddr(p.Status.PodIP); err != nil || !a.Is4() {
			continue
		}
		live = append(live, p)
	}
	for _, pol := range pols {
		if !ingressPolicy(&pol) {
			continue
		}
		sel, err := metav1.LabelSelectorAsSelector(&pol.Spec.PodSelector)
		if err != nil {
			continue
		}
		for _, p := range live {
			if p.Namespace != pol.Namespace || !sel.Matches(labels.Set(p.Labels)) {
				continue
			}
			t := targets[p.Status.PodIP]
			if t == nil {
				t = &target{pod: p}
				targets[p.Status.PodIP] = t
			}
			for _, r := range pol.Spec.Ingress {
				t.rules = append(t.rules, ingressRules(&pol, r, p, live, nsLabels)...)
			}
		}
	}
	ips := make([]string, 0, len(targets))
	for ip := range targets {
		ips = append(ips, ip)
	}
	sort.Strings(ips)
	var br, in strings.Builder
	fmt.Fprintf(&br, "table bridge %s {\n  chain filter_forward {\n    type filter hook forward priority 0; policy accept;\n", table)
	fmt.Fprintf(&in, "table inet %s {\n  chain filter_forward {\n    type filter hook forward priority 0; policy accept;\n", table)
	fmt.Fprintf(&in, "    iifname %q oifname %q ct state established,related accept\n", bridge, bridge)
	var chains bytes.Buffer
	for _, ip := range ips {
		chain := "pod_" + strings.ReplaceAll(ip, ".", "_")
		fmt.Fprintf(&br, "    ip daddr %s jump %s\n", ip, chain)
		fmt.Fprintf(&in, "    iifname %q oifname %q ip daddr %s jump %s\n", bridge, bridge, ip, chain)
		fmt.Fprintf(&chains, "  chain %s {\n", chain)
		for _, r := range targets[ip].rules {
			fmt.Fprintf(&chains, "    %s\n", r)
		}
		chains.WriteString("    drop\n  }\n")
	}
	br.WriteString("  }\n")
	in.WriteString("  }\n")
	// The bridge table's chains first let a flow's later TCP segments
	// pass (it has no conntrack); the inet table's have conntrack.
	brChains := strings.ReplaceAll(chains.String(), "{\n", "{\n    tcp flags & (syn | ack) != syn accept\n")
	t := table
	return fmt.Sprintf("table bridge %s {}\ndelete table bridge %s\ntable inet %s {}\ndelete table inet %s\n", t, t, t, t) +
		br.String() + brChains + "}\n" + in.String() + chains.String() + "}\n"
}

// ingressPolicy tells whether pol restricts ingress.
func ingressPolicy(pol *networkingv1.NetworkPolicy) bool {
	if len(pol.Spec.PolicyTypes) == 0 {
		return true // ingress is implied
	}
	return slices.Contains(pol.Spec.PolicyTypes, networkingv1.PolicyTypeIngress)
}

// ingressRules renders one ingress rule of pol for the selected pod p as
// accepting nft rule bodies: each of its sources with each of its ports.
func ingressRules(pol *networkingv1.NetworkPolicy, r networkingv1.NetworkPolicyIngressRule, p *corev1.Pod, live []*corev1.Pod, nsLabels map[string]labels.Set) []string {
	var out []string
	ports := rulePorts(r, p)
	for _, s := range ruleSources(pol, r, live, nsLabels) {
		for _, pt := range ports {
			out = append(out, strings.TrimSpace(s+" "+pt)+" accept")
		}
	}
	return out
}

// ruleSources renders the peers of rule r as nft source matches ("": any
// source): an IP block as it is, a pod or namespace selector as the
// addresses of the live pods it selects (none: no match).
func ruleSources(pol *networkingv1.NetworkPolicy, r networkingv1.NetworkPolicyIngressRule, live []*corev1.Pod, nsLabels map[string]labels.Set) []string {
	var sources []string // "" = any source
	if len(r.From) == 0 {
		sources = []string{""}
	}
	for _, peer := range r.From {
		if peer.IPBlock != nil {
			s := "ip saddr " + peer.IPBlock.CIDR
			if len(peer.IPBlock.Except) > 0 {
				s += " ip saddr != { " + strings.Join(peer.IPBlock.Except, ", ") + " }"
			}
			sources = append(sources, s)
			continue
		}
		if ips := peerIPs(pol, peer, live, nsLabels); len(ips) > 0 {
			sort.Strings(ips)
			sources = append(sources, "ip saddr { "+strings.Join(ips, ", ")+" }")
		}
	}
	return sources
}

// peerIPs lists the addresses of the live pods that a selector peer of
// pol selects: its pod selector's pods in pol's namespace, or in the
// namespaces its namespace selector selects. A malformed selector
// selects nothing.
func peerIPs(pol *networkingv1.NetworkPolicy, peer networkingv1.NetworkPolicyPeer, live []*corev1.Pod, nsLabels map[string]labels.Set) []string {
	var ips []string
	podSel, nsSel := labels.Everything(), labels.Nothing()
	if peer.PodSelector != nil {
		s, err := metav1.LabelSelectorAsSelector(peer.PodSelector)
		if err != nil {
			return nil
		}
		podSel = s
	}
	if peer.NamespaceSelector != nil {
		s, err := metav1.LabelSelectorAsSelector(peer.NamespaceSelector)
		if err != nil {
			return nil
		}
		nsSel = s
	}
	for _, q := range live {
		inNS := q.Namespace == pol.Namespace && peer.NamespaceSelector == nil
		if peer.NamespaceSelector != nil {
			inNS = nsSel.Matches(nsLabels[q.Namespace])
		}
		if inNS && podSel.Matches(labels.Set(q.Labels)) {
			ips = append(ips, q.Status.PodIP)
		}
	}
	return ips
}

// rulePorts renders the ports of rule r as nft port matches ("": every
// port); a named port is the selected pod p's (a name p lacks matches
// nothing).
func rulePorts(r networkingv1.NetworkPolicyIngressRule, p *corev1.Pod) []string {
	ports := []string{""} // "" = every port
	if len(r.Ports) > 0 {
		ports = nil
	}
	for _, pp := range r.Ports {
		proto := "tcp"
		if pp.Protocol != nil {
			proto = strings.ToLower(string(*pp.Protocol))
		}
		if pp.Port == nil {
			ports = append(ports, "meta l4proto "+proto)
			continue
		}
		port := pp.Port.IntValue()
		if port == 0 { // a named port of the selected pod
			for _, c := range p.Spec.Containers {
				for _, cp := range c.Ports {
					if cp.Name == pp.Port.StrVal && strings.EqualFold(string(cp.Protocol), proto) {
						port = int(cp.ContainerPort)
					}
				}
			}
			if port == 0 {
				continue
			}
		}
		dport := strconv.Itoa(port)
		if pp.EndPort != nil {
			dport += "-" + strconv.Itoa(int(*pp.EndPort))
		}
		ports = append(ports, proto+" dport "+dport)
	}
	return ports
}

package controller

import (
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"

	sbv1 "github.com/moat-sandbox/moat/api/v1alpha1"
	"github.com/moat-sandbox/moat/internal/egress/sidecar"
)

// TestNewPodAddsEgressSidecar: a template naming an egress Secret gets
// the sidecar first, as a native sidecar with NET_ADMIN only and its
// state in a volume only it mounts; the sandbox container loses
// NET_ADMIN and NET_RAW (even if the template asked for them), and the
// pod resolves through the sidecar.
func TestNewPodAddsEgressSidecar(t *testing.T) {
	tpl := &corev1.PodTemplateSpec{Spec: corev1.PodSpec{Containers: []corev1.Container{{
		Name: "sandbox", Image: "busybox", Command: []string{"sleep", "1"},
		SecurityContext: &corev1.SecurityContext{Capabilities: &corev1.Capabilities{Add: []corev1.Capability{"NET_ADMIN", "SYS_TIME"}}},
	}}}}
	if p := newPod("ns", "p", tpl, "moat:agent", nil); len(p.Spec.InitContainers) != 1 || p.Spec.DNSPolicy != "" {
		t.Fatalf("a template without an egress Secret got a sidecar: %+v", p.Spec)
	}
	tpl.Annotations = map[string]string{sbv1.AnnoEgress: "sb-agent"}
	p := newPod("ns", "p", tpl, "moat:agent", nil)
	if len(p.Spec.InitContainers) != 2 {
		t.Fatalf("init containers %+v", p.Spec.InitContainers)
	}
	sc := p.Spec.InitContainers[0]
	if sc.Name != egressContainer || sc.Image != "moat:agent" || sc.RestartPolicy == nil || *sc.RestartPolicy != corev1.ContainerRestartPolicyAlways || sc.StartupProbe == nil {
		t.Errorf("sidecar %+v", sc)
	}
	caps := sc.SecurityContext.Capabilities
	if !slices.Equal(caps.Drop, []corev1.Capability{"ALL"}) || !slices.Equal(caps.Add, []corev1.Capability{"NET_ADMIN", "NET_BIND_SERVICE"}) {
		t.Errorf("sidecar capabilities %+v", caps)
	}
	for _, e := range sc.Env {
		if e.Value != "" || e.ValueFrom.SecretKeyRef.Name != "sb-agent" {
			t.Errorf("sidecar env %s not from the Secret: %+v", e.Name, e)
		}
	}
	if len(sc.VolumeMounts) != 1 || sc.VolumeMounts[0].MountPath != sidecar.StateDir {
		t.Errorf("sidecar mounts %+v", sc.VolumeMounts)
	}
	c := p.Spec.Containers[0]
	if c.Command[0] != agentPath {
		t.Errorf("the sandbox container lost its agent: %q", c.Command)
	}
	ccaps := c.SecurityContext.Capabilities
	if slices.Contains(ccaps.Add, "NET_ADMIN") || !slices.Contains(ccaps.Add, "SYS_TIME") ||
		!slices.Contains(ccaps.Drop, "NET_ADMIN") || !slices.Contains(ccaps.Drop, "NET_RAW") {
		t.Errorf("sandbox capabilities %+v", ccaps)
	}
	for _, m := range c.VolumeMounts {
		if m.Name == egressVolume {
			t.Error("the sandbox container mounts the sidecar's state")
		}
	}
	if p.Spec.DNSPolicy != corev1.DNSNone || !slices.Equal(p.Spec.DNSConfig.Nameservers, []string{sidecar.DNS}) ||
		p.Spec.DNSConfig.Searches[0] != "ns.svc.cluster.local" {
		t.Errorf("dns %s %+v", p.Spec.DNSPolicy, p.Spec.DNSConfig)
	}
	if p.Spec.ShareProcessNamespace == nil || *p.Spec.ShareProcessNamespace {
		t.Error("the sandbox may share the sidecar's process namespace")
	}
	again := newPod("ns", "q", &corev1.PodTemplateSpec{ObjectMeta: tpl.ObjectMeta, Spec: p.Spec}, "moat:agent", nil)
	n := 0
	for _, ic := range again.Spec.InitContainers {
		if ic.Name == egressContainer {
			n++
		}
	}
	if n != 1 {
		t.Errorf("%d egress sidecars after a second render", n)
	}
}

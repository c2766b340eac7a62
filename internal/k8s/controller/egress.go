package controller

import (
	"slices"
	"strconv"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/util/intstr"

	sbv1 "github.com/moat-sandbox/moat/api/v1alpha1"
	"github.com/moat-sandbox/moat/internal/egress/sidecar"
)

// Egress sidecar layout (see package sidecar).
const (
	egressContainer = "moat-egress"
	egressVolume    = "moat-egress-state"
	// clusterDomain completes the pod's DNS search list, which dnsPolicy
	// None no longer takes from the kubelet.
	clusterDomain = "cluster.local"
)

// addEgress adds moat's egress sidecar to p when its template names an
// egress Secret (sbv1.AnnoEgress): a restartable init container (a native
// sidecar, started and probed before the pod's containers, so nothing of
// the sandbox runs before the policy is in force) from the agent image,
// with CAP_NET_ADMIN and CAP_NET_BIND_SERVICE only. The sandbox container
// loses CAP_NET_ADMIN and CAP_NET_RAW (which could mark packets or send
// frames past the output hook), and the pod resolves through the
// sidecar's DNS proxy.
func addEgress(p *corev1.Pod, secret, image string) {
	s := &p.Spec
	if slices.ContainsFunc(s.InitContainers, func(c corev1.Container) bool { return c.Name == egressContainer }) {
		return
	}
	always := corev1.ContainerRestartPolicyAlways
	env := func(name, key string, optional bool) corev1.EnvVar {
		return corev1.EnvVar{Name: name, ValueFrom: &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{
			LocalObjectReference: corev1.LocalObjectReference{Name: secret}, Key: key, Optional: &optional,
		}}}
	}
	no, yes, root := false, true, int64(0)
	c := corev1.Container{
		Name:          egressContainer,
		Image:         image,
		Command:       []string{"/moat", "controller", "egress-sidecar"},
		RestartPolicy: &always,
		Env: []corev1.EnvVar{
			env(sidecar.EnvToken, sbv1.EgressSecretToken, false),
			env(sidecar.EnvPolicy, sbv1.EgressSecretPolicy, false),
			env(sidecar.EnvDNS, sbv1.EgressSecretDNS, true),
			env(sidecar.EnvVaultKey, sbv1.EgressSecretVaultKey, true),
		},
		Ports: []corev1.ContainerPort{{Name: "egress", ContainerPort: sidecar.Port, Protocol: corev1.ProtocolTCP}},
		StartupProbe: &corev1.Probe{
			ProbeHandler:     corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/healthz", Port: intstr.FromInt32(sidecar.Port)}},
			PeriodSeconds:    1,
			FailureThreshold: 120,
		},
		SecurityContext: &corev1.SecurityContext{
			Capabilities: &corev1.Capabilities{
				Drop: []corev1.Capability{"ALL"},
				Add:  []corev1.Capability{"NET_ADMIN", "NET_BIND_SERVICE"},
			},
			AllowPrivilegeEscalation: &no,
			ReadOnlyRootFilesystem:   &yes,
			// Root for its capabilities, whatever the pod's default user.
			RunAsUser: &root,
		},
		Resources: corev1.ResourceRequirements{
			Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("10m"), corev1.ResourceMemory: resource.MustParse("16Mi")},
			Limits:   corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("128Mi")},
		},
		VolumeMounts: []corev1.VolumeMount{{Name: egressVolume, MountPath: sidecar.StateDir}},
	}
	s.Volumes = append(s.Volumes, corev1.Volume{Name: egressVolume, VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}})
	// First: the policy holds before any other container starts.
	s.InitContainers = append([]corev1.Container{c}, s.InitContainers...)
	for i := range s.Containers {
		sc := s.Containers[i].SecurityContext
		if sc == nil {
			sc = &corev1.SecurityContext{}
			s.Containers[i].SecurityContext = sc
		}
		if sc.Capabilities == nil {
			sc.Capabilities = &corev1.Capabilities{}
		}
		sc.Capabilities.Add = slices.DeleteFunc(sc.Capabilities.Add, func(c corev1.Capability) bool {
			return c == "NET_ADMIN" || c == "NET_RAW" || c == "ALL"
		})
		sc.Capabilities.Drop = append(sc.Capabilities.Drop, "NET_ADMIN", "NET_RAW")
		sc.Privileged = &no
	}
	ndots := strconv.Itoa(5)
	s.DNSPolicy = corev1.DNSNone
	s.DNSConfig = &corev1.PodDNSConfig{
		Nameservers: []string{sidecar.DNS},
		Searches:    []string{p.Namespace + ".svc." + clusterDomain, "svc." + clusterDomain, clusterDomain},
		Options:     []corev1.PodDNSConfigOption{{Name: "ndots", Value: &ndots}},
	}
	// The host's network namespace is not the pod's to filter, and the
	// sandbox must not see the sidecar's processes (their environment
	// holds the token).
	s.HostNetwork = false
	s.ShareProcessNamespace = &no
}

package controller

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	sbv1 "github.com/moat-sandbox/moat/api/v1alpha1"
)

// Pod layout constants. The agent binary travels in an emptyDir: the init
// container (AgentImage) copies /moat into it, and the sandbox container
// (the user's image, which need not contain moat) runs it as its entrypoint.
const (
	// LabelManaged is on every pod the controller makes; the controller's
	// pod cache is restricted to it.
	LabelManaged = sbv1.Group + "/managed"

	agentVolume    = "moat-agent"
	agentDir       = "/opt/moat"
	agentPath      = agentDir + "/moat"
	initContainer  = "moat-agent"
	sandboxName    = "sandbox"
	agentPort      = 44772
	agentTokenEnv  = "EXECD_ACCESS_TOKEN"
	agentTokenKey  = "token"
	terminateGrace = 5
)

// templateHash is a short stable hash of t, stored on pool pods so a
// template change retires old pods.
func templateHash(t sbv1.SandboxTemplate, agentImage string) string {
	b, _ := json.Marshal(struct {
		T sbv1.SandboxTemplate
		A string
	}{t, agentImage})
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:5])
}

// randomSuffix returns n random lowercase hex characters.
func randomSuffix(n int) string {
	b := make([]byte, (n+1)/2)
	rand.Read(b)
	return hex.EncodeToString(b)[:n]
}

// podName joins base and suffix into a valid pod name (<= 63 characters,
// so it also works as a hostname).
func podName(base, suffix string) string {
	if max := 62 - len(suffix); len(base) > max {
		// Keep names of long bases distinct: cut and add a hash of the whole.
		sum := sha256.Sum256([]byte(base))
		base = base[:max-9] + "-" + hex.EncodeToString(sum[:4])
	}
	return base + "-" + suffix
}

// newPod renders t as a sandbox pod. extraEnv (a claim's patch) overrides
// t.Env; labels and annotations are added to the pod's.
func newPod(ns, name string, t sbv1.SandboxTemplate, agentImage string, extraEnv, labels, annotations map[string]string) *corev1.Pod {
	env := maps.Clone(t.Env)
	if env == nil {
		env = map[string]string{}
	}
	maps.Copy(env, extraEnv)
	var envVars []corev1.EnvVar
	for _, k := range slices.Sorted(maps.Keys(env)) {
		envVars = append(envVars, corev1.EnvVar{Name: k, Value: env[k]})
	}
	if t.AgentTokenSecret != "" {
		envVars = append(envVars, corev1.EnvVar{Name: agentTokenEnv, ValueFrom: &corev1.EnvVarSource{
			SecretKeyRef: &corev1.SecretKeySelector{
				LocalObjectReference: corev1.LocalObjectReference{Name: t.AgentTokenSecret},
				Key:                  agentTokenKey,
			},
		}})
	}
	if t.AgentImage != "" {
		agentImage = t.AgentImage
	}
	cmd := []string{agentPath, "execd", "--port", strconv.Itoa(agentPort)}
	if len(t.Entrypoint) > 0 {
		cmd = append(append(cmd, "--"), t.Entrypoint...)
	}
	mount := []corev1.VolumeMount{{Name: agentVolume, MountPath: agentDir}}
	grace := int64(terminateGrace)
	noToken := false
	pl := map[string]string{}
	maps.Copy(pl, t.Labels)
	maps.Copy(pl, labels)
	pl[LabelManaged] = "true"
	pa := map[string]string{}
	maps.Copy(pa, t.Annotations)
	maps.Copy(pa, annotations)
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: pl, Annotations: pa},
		Spec: corev1.PodSpec{
			RestartPolicy:                 corev1.RestartPolicyNever,
			TerminationGracePeriodSeconds: &grace,
			AutomountServiceAccountToken:  &noToken,
			EnableServiceLinks:            &noToken,
			NodeSelector:                  t.NodeSelector,
			Tolerations:                   t.Tolerations,
			Volumes: []corev1.Volume{{Name: agentVolume, VolumeSource: corev1.VolumeSource{
				EmptyDir: &corev1.EmptyDirVolumeSource{},
			}}},
			InitContainers: []corev1.Container{{
				Name:         initContainer,
				Image:        agentImage,
				Command:      []string{"/moat", "controller", "copy-agent", agentPath},
				VolumeMounts: mount,
			}},
			Containers: []corev1.Container{{
				Name:         sandboxName,
				Image:        t.Image,
				Command:      cmd,
				Env:          envVars,
				WorkingDir:   t.WorkingDir,
				Resources:    t.Resources,
				VolumeMounts: mount,
				Ports:        []corev1.ContainerPort{{Name: "agent", ContainerPort: agentPort, Protocol: corev1.ProtocolTCP}},
			}},
		},
	}
	if t.RuntimeClassName != "" {
		rc := t.RuntimeClassName
		p.Spec.RuntimeClassName = &rc
	}
	return p
}

// podReady: running with an address (the agent may still be starting; the
// caller pings it).
func podReady(p *corev1.Pod) bool {
	return p.DeletionTimestamp == nil && p.Status.Phase == corev1.PodRunning && p.Status.PodIP != ""
}

// podDone: the pod can no longer serve (finished or being deleted).
func podDone(p *corev1.Pod) bool {
	return p.DeletionTimestamp != nil || p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed
}

// coldPodName is the deterministic name of claim i's cold pod in the
// batch incarnation uid, so that a create repeated after a controller
// restart finds the pod it made before, while a batch re-created under the
// same name never meets the terminating pods of its predecessor.
func coldPodName(batch string, uid types.UID, i int32) string {
	u := strings.ReplaceAll(string(uid), "-", "")
	if len(u) > 6 {
		u = u[:6]
	}
	return podName(batch, fmt.Sprintf("%s-%d", u, i))
}

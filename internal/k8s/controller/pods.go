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
	"k8s.io/apimachinery/pkg/util/strategicpatch"

	sbv1 "github.com/moat-sandbox/moat/api/v1alpha1"
	"github.com/moat-sandbox/moat/internal/agentproto"
)

// Pod layout. The agent binary travels in an emptyDir: the init container
// (the agent image) copies it there, and the sandbox container (the user's
// image, which need not contain moat) runs it as its entrypoint, with the
// container's own command as its child. The init container runs `moat
// controller copy-agent`, which writes the agent moat carries; the command
// keeps the "execd" verb, which the lean agent accepts, so that an agent
// image of an older moat (which copies the whole moat) still works.
const (
	agentVolume    = "moat-agent"
	agentDir       = "/opt/moat"
	agentPath      = agentDir + "/moat-agent"
	initContainer  = "moat-agent"
	agentPort      = agentproto.Port
	terminateGrace = 5
)

// AgentPort is the port of moat's agent in a sandbox pod.
const AgentPort = agentPort

// templateError is a template the controller cannot turn into a pod; it
// becomes a status condition (never a crash loop).
type templateError struct{ msg string }

func (e *templateError) Error() string { return e.msg }

// checkTemplate reports why t cannot make a sandbox pod.
func checkTemplate(t *corev1.PodTemplateSpec) error {
	if t == nil {
		return &templateError{"no pod template"}
	}
	if len(t.Spec.Containers) == 0 {
		return &templateError{"the pod template has no containers"}
	}
	for _, c := range t.Spec.Containers {
		if strings.TrimSpace(c.Image) == "" {
			return &templateError{fmt.Sprintf("container %q of the pod template has no image", c.Name)}
		}
	}
	return nil
}

// templateHash is a short stable hash of a pool's template, stored on its
// pods (LabelPoolRevision) so a template change retires old pods.
func templateHash(t *corev1.PodTemplateSpec, agentImage string) string {
	b, _ := json.Marshal(struct {
		T *corev1.PodTemplateSpec
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

// coldPodName names claim i's pod in the batch incarnation uid. The first
// pod of a claim has a deterministic name (a create repeated after a
// restart finds the pod it made before; the name is in the record before
// the create anyway); a replacement of a deleted pod gets a random tail.
// The uid part keeps a batch re-created under the same name from meeting
// the terminating pods of its predecessor.
func coldPodName(batch string, uid types.UID, i int, replacement bool) string {
	u := strings.ReplaceAll(string(uid), "-", "")
	if len(u) > 6 {
		u = u[:6]
	}
	s := fmt.Sprintf("%s-%d", u, i)
	if replacement {
		s += "-" + randomSuffix(4)
	}
	return podName(batch, s)
}

// applyShardPatch applies a strategic merge patch to a pod template.
func applyShardPatch(t *corev1.PodTemplateSpec, patch []byte) (*corev1.PodTemplateSpec, error) {
	if len(patch) == 0 || string(patch) == "null" || string(patch) == "{}" {
		return t, nil
	}
	orig, err := json.Marshal(t)
	if err != nil {
		return nil, err
	}
	out, err := strategicpatch.StrategicMergePatch(orig, patch, corev1.PodTemplateSpec{})
	if err != nil {
		return nil, &templateError{fmt.Sprintf("shard patch: %v", err)}
	}
	var res corev1.PodTemplateSpec
	if err := json.Unmarshal(out, &res); err != nil {
		return nil, &templateError{fmt.Sprintf("shard patch: %v", err)}
	}
	return &res, checkTemplate(&res)
}

// wantsAgent reports whether the controller adds its agent to pods of t.
func wantsAgent(t *corev1.PodTemplateSpec) bool {
	if t.Annotations[sbv1.AnnoAgent] == "false" {
		return false
	}
	for _, c := range t.Spec.InitContainers {
		if c.Name == initContainer {
			return false // already carries it
		}
	}
	return true
}

// newPod renders t as a sandbox pod named name, with the controller's
// labels added. Unless the template opts out (AnnoAgent "false"), the
// first container runs moat's agent (copied from agentImage by an init
// container), which starts the container's command and args, if any, as
// its child. A container without a command runs the agent alone: the
// controller cannot know the image's entrypoint.
func newPod(ns, name string, t *corev1.PodTemplateSpec, agentImage string, labels map[string]string) *corev1.Pod {
	t = t.DeepCopy()
	pl := map[string]string{}
	maps.Copy(pl, t.Labels)
	maps.Copy(pl, labels)
	pl[sbv1.LabelManaged] = sbv1.ManagedBy
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: pl, Annotations: t.Annotations},
		Spec:       t.Spec,
	}
	s := &p.Spec
	if s.RestartPolicy == "" {
		// A sandbox whose agent exits is over; the record says so.
		s.RestartPolicy = corev1.RestartPolicyNever
	}
	if s.TerminationGracePeriodSeconds == nil {
		g := int64(terminateGrace)
		s.TerminationGracePeriodSeconds = &g
	}
	if s.AutomountServiceAccountToken == nil {
		// Sandboxes run untrusted code: no API credentials unless asked.
		no := false
		s.AutomountServiceAccountToken = &no
	}
	if s.EnableServiceLinks == nil {
		no := false
		s.EnableServiceLinks = &no
	}
	if !wantsAgent(t) {
		return p
	}
	if img := t.Annotations[sbv1.AnnoAgentImage]; img != "" {
		agentImage = img
	}
	mount := corev1.VolumeMount{Name: agentVolume, MountPath: agentDir, ReadOnly: true}
	s.Volumes = append(s.Volumes, corev1.Volume{Name: agentVolume, VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}})
	s.InitContainers = append([]corev1.Container{{
		Name:         initContainer,
		Image:        agentImage,
		Command:      []string{"/moat", "controller", "copy-agent", agentPath},
		VolumeMounts: []corev1.VolumeMount{{Name: agentVolume, MountPath: agentDir}},
	}}, s.InitContainers...)
	c := &s.Containers[0]
	child := slices.Concat(c.Command, c.Args)
	cmd := []string{agentPath, "execd", "--port", strconv.Itoa(agentPort)}
	if len(child) > 0 {
		cmd = append(append(cmd, "--"), child...)
	}
	c.Command, c.Args = cmd, nil
	c.VolumeMounts = append(c.VolumeMounts, mount)
	if !slices.ContainsFunc(c.Ports, func(p corev1.ContainerPort) bool { return p.ContainerPort == agentPort }) {
		c.Ports = append(c.Ports, corev1.ContainerPort{Name: "execd", ContainerPort: agentPort, Protocol: corev1.ProtocolTCP})
	}
	if sec := t.Annotations[sbv1.AnnoEgress]; sec != "" {
		addEgress(p, sec, agentImage)
	}
	return p
}

// podReady: running with an address (the agent may still be starting; the
// caller pings it).
func podReady(p *corev1.Pod) bool {
	return p.DeletionTimestamp == nil && p.Status.Phase == corev1.PodRunning && p.Status.PodIP != ""
}

// podEnded: the pod's containers finished; it will never serve again.
func podEnded(p *corev1.Pod) bool {
	return p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed
}

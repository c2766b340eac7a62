package controller

import (
	"context"
	"fmt"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// How a sandbox pod ended, for the batch's PodFailed condition (and the
// kubernetes runtime's Status message).
//
// A pod the kubelet evicts for exceeding its ephemeral-storage limit (the
// sandbox's disk quota) often ends as if it had finished: the agent exits
// 0 on the SIGTERM, the pod turns Succeeded, without the Evicted reason or
// a DisruptionTarget condition (kubernetes/kubernetes#120182, #141483).
// Only the kubelet's Warning event "Evicted" tells, so for a pod whose own
// status says nothing the controller reads its events, once per pod.

// +kubebuilder:rbac:groups="",resources=events,verbs=list

// endEventWait is how long after a pod ended its events are still looked
// for (the kubelet sends them asynchronously).
const endEventWait = 10 * time.Second

// podEndReason says how an ended pod ended from its own status: the
// kubelet's reason and message, a DisruptionTarget condition, else the
// sandbox container's exit.
func podEndReason(p *corev1.Pod) string {
	if p.Status.Reason != "" || p.Status.Message != "" {
		return strings.TrimSpace(fmt.Sprintf("pod %s: %s: %s", p.Name, p.Status.Reason, p.Status.Message))
	}
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.DisruptionTarget && c.Status == corev1.ConditionTrue {
			return strings.TrimSpace(fmt.Sprintf("pod %s: %s: %s", p.Name, c.Reason, c.Message))
		}
	}
	for _, c := range p.Status.ContainerStatuses {
		if t := c.State.Terminated; t != nil {
			return fmt.Sprintf("pod %s %s: container %s exited with code %d (%s)", p.Name, strings.ToLower(string(p.Status.Phase)), c.Name, t.ExitCode, t.Reason)
		}
	}
	return ""
}

// endReason is how p ended: what its events told (findEnds), else its
// status.
func (r *batchReconciler) endReason(p *corev1.Pod) string {
	r.mu.Lock()
	why := r.ends[p.UID]
	r.mu.Unlock()
	if why != "" {
		return why
	}
	return podEndReason(p)
}

// findEnds looks up the eviction events of the pods of rec that ended
// without a reason in their status. It reports whether to look again
// (a pod ended a moment ago without an event yet).
func (r *batchReconciler) findEnds(ctx context.Context, rec record, pods map[string]*corev1.Pod) (again bool) {
	for _, c := range rec.Claims {
		p := pods[c.Pod]
		if c.Pod == "" || p == nil || !podEnded(p) || p.Status.Reason != "" {
			continue
		}
		r.mu.Lock()
		_, known := r.ends[p.UID]
		r.mu.Unlock()
		if known {
			continue
		}
		var evs corev1.EventList
		if err := r.api.List(ctx, &evs, client.InNamespace(p.Namespace), client.MatchingFields{"involvedObject.uid": string(p.UID)}); err != nil {
			return true
		}
		why := ""
		for _, e := range evs.Items {
			if e.Type == corev1.EventTypeWarning && e.Reason == "Evicted" {
				why = strings.TrimSpace(fmt.Sprintf("pod %s: Evicted: %s", p.Name, e.Message))
			}
		}
		if why == "" && time.Since(podEndTime(p)) < endEventWait {
			again = true
			continue
		}
		r.mu.Lock()
		if r.ends == nil || len(r.ends) > 10000 {
			r.ends = map[types.UID]string{}
		}
		r.ends[p.UID] = why // "" too: looked, nothing to add
		r.mu.Unlock()
	}
	return again
}

// podEndTime is when the last container of an ended pod stopped.
func podEndTime(p *corev1.Pod) time.Time {
	var t time.Time
	for _, c := range p.Status.ContainerStatuses {
		if s := c.State.Terminated; s != nil && s.FinishedAt.After(t) {
			t = s.FinishedAt.Time
		}
	}
	return t
}

// Package podfreeze is the protocol between the writers of a sandbox pod's
// pause state (`moat controller`, for a BatchSandbox's spec.pause) and
// `moat node` (internal/k8s/node), which freezes and thaws the pod's
// containers on its node: the wish is a pod annotation, the answer a pod
// condition. No network endpoint is involved: both sides talk only to the
// API server, so the sandbox has nothing to reach.
//
// A wish carries a request token (the batch's generation) that the answer
// repeats, so a writer never takes an answer to an older wish for one to
// the current one. The node writes its answer guarded by the
// resourceVersion of the pod it acted on: an answer is always about the
// wish the pod held then.
package podfreeze

import (
	"strings"

	corev1 "k8s.io/api/core/v1"

	sbv1 "github.com/moat-sandbox/moat/api/v1alpha1"
)

const (
	// AnnoWant is the wish: "paused@<token>" or "running@<token>". A pod
	// without it was never asked and is left alone.
	AnnoWant = "moat." + sbv1.Group + "/freeze"
	// ConditionFrozen is the node's answer: Status True when every
	// container of the pod is frozen, False when none is; Reason is one
	// of the Reason constants; Message is the token of the wish it
	// answers, then ": " and the error for ReasonFailed.
	ConditionFrozen corev1.PodConditionType = "moat." + sbv1.Group + "/frozen"
)

// Answer reasons.
const (
	ReasonFrozen  = "Frozen"
	ReasonRunning = "Running"
	ReasonFailed  = "Failed"
)

const (
	paused  = "paused"
	running = "running"
)

// Want is a wish for a pod's pause state.
type Want struct {
	// Paused: the pod's containers are to be frozen; else thawed.
	Paused bool
	// Token identifies the request; the answer repeats it.
	Token string
}

// String is the annotation value of w.
func (w Want) String() string {
	if w.Paused {
		return paused + "@" + w.Token
	}
	return running + "@" + w.Token
}

// WantOf reads pod's wish; ok is false when it has none (or a malformed
// one, which is ignored as none).
func WantOf(pod *corev1.Pod) (w Want, ok bool) {
	v, ok := pod.Annotations[AnnoWant]
	if !ok {
		return Want{}, false
	}
	state, token, found := strings.Cut(v, "@")
	switch {
	case !found:
		return Want{}, false
	case state == paused:
		return Want{Paused: true, Token: token}, true
	case state == running:
		return Want{Token: token}, true
	}
	return Want{}, false
}

// Answer is what the node reported of a pod.
type Answer struct {
	// Known: the pod has an answer at all.
	Known bool
	// Frozen: its containers are frozen.
	Frozen bool
	// Token is the token of the wish answered.
	Token string
	// Err is why the node could not do the wish ("" if it could).
	Err string
}

// AnswerOf reads the node's answer on pod.
func AnswerOf(pod *corev1.Pod) Answer {
	for _, c := range pod.Status.Conditions {
		if c.Type != ConditionFrozen {
			continue
		}
		a := Answer{Known: true, Frozen: c.Status == corev1.ConditionTrue}
		a.Token, a.Err, _ = strings.Cut(c.Message, ": ")
		if c.Reason == ReasonFailed && a.Err == "" {
			a.Err = "failed"
		}
		return a
	}
	return Answer{}
}

// Condition is the node's answer to w for a pod whose containers are
// (frozen) or are not frozen, err the failure if the wish could not be
// done.
func Condition(w Want, frozen bool, err error) corev1.PodCondition {
	c := corev1.PodCondition{Type: ConditionFrozen, Status: corev1.ConditionFalse, Reason: ReasonRunning, Message: w.Token}
	if frozen {
		c.Status, c.Reason = corev1.ConditionTrue, ReasonFrozen
	}
	if err != nil {
		c.Reason, c.Message = ReasonFailed, w.Token+": "+err.Error()
	}
	return c
}

// Progress is how far a pod is with its wish.
type Progress int

// Progress values.
const (
	// Pending: the node has not answered the wish yet.
	Pending Progress = iota
	// Done: the pod is in the wished state (or was never asked).
	Done
	// Failed: the node answered that it could not do the wish.
	Failed
)

// ProgressOf tells how far pod is with the wish w: done once the node's
// answer to w says the state w asks for. A thaw is also done when the
// pod was never frozen (no answer, or one to an older wish that left it
// running): there is nothing to thaw.
func ProgressOf(pod *corev1.Pod, w Want) (Progress, string) {
	a := AnswerOf(pod)
	if a.Token == w.Token && a.Known {
		switch {
		case a.Err != "":
			return Failed, a.Err
		case a.Frozen == w.Paused:
			return Done, ""
		}
		return Pending, ""
	}
	if !w.Paused && !a.Frozen {
		return Done, ""
	}
	return Pending, ""
}

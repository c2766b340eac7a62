package controller

import (
	"context"
	"fmt"
	"strconv"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	sbv1 "github.com/moat-sandbox/moat/api/v1alpha1"
	"github.com/moat-sandbox/moat/internal/k8s/podfreeze"
)

// Pause (spec.pause) freezes a batch's sandbox pods where they run, memory
// and pod kept: the controller writes each pod's wish (podfreeze) and
// `moat node` on the pod's node freezes its containers and answers. The
// wish's token is the batch's generation, so status.pauseObservedGeneration
// says which spec.pause the status answers. A pause the nodes do not
// confirm within Options.PauseTimeout is undone (the pods' wish goes back
// to running): the batch ends PauseFailed and running, never half-paused.

// Reasons of the pause conditions.
const (
	reasonPaused      = "Paused"
	reasonResumed     = "Resumed"
	reasonPausing     = "Pausing"
	reasonResuming    = "Resuming"
	reasonNodeTimeout = "NodeTimeout"
	reasonNodeFailed  = "NodeFailed"
)

// defaultPauseTimeout is Options.PauseTimeout's default.
const defaultPauseTimeout = 10 * time.Second

// pausePlan is what the pause part of a reconcile decided.
type pausePlan struct {
	// want is the wish for the batch's pods (nil: leave them alone).
	want *podfreeze.Want
	// requeue is when to look again (0: on the next event).
	requeue time.Duration
	// failed is a failure to report as an event.
	failed string
}

// planPause computes the pause part of a batch's status st (phase and
// the Paused, Progressing, PauseFailed and ResumeFailed conditions) from
// its spec and its active pods' answers, and the wish their pods are to
// carry. Pure: the caller writes the wishes and the status.
func planPause(b *sbv1.BatchSandbox, st *sbv1.BatchSandboxStatus, pods []*corev1.Pod, now metav1.Time, budget time.Duration) pausePlan {
	if b.Spec.Pause == nil {
		// Nothing asked (OpenSandbox's "no-op / retry bridge"): the pods
		// stay as they are.
		return pausePlan{}
	}
	gen := b.Generation
	answered := st.PauseObservedGeneration == gen
	pauseFailed := answered && conditionTrue(st, sbv1.ConditionPauseFailed)
	resumeFailed := answered && conditionTrue(st, sbv1.ConditionResumeFailed)
	// A pause that failed is undone: its pods are asked to run again.
	w := podfreeze.Want{Paused: *b.Spec.Pause && !pauseFailed, Token: strconv.FormatInt(gen, 10)}
	plan := pausePlan{want: &w}

	done, why := len(pods) > 0 || !w.Paused, ""
	for _, p := range pods {
		switch prog, msg := podfreeze.ProgressOf(p, w); prog {
		case podfreeze.Failed:
			if why == "" {
				why = fmt.Sprintf("pod %s: %s", p.Name, msg)
			}
			done = false
		case podfreeze.Pending:
			done = false
		}
	}
	if done {
		removeCondition(st, sbv1.ConditionProgressing)
		st.PauseObservedGeneration = gen
		if w.Paused {
			st.Phase = sbv1.PhasePaused
			setCondition(st, sbv1.ConditionPaused, true, reasonPaused, fmt.Sprintf("%d sandboxes frozen", len(pods)), now)
			removeCondition(st, sbv1.ConditionPauseFailed)
			removeCondition(st, sbv1.ConditionResumeFailed)
		} else {
			if _, ok := st.Condition(sbv1.ConditionPaused); ok {
				setCondition(st, sbv1.ConditionPaused, false, reasonResumed, "sandboxes running", now)
			}
			removeCondition(st, sbv1.ConditionResumeFailed)
		}
		return plan
	}
	if resumeFailed {
		// Already answered: the pods stay asked to run and are thawed
		// when their node can; until then the batch is paused.
		st.Phase = sbv1.PhasePaused
		plan.requeue = budget
		return plan
	}

	verb, phase := reasonResuming, sbv1.PhaseResuming
	if w.Paused {
		verb, phase = reasonPausing, sbv1.PhasePausing
	}
	msg := fmt.Sprintf("%s the sandboxes of generation %d", verb, gen)
	if c, ok := st.Condition(sbv1.ConditionProgressing); !ok || c.Status != "True" || c.Message != msg {
		// A new attempt: its budget starts now.
		removeCondition(st, sbv1.ConditionProgressing)
	}
	setCondition(st, sbv1.ConditionProgressing, true, verb, msg, now)
	c, _ := st.Condition(sbv1.ConditionProgressing)
	// The API keeps the condition's time to the second, rounded down:
	// the budget counts from the second after.
	deadline := now.Add(budget)
	if c.LastTransitionTime != nil {
		deadline = c.LastTransitionTime.Truncate(time.Second).Add(budget + time.Second)
	}
	if st.Phase != sbv1.PhaseFailed {
		st.Phase = phase
	}
	if why == "" && now.Time.Before(deadline) {
		plan.requeue = deadline.Sub(now.Time)
		return plan
	}
	reason := reasonNodeFailed
	if why == "" {
		reason = reasonNodeTimeout
		why = fmt.Sprintf("no node confirmed the %s within %v (is moat node running on the pods' nodes?)", map[bool]string{true: "pause", false: "resume"}[w.Paused], budget)
		if len(pods) == 0 {
			why = "the batch has no running sandbox pod to pause"
		}
	}
	removeCondition(st, sbv1.ConditionProgressing)
	st.PauseObservedGeneration = gen
	plan.failed = why
	if w.Paused {
		setCondition(st, sbv1.ConditionPauseFailed, true, reason, why, now)
		if st.Phase == sbv1.PhasePausing {
			st.Phase = sbv1.PhaseSucceed
		}
		// Undo: the pods that froze meanwhile are thawed.
		w.Paused = false
	} else {
		setCondition(st, sbv1.ConditionResumeFailed, true, reason, why, now)
		st.Phase = sbv1.PhasePaused
		plan.requeue = budget
	}
	return plan
}

// activePods are the pods of the batch's live claims (the ones a pause
// freezes), in claim order.
func activePods(rec record, pods map[string]*corev1.Pod) []*corev1.Pod {
	var out []*corev1.Pod
	for _, c := range rec.Claims {
		if p := pods[c.Pod]; c.Pod != "" && !c.Done && p != nil && p.DeletionTimestamp == nil {
			out = append(out, p)
		}
	}
	return out
}

// writeWishes puts w on each pod that lacks it: a pause on all of them, a
// resume only on those that were asked something before (a pod never
// asked runs: no write for it).
func (r *batchReconciler) writeWishes(ctx context.Context, pods []*corev1.Pod, w podfreeze.Want) error {
	for _, p := range pods {
		cur, asked := podfreeze.WantOf(p)
		if cur == w || (!w.Paused && !asked) {
			continue
		}
		patch := fmt.Sprintf(`{"metadata":{"annotations":{%q:%q}}}`, podfreeze.AnnoWant, w.String())
		if err := r.c.Patch(ctx, p, client.RawPatch(types.MergePatchType, []byte(patch))); client.IgnoreNotFound(err) != nil {
			return fmt.Errorf("pod %s: write pause wish: %w", p.Name, err)
		}
	}
	return nil
}

func conditionTrue(st *sbv1.BatchSandboxStatus, t sbv1.BatchSandboxConditionType) bool {
	c, ok := st.Condition(t)
	return ok && c.Status == "True"
}

// eventPauseFailed is the reason of the event a failed spec.pause of b
// records.
func eventPauseFailed(b *sbv1.BatchSandbox) string {
	if b.Spec.Pause != nil && *b.Spec.Pause {
		return string(sbv1.ConditionPauseFailed)
	}
	return string(sbv1.ConditionResumeFailed)
}

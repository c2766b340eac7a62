package podfreeze_test

import (
	"errors"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/moat-sandbox/moat/internal/k8s/podfreeze"
)

func pod(wish string, answer *corev1.PodCondition) *corev1.Pod {
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Annotations: map[string]string{}}}
	if wish != "" {
		p.Annotations[podfreeze.AnnoWant] = wish
	}
	p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}
	if answer != nil {
		p.Status.Conditions = append(p.Status.Conditions, *answer)
	}
	return p
}

func TestWantRoundTrip(t *testing.T) {
	for i, w := range []podfreeze.Want{{Paused: true, Token: "7"}, {Token: "8"}} {
		got, ok := podfreeze.WantOf(pod(w.String(), nil))
		if !ok || got != w {
			t.Errorf("%d: WantOf(%q) = %+v %v", i, w.String(), got, ok)
		}
	}
	for i, bad := range []string{"", "paused", "frozen@3"} {
		p := pod("", nil)
		if bad != "" {
			p.Annotations[podfreeze.AnnoWant] = bad
		}
		if w, ok := podfreeze.WantOf(p); ok {
			t.Errorf("%d: WantOf(%q) = %+v, want none", i, bad, w)
		}
	}
}

func TestProgress(t *testing.T) {
	pause7 := podfreeze.Want{Paused: true, Token: "7"}
	run8 := podfreeze.Want{Token: "8"}
	frozen7 := podfreeze.Condition(pause7, true, nil)
	running7 := podfreeze.Condition(pause7, false, nil)
	failed7 := podfreeze.Condition(pause7, false, errors.New("shim: no"))
	running8 := podfreeze.Condition(run8, false, nil)
	for i, c := range []struct {
		answer *corev1.PodCondition
		want   podfreeze.Want
		prog   podfreeze.Progress
		msg    string
	}{
		{nil, pause7, podfreeze.Pending, ""},             // no answer yet
		{&frozen7, pause7, podfreeze.Done, ""},           // frozen as asked
		{&running7, pause7, podfreeze.Pending, ""},       // answered, not frozen: not done
		{&failed7, pause7, podfreeze.Failed, "shim: no"}, // the node says why
		{&running8, pause7, podfreeze.Pending, ""},       // an answer to another wish
		{nil, run8, podfreeze.Done, ""},                  // never frozen: nothing to thaw
		{&frozen7, run8, podfreeze.Pending, ""},          // still frozen from the older wish
		{&running7, run8, podfreeze.Done, ""},            // running after an older wish
		{&running8, run8, podfreeze.Done, ""},            // thawed as asked
		{&failed7, podfreeze.Want{Token: "7"}, podfreeze.Failed, "shim: no"},
	} {
		prog, msg := podfreeze.ProgressOf(pod(c.want.String(), c.answer), c.want)
		if prog != c.prog || msg != c.msg {
			t.Errorf("%d: ProgressOf = %v %q, want %v %q", i, prog, msg, c.prog, c.msg)
		}
	}
	if a := podfreeze.AnswerOf(pod("", &frozen7)); !a.Known || !a.Frozen || a.Token != "7" || a.Err != "" {
		t.Errorf("AnswerOf(frozen) = %+v", a)
	}
	if a := podfreeze.AnswerOf(pod("", nil)); a.Known {
		t.Errorf("AnswerOf(none) = %+v", a)
	}
}

package kubernetes

import (
	"context"
	"fmt"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	sbv1 "github.com/moat-sandbox/moat/api/v1alpha1"
	"github.com/moat-sandbox/moat/internal/errdefs"
	"github.com/moat-sandbox/moat/internal/runtime"
)

var _ runtime.Pauser = (*Runtime)(nil)

// Pause implements runtime.Pauser: spec.pause=true on the sandbox's
// BatchSandbox, as OpenSandbox's server asks (OSEP-0008); the controller
// has moat node freeze the pod's containers where they run (memory and
// pod kept) and answers in the batch's status. A pause not confirmed
// within PauseTimeout is taken back (spec.pause=false): the sandbox stays
// running and the error says why.
func (r *Runtime) Pause(ctx context.Context, id string) error { return r.freeze(ctx, id, true) }

// Resume implements runtime.Pauser: spec.pause=false, answered once the
// pod's containers run again. A resume not confirmed stays asked for (the
// node thaws the pod when it can); the sandbox is paused until then.
func (r *Runtime) Resume(ctx context.Context, id string) error { return r.freeze(ctx, id, false) }

func (r *Runtime) freeze(ctx context.Context, id string, pause bool) error {
	verb := map[bool]string{true: "pause", false: "resume"}[pause]
	if _, _, _, ok, err := r.claimed(ctx, id, true); err != nil {
		return err
	} else if ok {
		return errdefs.Newf(errdefs.ErrNotImplemented, "a sandbox claimed from a pool cannot be %sd on the kubernetes runtime", verb)
	}
	b, err := r.get(ctx, id)
	if err != nil {
		return err
	}
	from, want := runtime.StateRunning, runtime.StatePaused
	if !pause {
		from, want = want, from
	}
	if st := status(b); st.State != from {
		return fmt.Errorf("sandbox %s is %s, not %s: %w", id, st.State, from, errdefs.ErrFailedPrecondition)
	}
	gen, err := r.setPause(ctx, b, pause)
	if err != nil {
		return err
	}
	ferr := r.waitPause(ctx, b.Namespace, id, gen, pause, want)
	if ferr != nil && pause {
		// Taken back: the controller undoes what the nodes did.
		if _, err := r.setPause(context.WithoutCancel(ctx), b, false); err != nil {
			return fmt.Errorf("%w (and taking the pause back failed: %v)", ferr, err)
		}
	}
	return ferr
}

// setPause writes spec.pause and returns the batch's generation after it.
func (r *Runtime) setPause(ctx context.Context, b *sbv1.BatchSandbox, pause bool) (int64, error) {
	patch := client.RawPatch(types.MergePatchType, fmt.Appendf(nil, `{"spec":{"pause":%t}}`, pause))
	if err := r.c.Patch(ctx, b, patch); err != nil {
		return 0, classify("pause sandbox "+b.Name, err)
	}
	return b.Generation, nil
}

// waitPause waits (through the informer, up to PauseTimeout) until the
// controller has answered generation gen of the batch: the sandbox is in
// state want, or the pause or resume failed.
func (r *Runtime) waitPause(ctx context.Context, ns, id string, gen int64, pause bool, want runtime.State) error {
	ctx, cancel := context.WithTimeout(ctx, r.cfg.PauseTimeout)
	defer cancel()
	verb, failed := "resume", sbv1.ConditionResumeFailed
	if pause {
		verb, failed = "pause", sbv1.ConditionPauseFailed
	}
	key := types.NamespacedName{Namespace: ns, Name: id}
	for {
		var b sbv1.BatchSandbox
		if err := r.cache.Get(ctx, key, &b); err == nil && b.Status.PauseObservedGeneration >= gen {
			if c, ok := b.Condition(failed); ok && c.Status == "True" && b.Status.PauseObservedGeneration == gen {
				return errdefs.Newf(errdefs.ErrUnavailable, "the %s of sandbox %s failed: %s", verb, id, c.Message)
			}
			if status(&b).State == want {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return errdefs.Newf(errdefs.ErrUnavailable, "the %s of sandbox %s was not confirmed within %v: is moat controller running?", verb, id, r.cfg.PauseTimeout)
		case <-time.After(5 * time.Millisecond):
		}
	}
}

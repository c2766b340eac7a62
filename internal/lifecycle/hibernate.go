package lifecycle

import (
	"context"
	"fmt"

	"github.com/moat-sandbox/moat/internal/errdefs"
	"github.com/moat-sandbox/moat/internal/runtime"
)

// Hibernation: a Running sandbox is Paused with its processes stopped and
// their memory freed (runtime.Hibernator); Resume wakes it.

// Hibernator is the runtime's Hibernator if it can hibernate sandboxes
// of class, else nil.
func Hibernator(rt runtime.Runtime, class string) runtime.Hibernator {
	h, ok := rt.(runtime.Hibernator)
	if !ok || h.HibernateMode(class) == "" {
		return nil
	}
	return h
}

// Hibernate hibernates a Running sandbox (the API's pause with mode
// hibernate); its Paused status has reason ReasonHibernated. It returns
// once the memory is freed.
func (s *Service) Hibernate(ctx context.Context, id string) error {
	e, err := s.get(ctx, id)
	if err != nil {
		return err
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	_, err = e.hibernate(ctx, ReasonHibernated, "")
	return err
}

// Hibernate hibernates Running sandbox e; its Paused status carries
// reason and msg (why), followed by what the runtime did. The caller
// holds e's lock.
func (e *Entry) Hibernate(ctx context.Context, reason, msg string) (runtime.Hibernation, error) {
	return e.hibernate(ctx, reason, msg)
}

func (e *Entry) hibernate(ctx context.Context, reason, msg string) (runtime.Hibernation, error) {
	h := Hibernator(e.svc.deps.Runtime, e.sb.Class)
	if h == nil {
		class := e.sb.Class
		if class == "" {
			class = e.svc.deps.Runtime.Name()
		}
		return runtime.Hibernation{}, errdefs.WithPublic(errdefs.ErrNotImplemented, "SANDBOX::API_NOT_SUPPORTED",
			fmt.Sprintf("runtime %s cannot hibernate sandboxes", class))
	}
	prev := e.sb.Status
	if err := e.transition(StatePausing, "", ""); err != nil {
		return runtime.Hibernation{}, err
	}
	hb, err := h.Hibernate(context.WithoutCancel(ctx), e.sb.ID)
	if err != nil {
		e.revert(prev)
		return runtime.Hibernation{}, fmt.Errorf("hibernate %s: %w", e.sb.ID, err)
	}
	if what := HibernationMessage(hb); msg == "" {
		msg = what
	} else {
		msg += "; " + what
	}
	e.mustTransition(StatePaused, reason, msg)
	return hb, e.persist()
}

// OnHibernationWake registers fn, called with a sandbox's ID once it
// woke from hibernation: every network connection to it is gone, so a
// client's kept-alive connections to it must be dropped (the server
// proxy's and the ingress gateway's). fn must not block.
func (s *Service) OnHibernationWake(fn func(id string)) {
	s.mu.Lock()
	s.wakeHooks = append(s.wakeHooks, fn)
	s.mu.Unlock()
}

func (s *Service) wokeFromHibernation(id string) {
	s.mu.RLock()
	hooks := s.wakeHooks
	s.mu.RUnlock()
	for _, fn := range hooks {
		fn(id)
	}
}

// HibernationMessage tells what a hibernation did, for status messages
// and events.
func HibernationMessage(h runtime.Hibernation) string {
	if h.Mode == runtime.HibernateMemory {
		return fmt.Sprintf("hibernated with its memory (%d MiB freed, %d MiB image on disk)", h.FreedBytes>>20, h.DiskBytes>>20)
	}
	return fmt.Sprintf("hibernated: processes stopped, writable layer kept (%d MiB freed); they start afresh on wake", h.FreedBytes>>20)
}

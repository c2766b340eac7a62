package lifecycle

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/moat-sandbox/moat/internal/errdefs"
	"github.com/moat-sandbox/moat/internal/runtime"
)

// Sandboxes that die on their own. A runtime that notices the end of a
// sandbox's agent at once (runtime.ExitNotifier) tells the service, which
// makes the sandbox Failed right then, with the reason (an OOM kill, an
// exit and its code), records the event, logs why, and ends the
// connections to it (Entry.ended, which Endpoint hands out). Without a
// notifier the liveness pass (checkLiveness) finds the dead sandbox a few
// seconds later.

// ReasonOOMKilled is the Status.Reason of a sandbox the OOM killer ended
// (its memory limit was reached).
const ReasonOOMKilled = "SANDBOX_OOM_KILLED"

// watchExits subscribes the service to the runtime's exit notifications;
// Recover calls it once. Notifications are queued (the runtime's
// goroutine must not wait for a sandbox's lock) and each is handled on a
// goroutine of the service.
func (s *Service) watchExits() {
	n, ok := s.deps.Runtime.(runtime.ExitNotifier)
	if !ok {
		return
	}
	q := &exitQueue{wake: make(chan struct{}, 1)}
	n.NotifyExits(q.push)
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		for {
			select {
			case <-s.closing:
				return
			case <-q.wake:
			}
			for _, ex := range q.take() {
				s.wg.Add(1)
				go func() {
					defer s.wg.Done()
					s.sandboxExited(ex)
				}()
			}
		}
	}()
}

// exitQueue holds the exits not handled yet.
type exitQueue struct {
	mu    sync.Mutex
	exits []runtime.Exit
	wake  chan struct{}
}

func (q *exitQueue) push(ex runtime.Exit) {
	q.mu.Lock()
	q.exits = append(q.exits, ex)
	q.mu.Unlock()
	select {
	case q.wake <- struct{}{}:
	default:
	}
}

func (q *exitQueue) take() []runtime.Exit {
	q.mu.Lock()
	defer q.mu.Unlock()
	exits := q.exits
	q.exits = nil
	return exits
}

// sandboxExited makes a running or paused sandbox whose agent ended
// Failed, frees its runtime resources and persists it. An exit of a
// sandbox in any other state is one the service caused (a delete, which
// is Stopping) or already knows of.
func (s *Service) sandboxExited(ex runtime.Exit) {
	if !s.leader() {
		return
	}
	s.mu.RLock()
	e := s.sandboxes[ex.ID]
	s.mu.RUnlock()
	if e == nil {
		return
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if st := e.sb.Status.State; st != StateRunning && st != StatePaused {
		return
	}
	reason := exitReason(ex.Reason)
	msg := "the sandbox agent " + ex.String()
	s.log.Warn("sandbox died", "id", ex.ID, "reason", ex.Reason, "exit_code", ex.ExitCode, "msg", msg)
	e.mustTransition(StateFailed, reason, msg)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := s.deps.Runtime.Delete(ctx, ex.ID); err != nil {
		s.log.Error("free resources of exited sandbox", "id", ex.ID, "err", err)
	}
	if err := e.persist(); err != nil {
		s.log.Error("persist exited sandbox", "id", ex.ID, "err", err)
	}
}

// exitReason is the Status.Reason of a sandbox whose agent ended for
// runtime reason r (runtime.ExitReason*).
func exitReason(r string) string {
	if r == runtime.ExitReasonOOMKilled {
		return ReasonOOMKilled
	}
	return ReasonAgentExited
}

// endedLocked returns the channel closed once e has ended (Failed or
// Terminated): connections to the sandbox are dead from then on. The
// caller holds e.mu.
func (e *Entry) endedLocked() <-chan struct{} {
	if e.ended == nil {
		e.ended = make(chan struct{})
		if isTerminal(e.sb.Status.State) {
			e.endedWith = e.sb.Status
			close(e.ended)
		}
	}
	return e.ended
}

// endStatus returns e's status as it ended; call it only once the ended
// channel is closed (the close publishes endedWith).
func (e *Entry) endStatus() Status { return e.endedWith }

// markEnded closes e's ended channel (applyState, when e reaches a
// terminal state); the caller holds e.mu.
func (e *Entry) markEnded() {
	if e.ended == nil {
		return // endedLocked makes it closed
	}
	select {
	case <-e.ended:
	default:
		e.endedWith = e.sb.Status
		close(e.ended)
	}
}

// endedError is err, the refusal of an operation on sandbox id, with the
// reason of an ended sandbox's status in its public message ("sandbox x
// is Failed: the sandbox agent was killed by the OOM killer ...").
func endedError(id string, st Status, err error) error {
	var pub *errdefs.Public
	if !isTerminal(st.State) || st.Message == "" || !errors.As(err, &pub) {
		return err
	}
	return errdefs.WithPublic(err, pub.Code, fmt.Sprintf("sandbox %s is %s: %s", id, st.State, st.Message))
}

package lifecycle

import (
	"context"
	"fmt"
	"time"

	"github.com/moat-sandbox/moat/internal/errdefs"
	"github.com/moat-sandbox/moat/internal/runtime"
	"github.com/moat-sandbox/moat/internal/store"
)

// Recover loads the persisted sandboxes and reconciles them with what the
// runtime actually holds, after a restart or a crash of the server:
//   - a record whose sandbox is running or paused is re-adopted as is;
//   - a record whose sandbox died is kept as Failed (SANDBOX_EXITED) and its
//     resources are freed; one the runtime has no trace of is Failed (LOST);
//   - a record past its expiry is deleted;
//   - a runtime sandbox without a record (a create cut short by the crash)
//     is deleted, so nothing leaks.
func (s *Service) Recover(ctx context.Context) error {
	recs, err := store.List[Sandbox](s.deps.Store, Bucket)
	if err != nil {
		return fmt.Errorf("load sandboxes: %w", err)
	}
	if err := s.events.load(); err != nil {
		return fmt.Errorf("load sandbox events: %w", err)
	}
	live, err := s.deps.Runtime.List(ctx)
	if err != nil {
		return fmt.Errorf("list runtime sandboxes: %w", err)
	}
	byID := make(map[string]runtime.Status, len(live))
	for _, st := range live {
		byID[st.ID] = st
	}
	var n recovered
	for i := range recs {
		if err := s.recoverOne(ctx, recs[i], byID, &n); err != nil {
			return err
		}
	}
	for id := range byID {
		if s.shared() {
			// Another replica may be creating it (it records a sandbox
			// once it runs): the leader's sweep deletes real orphans.
			continue
		}
		if err := s.deps.Runtime.Delete(ctx, id); err != nil {
			s.log.Error("recover: delete orphan sandbox", "id", id, "err", err)
		}
		n.orphans++
	}
	if s.features.Pools != nil {
		if err := s.features.Pools.Recover(ctx); err != nil {
			return err
		}
	}
	s.forgetUnknownEvents()
	s.events.flush()
	s.follow()
	s.watchExits()
	s.log.Info("recovered sandboxes", "adopted", n.adopted, "expired", n.expired, "lost", n.lost, "orphans_deleted", n.orphans)
	return nil
}

// recovered counts what Recover did, for its log line.
type recovered struct{ adopted, expired, lost, orphans int }

// recoverOne reconciles record sb with what the runtime holds (byID; the
// sandbox is taken out of it) and puts it in the table.
func (s *Service) recoverOne(ctx context.Context, sb Sandbox, byID map[string]runtime.Status, n *recovered) error {
	if sb.Metadata == nil {
		sb.Metadata = map[string]string{}
	}
	e := newEntry(s, sb)
	e.stored = true
	rst, ok := byID[sb.ID]
	delete(byID, sb.ID)
	if sb.ExpiresAt != nil && !sb.ExpiresAt.After(s.Now()) && s.leader() {
		if err := e.delete(ctx, ReasonExpired); err != nil {
			s.log.Error("recover: delete expired sandbox", "id", sb.ID, "err", err)
			s.put(e)
		}
		n.expired++
		return nil
	}
	if !ok {
		if !isTerminal(sb.Status.State) {
			e.mustTransition(StateFailed, ReasonLost, "the sandbox was lost while the server was down")
			n.lost++
		}
	} else if e.adopt(ctx, rst) {
		n.adopted++
	} else {
		n.lost++
	}
	if e.sb.EgressToken != "" && s.deps.Egress != nil && (rst.State == runtime.StateRunning || rst.State == runtime.StatePaused || rst.State == runtime.StateUnknown) {
		// The effective policy under the tenant's guardrail as it is now.
		if _, err := e.enforceEgress(ctx, e.sb.NetworkPolicy, true, rst.IP); err != nil {
			// Its old ruleset stays installed in the netns; log loudly.
			s.log.Error("recover: re-attach egress policy", "id", sb.ID, "err", err)
		} else if s.features.Vault != nil {
			if err := s.features.Vault.Recover(ctx, e); err != nil {
				// Bound hosts are reached without credentials until fixed.
				s.log.Error("recover: restart the credential proxy", "id", sb.ID, "err", err)
			}
		}
	}
	if e.sb.Status != sb.Status {
		if err := e.persist(); errdefs.IsNotFound(err) {
			// Deleted meanwhile (by another replica, or by the clean-up
			// of a process still stopping): gone.
			return nil
		} else if err != nil {
			return err
		}
	}
	if !e.sb.Warm && !isTerminal(e.sb.Status.State) {
		// Live sandboxes count against their tenant's quota even if it
		// was lowered meanwhile (admit with no limits).
		s.quota.admit(nil, e.sb.Tenant, []string{e.sb.ID}, e.sb.Resources.CPUMillis, e.sb.Resources.MemoryBytes)
	}
	s.put(e)
	return nil
}

// adopt brings recovered e to the state the runtime reports (rst) and
// reports whether the sandbox lives on; one whose agent exited is Failed.
func (e *Entry) adopt(ctx context.Context, rst runtime.Status) bool {
	s := e.svc
	id, recorded := e.sb.ID, e.sb.Status.State
	switch rst.State {
	case runtime.StateRunning:
		if recorded == StatePaused {
			// The runtime resumed it, the record missed it (a crash
			// between the two): finish the resume.
			e.mustTransition(StateResuming, "", "")
		}
		if e.sb.Status.State != StateRunning {
			e.mustTransition(StateRunning, ReasonRunning, "")
		}
		s.events.record(id, EventRecovered, ScopeRuntime, ReasonRunning, "re-adopted after a server restart")
	case runtime.StatePaused:
		if recorded == StateRunning {
			// The runtime paused it, the record missed it: finish the
			// pause.
			e.mustTransition(StatePausing, "", "")
		}
		if e.sb.Status.State != StatePaused {
			e.mustTransition(StatePaused, ReasonPaused, "")
		}
		s.events.record(id, EventRecovered, ScopeRuntime, ReasonPaused, "re-adopted after a server restart")
	case runtime.StateUnknown:
		// The runtime could not tell (e.g. its CLI failed): keep the
		// sandbox as recorded; liveness checks it again later. Never
		// destroy a sandbox on a non-answer.
		s.log.Warn("recover: runtime cannot tell the state of a sandbox; keeping it", "id", id, "msg", rst.Message)
	default:
		e.markExited(ctx, rst)
		return false
	}
	return true
}

func (s *Service) put(e *Entry) {
	s.mu.Lock()
	s.sandboxes[e.sb.ID] = e
	s.mu.Unlock()
}

// markExited records that the agent of a sandbox is gone and frees the
// runtime resources; the caller holds e.mu.
func (e *Entry) markExited(ctx context.Context, rst runtime.Status) {
	s := e.svc
	msg := fmt.Sprintf("the sandbox agent exited (code %d)", rst.ExitCode)
	switch {
	case rst.State == runtime.StateUnknown && rst.Message != "":
		msg = rst.Message
	case rst.Message != "":
		// How the runtime says it ended: an eviction over the disk quota
		// (kubernetes), an OOM kill (docker).
		msg += ": " + rst.Message
	}
	if err := s.deps.Runtime.Delete(ctx, e.sb.ID); err != nil {
		s.log.Error("free resources of exited sandbox", "id", e.sb.ID, "err", err)
	}
	if !isTerminal(e.sb.Status.State) {
		e.mustTransition(StateFailed, exitReason(rst.ExitReason), msg)
	}
}

// Run runs the reaper until ctx is done: it deletes expired sandboxes,
// forgets failed creates after FailedRetention, and notices sandboxes whose
// agent died.
func (s *Service) Run(ctx context.Context) {
	t := time.NewTicker(s.cfg.ReapInterval)
	defer t.Stop()
	var n int
	// Orphans are looked for a few times per grace period, at most every
	// 30 s.
	sweepEvery := max(1, int(min(s.cfg.OrphanGrace/4, 30*time.Second)/s.cfg.ReapInterval))
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		s.reap(ctx)
		n++
		if n%5 == 0 && s.leader() {
			s.checkLiveness(ctx)
		}
		if n%sweepEvery == 0 && s.leader() && s.shared() {
			s.sweepOrphans(ctx)
		}
		if n%30 == 0 {
			trimLogs(ctx, s.deps.Runtime, s.log)
		}
	}
}

// ReapOnce runs one expiry pass (exported for tests and benchmarks).
func (s *Service) ReapOnce(ctx context.Context) { s.reap(ctx) }

func (s *Service) reap(ctx context.Context) {
	now := s.Now()
	s.mu.RLock()
	var due []*Entry
	for _, e := range s.sandboxes {
		due = append(due, e)
	}
	s.mu.RUnlock()
	for _, e := range due {
		if !e.mu.TryLock() {
			continue // busy; next tick
		}
		switch {
		case !e.failedAt.IsZero():
			if now.Sub(e.failedAt) >= s.cfg.FailedRetention {
				s.mu.Lock()
				delete(s.sandboxes, e.sb.ID)
				s.mu.Unlock()
				s.events.markGone(e.sb.ID)
			}
		case e.sb.ExpiresAt != nil && !e.sb.ExpiresAt.After(now) && e.sb.Status.State != StatePending && s.leader():
			s.log.Info("sandbox expired", "id", e.sb.ID)
			if err := e.delete(ctx, ReasonExpired); err != nil {
				s.log.Error("delete expired sandbox", "id", e.sb.ID, "err", err)
			}
		}
		e.mu.Unlock()
	}
	s.events.flush()
}

// checkLiveness marks sandboxes whose agent process is gone as Failed.
func (s *Service) checkLiveness(ctx context.Context) {
	live, err := s.deps.Runtime.List(ctx)
	if err != nil {
		s.log.Warn("liveness: list runtime", "err", err)
		return
	}
	byID := make(map[string]runtime.Status, len(live))
	for _, st := range live {
		byID[st.ID] = st
	}
	s.mu.RLock()
	var check []*Entry
	for _, e := range s.sandboxes {
		check = append(check, e)
	}
	s.mu.RUnlock()
	for _, e := range check {
		if !e.mu.TryLock() {
			continue
		}
		if st := e.sb.Status.State; st == StateRunning || st == StatePaused {
			rst, ok := byID[e.sb.ID]
			if !ok || rst.State == runtime.StateStopped {
				// Not listed, or listed as stopped: List is not atomic with
				// creates, so a sandbox whose create finished while it ran
				// may look gone or stopped. Ask again, now that e.mu is
				// held, before tearing anything down.
				var err error
				rst, err = s.deps.Runtime.Status(ctx, e.sb.ID)
				ok = err == nil
			}
			if !ok {
				e.mustTransition(StateFailed, ReasonLost, "the sandbox disappeared from the runtime")
				e.persist()
			} else if rst.State == runtime.StateStopped {
				e.markExited(ctx, rst)
				e.persist()
			} else if rst.State == runtime.StateUnknown {
				// A non-answer (the runtime's CLI failed): look again on
				// the next pass rather than destroy a live sandbox.
				s.log.Warn("liveness: runtime cannot tell the state of a sandbox", "id", e.sb.ID, "msg", rst.Message)
			}
		}
		e.mu.Unlock()
	}
}

// forgetUnknownEvents marks the event rings of sandboxes the service does
// not hold (a create cut short by a crash) as gone, so they age out.
func (s *Service) forgetUnknownEvents() {
	s.events.mu.Lock()
	var ids []string
	for id, r := range s.events.rings {
		if r.GoneAt.IsZero() {
			ids = append(ids, id)
		}
	}
	s.events.mu.Unlock()
	for _, id := range ids {
		s.mu.RLock()
		_, ok := s.sandboxes[id]
		s.mu.RUnlock()
		if !ok {
			s.events.markGone(id)
		}
	}
}

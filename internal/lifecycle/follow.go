package lifecycle

import (
	"context"
	"encoding/json"
	"sync"
	"time"

	"github.com/moat-sandbox/moat/internal/store"
)

// Replicas. When the store is shared with other processes (a
// store.Watcher: the replicas of `moat serve --runtime kubernetes`), every
// replica serves every sandbox: a sandbox created, changed or deleted
// through one replica is seen by the others through the store, whose
// changes this process follows (follow). A record another replica wrote
// replaces this process's copy as a whole (the record is the truth, as at
// Recover); one it deleted is forgotten here without touching the
// runtime (the deleting replica did that). The background duties that
// act on sandboxes (expiry, liveness, the clean-up of orphans) run on one
// replica only, the leader (Deps.Leader), so that they do not race each
// other; a request is served by whichever replica receives it.

// DefaultOrphanGrace is Config.OrphanGrace's default. It must exceed the
// longest create: a replica records a sandbox only once it runs, and the
// kubernetes runtime waits up to 5 minutes for a pod (image pulls).
const DefaultOrphanGrace = 10 * time.Minute

// follow starts applying the other processes' changes of the sandbox
// records, until the service closes. It returns at once.
func (s *Service) follow() {
	w, ok := s.deps.Store.(store.Watcher)
	if !ok {
		return
	}
	ctx, cancel := context.WithCancel(context.Background())
	q := &changeQueue{pending: map[string][]byte{}, wake: make(chan struct{}, 1)}
	w.Watch(ctx, Bucket, q.push)
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		defer cancel()
		for {
			key, raw, ok := q.pop(s.closing)
			if !ok {
				return
			}
			s.applyRemote(key, raw)
		}
	}()
}

// changeQueue holds the changes not applied yet, the latest per record:
// the store's callbacks must not wait for a sandbox's lock.
type changeQueue struct {
	mu      sync.Mutex
	pending map[string][]byte
	order   []string
	wake    chan struct{}
}

func (q *changeQueue) push(key string, raw []byte) {
	q.mu.Lock()
	if _, queued := q.pending[key]; !queued {
		q.order = append(q.order, key)
	}
	q.pending[key] = raw
	q.mu.Unlock()
	select {
	case q.wake <- struct{}{}:
	default:
	}
}

func (q *changeQueue) pop(done <-chan struct{}) (string, []byte, bool) {
	for {
		q.mu.Lock()
		if len(q.order) > 0 {
			key := q.order[0]
			q.order = q.order[1:]
			raw := q.pending[key]
			delete(q.pending, key)
			q.mu.Unlock()
			return key, raw, true
		}
		q.mu.Unlock()
		select {
		case <-done:
			return "", nil, false
		case <-q.wake:
		}
	}
}

// applyRemote applies a change of record id made by another process (raw
// nil: deleted).
func (s *Service) applyRemote(id string, raw []byte) {
	s.mu.RLock()
	e := s.sandboxes[id]
	s.mu.RUnlock()
	if raw == nil {
		if e == nil {
			return
		}
		e.mu.Lock()
		defer e.mu.Unlock()
		s.mu.Lock()
		if s.sandboxes[id] == e {
			delete(s.sandboxes, id)
		}
		s.mu.Unlock()
		e.done.Store(true)
		e.markEnded()
		s.quota.release(id)
		s.events.markGone(id)
		return
	}
	var sb Sandbox
	if err := json.Unmarshal(raw, &sb); err != nil {
		s.log.Warn("follow: unreadable sandbox record", "id", id, "err", err)
		return
	}
	if sb.Metadata == nil {
		sb.Metadata = map[string]string{}
	}
	if e == nil {
		e = newEntry(s, sb)
		e.stored = true
		s.put(e)
		if !sb.Warm && !isTerminal(sb.Status.State) {
			s.quota.admit(nil, sb.Tenant, []string{id}, sb.Resources.CPUMillis, sb.Resources.MemoryBytes)
		}
		return
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	// The record is the truth: another replica changed the sandbox.
	e.sb, e.stored = sb, true
	e.done.Store(isTerminal(sb.Status.State))
	if isTerminal(sb.Status.State) {
		s.quota.release(id)
		e.markEnded()
	}
}

// sweepOrphans deletes the runtime's sandboxes that have no record and
// are older than Config.OrphanGrace (leader only, shared store): a
// replica that died between making a sandbox and recording it leaves them.
func (s *Service) sweepOrphans(ctx context.Context) {
	live, err := s.deps.Runtime.List(ctx)
	if err != nil {
		s.log.Warn("orphans: list runtime", "err", err)
		return
	}
	now := s.Now()
	for _, st := range live {
		if st.CreatedAt.IsZero() || now.Sub(st.CreatedAt) < s.cfg.OrphanGrace {
			continue
		}
		s.mu.RLock()
		_, known := s.sandboxes[st.ID]
		s.mu.RUnlock()
		if known {
			continue
		}
		var rec Sandbox
		if err := s.deps.Store.Get(Bucket, st.ID, &rec); err == nil {
			continue // recorded; this process has not followed it yet
		}
		s.log.Info("deleting an orphan sandbox (no record)", "id", st.ID, "created", st.CreatedAt)
		if err := s.deps.Runtime.Delete(ctx, st.ID); err != nil {
			s.log.Error("delete orphan sandbox", "id", st.ID, "err", err)
		}
	}
}

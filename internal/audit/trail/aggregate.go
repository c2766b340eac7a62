package trail

import (
	"context"
	"sync"
	"time"
)

// Aggregation bounds: a chatty sandbox (a loop resolving names, a client
// retrying a bound host) must not flood its trail or the store.
const (
	// AggregateWindow: a like event (same sandbox, kind, action and key)
	// is written at most once in this long; the repeats are counted and
	// written, as one record with Count, by the next like event after the
	// window or by Flush.
	AggregateWindow = time.Minute
	// MaxAggregateKeys bounds the like-event keys tracked per sandbox;
	// while that many are within the window, events of new keys are
	// counted in Dropped and not written.
	MaxAggregateKeys = 256
)

type aggKey struct {
	id, key string
	kind    Kind
	action  string
}

type aggState struct {
	at  time.Time // when the last record of the key was written
	n   int       // repeats since then
	rec Record    // the last repeat (written with Count n)
}

// aggregator throttles like events.
type aggregator struct {
	mu      sync.Mutex
	m       map[aggKey]*aggState
	perID   map[string]int
	dropped uint64
	// active holds, per sandbox, the trace ids of what runs in it now
	// (commands), newest last: Note links its records to the newest.
	active map[string][]traceRef
}

// traceRef is a trace and span id pair.
type traceRef struct{ trace, span string }

// Active marks traceID (and spanID) as the trace of what sandbox id does until
// release is called (a command): egress and credential records noted
// meanwhile carry it, so a trace links a command to the connections it
// made. An empty traceID is ignored.
func (s *Store) Active(id, traceID, spanID string) (release func()) {
	if traceID == "" {
		return func() {}
	}
	ref := traceRef{traceID, spanID}
	a := &s.agg
	a.mu.Lock()
	if a.active == nil {
		a.active = map[string][]traceRef{}
	}
	a.active[id] = append(a.active[id], ref)
	a.mu.Unlock()
	return func() {
		a.mu.Lock()
		defer a.mu.Unlock()
		l := a.active[id]
		for i := len(l) - 1; i >= 0; i-- {
			if l[i] == ref {
				l = append(l[:i], l[i+1:]...)
				break
			}
		}
		if len(l) == 0 {
			delete(a.active, id)
		} else {
			a.active[id] = l
		}
	}
}

// Note appends r like Append, aggregated with like events: key names what
// makes two events of r's sandbox, kind and action alike (host, port and
// rule of an egress decision; binding and host of a credential).
func (s *Store) Note(r Record, key string) {
	now := s.opt.Now()
	if r.Time.IsZero() {
		r.Time = now
	}
	k := aggKey{id: r.SandboxID, key: key, kind: r.Kind, action: r.Action}
	a := &s.agg
	a.mu.Lock()
	if l := a.active[r.SandboxID]; r.TraceID == "" && len(l) > 0 {
		r.TraceID, r.SpanID = l[len(l)-1].trace, l[len(l)-1].span
	}
	if a.m == nil {
		a.m, a.perID = map[aggKey]*aggState{}, map[string]int{}
	}
	st := a.m[k]
	switch {
	case st == nil:
		if a.perID[k.id] >= MaxAggregateKeys {
			s.flushLocked(now, k.id)
			if a.perID[k.id] >= MaxAggregateKeys {
				a.dropped++
				a.mu.Unlock()
				return
			}
		}
		a.m[k] = &aggState{at: now}
		a.perID[k.id]++
	case now.Sub(st.at) < AggregateWindow:
		st.n++
		st.rec = r
		a.mu.Unlock()
		return
	default:
		if st.n > 0 {
			r.Count = st.n + 1
		}
		st.at, st.n, st.rec = now, 0, Record{}
	}
	a.mu.Unlock()
	if err := s.Append(r); err != nil {
		s.opt.Log.Warn("audit trail: append", "id", r.SandboxID, "err", err)
	}
}

// Flush writes the counted repeats whose window has passed, and forgets
// keys quiet for a window.
func (s *Store) Flush() {
	s.agg.mu.Lock()
	pending := s.flushLocked(s.opt.Now(), "")
	s.agg.mu.Unlock()
	for _, r := range pending {
		if err := s.Append(r); err != nil {
			s.opt.Log.Warn("audit trail: append", "id", r.SandboxID, "err", err)
		}
	}
}

// flushLocked forgets the keys (of sandbox id, or all when "") whose
// window has passed and returns their counted repeats as records. With
// an id, from Note, the repeats are appended here: Note holds the lock.
func (s *Store) flushLocked(now time.Time, id string) []Record {
	a := &s.agg
	var out []Record
	for k, st := range a.m {
		if id != "" && k.id != id || now.Sub(st.at) < AggregateWindow {
			continue
		}
		if st.n > 0 {
			r := st.rec
			r.Count = st.n
			out = append(out, r)
		}
		delete(a.m, k)
		if a.perID[k.id]--; a.perID[k.id] <= 0 {
			delete(a.perID, k.id)
		}
	}
	if id != "" {
		for _, r := range out {
			if err := s.Append(r); err != nil {
				s.opt.Log.Warn("audit trail: append", "id", r.SandboxID, "err", err)
			}
		}
		return nil
	}
	return out
}

// Dropped counts the aggregated events not written because their sandbox
// had too many distinct keys in the window.
func (s *Store) Dropped() uint64 {
	s.agg.mu.Lock()
	defer s.agg.mu.Unlock()
	return s.agg.dropped
}

// Run flushes aggregated events and expires old trails every interval
// until ctx ends, then flushes once more.
func (s *Store) Run(ctx context.Context, interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			s.Flush()
			s.Close()
			return
		case <-t.C:
			s.Flush()
			if n := s.Expire(); n > 0 {
				s.opt.Log.Info("audit trail: expired the trails of deleted sandboxes", "count", n)
			}
		}
	}
}

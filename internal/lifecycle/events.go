package lifecycle

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/moat-sandbox/moat/internal/errdefs"
	"github.com/moat-sandbox/moat/internal/runtime"
	"github.com/moat-sandbox/moat/internal/store"
)

// EventsBucket is the store bucket holding each sandbox's event ring.
const EventsBucket = "events"

// Event types recorded in a sandbox's event ring.
const (
	EventCreated   = "Created"   // accepted, provisioning starts
	EventStarted   = "Started"   // the agent answered; Running
	EventPaused    = "Paused"    // frozen
	EventResumed   = "Resumed"   // thawed
	EventRenewed   = "Renewed"   // expiry moved
	EventExpired   = "Expired"   // the TTL ran out; deletion follows
	EventDeleted   = "Deleted"   // every resource freed
	EventFailed    = "Failed"    // provisioning failed
	EventExited    = "Exited"    // the agent process (PID 1) exited
	EventLost      = "Lost"      // the runtime has no trace of the sandbox
	EventRecovered = "Recovered" // re-adopted after a server restart
)

// Event types of the idle policies (internal/lifecycle/idle).
const (
	EventIdlePaused = "IdlePaused" // frozen after a time without activity
	EventWoken      = "Woken"      // thawed by a request to an idle-paused sandbox
	// EventHibernated: its processes stopped and their memory freed
	// (through the API or by its idle policy; the reason tells).
	EventHibernated = "Hibernated"
)

// Event scopes (the Diagnostics API scope the event belongs to).
const (
	ScopeLifecycle = "lifecycle" // API-driven transitions
	ScopeRuntime   = "runtime"   // what the runtime reported on its own
)

// Event is one entry of a sandbox's event ring.
type Event struct {
	Time    time.Time `json:"time"`
	Type    string    `json:"type"`
	Scope   string    `json:"scope"`
	Reason  string    `json:"reason,omitempty"`
	Message string    `json:"message,omitempty"`
}

// Event ring bounds.
const (
	// MaxEventsPerSandbox is the ring size; older events are dropped (and
	// counted).
	MaxEventsPerSandbox = 64
	// EventRetention is how long the events of a deleted sandbox stay
	// readable.
	EventRetention = time.Hour
	// MaxGoneEventLogs caps how many deleted sandboxes keep their events;
	// the oldest are forgotten first.
	MaxGoneEventLogs = 4096
)

// eventRing is the persisted record of one sandbox's events.
type eventRing struct {
	Events  []Event `json:"events"`
	Dropped int     `json:"dropped,omitempty"`
	// GoneAt is when the sandbox was deleted (zero while it exists).
	GoneAt time.Time `json:"goneAt,omitzero"`
}

// eventLog holds every sandbox's ring in memory; dirty rings are written
// to the store in one transaction by flush (each reaper tick), so events
// cost no fsync on the request path. A crash loses at most the last tick
// of events.
type eventLog struct {
	db  store.Store
	now func() time.Time
	log *slog.Logger

	mu      sync.Mutex
	rings   map[string]*eventRing
	dirty   map[string]bool
	removed map[string]bool
}

func newEventLog(db store.Store, now func() time.Time, log *slog.Logger) *eventLog {
	return &eventLog{db: db, now: now, log: log, rings: map[string]*eventRing{}, dirty: map[string]bool{}, removed: map[string]bool{}}
}

// record appends an event to sandbox id's ring.
func (l *eventLog) record(id, typ, scope, reason, msg string) {
	ev := Event{Time: l.now(), Type: typ, Scope: scope, Reason: reason, Message: msg}
	l.mu.Lock()
	defer l.mu.Unlock()
	r := l.rings[id]
	if r == nil {
		r = &eventRing{}
		l.rings[id] = r
	}
	if len(r.Events) >= MaxEventsPerSandbox {
		n := len(r.Events) - MaxEventsPerSandbox + 1
		r.Events = append(r.Events[:0], r.Events[n:]...)
		r.Dropped += n
	}
	r.Events = append(r.Events, ev)
	if typ == EventDeleted {
		r.GoneAt = ev.Time
	}
	l.dirty[id] = true
	delete(l.removed, id)
}

// markGone records that sandbox id no longer exists (without an event),
// so its ring ages out.
func (l *eventLog) markGone(id string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if r := l.rings[id]; r != nil && r.GoneAt.IsZero() {
		r.GoneAt = l.now()
		l.dirty[id] = true
	}
}

// recordTransition records the event implied by a state change of e from
// prev; the caller holds e.mu. Transitional states record nothing.
func (l *eventLog) recordTransition(e *Entry, prev Status) {
	st := e.sb.Status
	switch st.State {
	case StateRunning:
		switch {
		case prev.State == StatePending:
			l.record(e.sb.ID, EventStarted, ScopeLifecycle, st.Reason, "")
		case prev.State == StateResuming && prev.Reason == ReasonWaking:
			l.record(e.sb.ID, EventWoken, ScopeLifecycle, prev.Reason, prev.Message)
		case prev.State == StateResuming:
			l.record(e.sb.ID, EventResumed, ScopeLifecycle, st.Reason, "")
		}
	case StatePaused:
		switch {
		case prev.State == StatePausing && (st.Reason == ReasonHibernated || st.Reason == ReasonIdleHibernated):
			l.record(e.sb.ID, EventHibernated, ScopeLifecycle, st.Reason, st.Message)
		case prev.State == StatePausing && st.Reason == ReasonIdlePaused:
			l.record(e.sb.ID, EventIdlePaused, ScopeLifecycle, st.Reason, st.Message)
		case prev.State == StatePausing:
			l.record(e.sb.ID, EventPaused, ScopeLifecycle, st.Reason, "")
		}
	case StateFailed:
		switch st.Reason {
		case ReasonAgentExited, ReasonOOMKilled:
			l.record(e.sb.ID, EventExited, ScopeRuntime, st.Reason, st.Message)
		case ReasonLost:
			l.record(e.sb.ID, EventLost, ScopeRuntime, st.Reason, st.Message)
		default:
			l.record(e.sb.ID, EventFailed, ScopeLifecycle, st.Reason, st.Message)
		}
	case StateTerminated:
		if st.Reason == ReasonExpired {
			l.record(e.sb.ID, EventExpired, ScopeLifecycle, st.Reason, "")
		}
		l.record(e.sb.ID, EventDeleted, ScopeLifecycle, st.Reason, "")
	}
}

// flush writes the dirty rings and prunes old ones. It is called by the
// reaper and on Close.
func (l *eventLog) flush() {
	now := l.now()
	l.mu.Lock()
	// Prune: rings of sandboxes gone for longer than EventRetention, then
	// the oldest gone ones beyond MaxGoneEventLogs.
	var gone []string
	for id, r := range l.rings {
		if r.GoneAt.IsZero() {
			continue
		}
		if now.Sub(r.GoneAt) >= EventRetention {
			delete(l.rings, id)
			delete(l.dirty, id)
			l.removed[id] = true
			continue
		}
		gone = append(gone, id)
	}
	if len(gone) > MaxGoneEventLogs {
		sort.Slice(gone, func(i, j int) bool { return l.rings[gone[i]].GoneAt.Before(l.rings[gone[j]].GoneAt) })
		for _, id := range gone[:len(gone)-MaxGoneEventLogs] {
			delete(l.rings, id)
			delete(l.dirty, id)
			l.removed[id] = true
		}
	}
	put := make(map[string]any, len(l.dirty))
	for id := range l.dirty {
		r := l.rings[id]
		c := *r
		c.Events = append([]Event(nil), r.Events...)
		put[id] = &c
	}
	removed := l.removed
	l.dirty, l.removed = map[string]bool{}, map[string]bool{}
	l.mu.Unlock()

	if len(put) > 0 {
		if err := l.db.PutMany(EventsBucket, put); err != nil {
			l.log.Warn("persist sandbox events", "err", err)
			l.redirty(put)
		}
	}
	for id := range removed {
		if err := l.db.Delete(EventsBucket, id); err != nil {
			l.log.Warn("prune sandbox events", "id", id, "err", err)
		}
	}
}

// redirty marks rings whose write failed for the next flush.
func (l *eventLog) redirty(put map[string]any) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for id := range put {
		if _, ok := l.rings[id]; ok {
			l.dirty[id] = true
		}
	}
}

// load reads the persisted rings (at Recover).
func (l *eventLog) load() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.db.ForEach(EventsBucket, func(key string, raw []byte) error {
		var r eventRing
		if err := json.Unmarshal(raw, &r); err != nil {
			// A corrupt ring is diagnostics only; drop it.
			l.log.Warn("drop unreadable event ring", "id", key, "err", err)
			l.removed[key] = true
			return nil
		}
		l.rings[key] = &r
		return nil
	})
}

// RecordEvent appends ev, stamped now, to sandbox id's events: how a
// feature outside the lifecycle (the Credential Vault's proxy) tells the
// sandbox's user of something. ev needs a Type and a Scope.
// ErrNotFound if the sandbox does not exist (a deleted one's events are
// closed).
func (s *Service) RecordEvent(ctx context.Context, id string, ev Event) error {
	if ev.Type == "" || ev.Scope == "" {
		return fmt.Errorf("event of sandbox %q needs a type and a scope: %w", id, errdefs.ErrInvalidArgument)
	}
	if _, err := s.get(ctx, id); err != nil {
		return err
	}
	s.events.record(id, ev.Type, ev.Scope, ev.Reason, ev.Message)
	return nil
}

// FlushEvents writes pending events to the store (for tests; the reaper
// does it every tick).
func (s *Service) FlushEvents() { s.events.flush() }

// Events returns the recorded events of a sandbox, oldest first, and how
// many older ones the ring dropped. A deleted sandbox's events stay
// readable for EventRetention; ErrNotFound once they are gone.
func (s *Service) Events(ctx context.Context, id string) ([]Event, int, error) {
	if _, err := s.get(ctx, id); err != nil {
		if !errdefs.IsNotFound(err) || !s.events.gone(id) {
			return nil, 0, err
		}
	}
	l := s.events
	l.mu.Lock()
	defer l.mu.Unlock()
	r := l.rings[id]
	if r == nil {
		return nil, 0, nil
	}
	return append([]Event(nil), r.Events...), r.Dropped, nil
}

// gone reports whether a deleted sandbox id still has its events.
func (l *eventLog) gone(id string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	r := l.rings[id]
	return r != nil && !r.GoneAt.IsZero()
}

// Logs returns at most max bytes from the end of the sandbox's console
// output (agent and entrypoint stdout/stderr), and whether older output
// was left out. ErrNotImplemented if the runtime keeps no logs.
func (s *Service) Logs(ctx context.Context, id string, max int64) ([]byte, bool, error) {
	if _, err := s.get(ctx, id); err != nil {
		return nil, false, err
	}
	lr, ok := s.deps.Runtime.(runtime.LogReader)
	if !ok {
		return nil, false, errdefs.WithPublic(errdefs.ErrNotImplemented, "DIAGNOSTICS_NOT_IMPLEMENTED",
			fmt.Sprintf("the %s runtime keeps no sandbox logs", s.deps.Runtime.Name()))
	}
	data, truncated, err := lr.Logs(ctx, id, max)
	if errdefs.IsNotFound(err) {
		// The sandbox exists but its runtime resources (and log) are gone,
		// e.g. a Failed sandbox: there is simply no output.
		return nil, false, nil
	}
	return data, truncated, err
}

// FormatEvents renders events as diagnostic text, one line each:
// "<RFC3339> <scope> <type> [reason] [message]".
func FormatEvents(evs []Event) string {
	var b strings.Builder
	for _, e := range evs {
		b.WriteString(e.Time.UTC().Format(time.RFC3339Nano))
		b.WriteByte(' ')
		b.WriteString(e.Scope)
		b.WriteByte(' ')
		b.WriteString(e.Type)
		if e.Reason != "" {
			b.WriteByte(' ')
			b.WriteString(e.Reason)
		}
		if e.Message != "" {
			b.WriteString(" ")
			b.WriteString(e.Message)
		}
		b.WriteByte('\n')
	}
	return b.String()
}

// MaxLogBytes bounds each sandbox's console log on backends that do not
// bound it themselves (runtime.LogTrimmer).
const MaxLogBytes = 8 << 20

// trimLogs asks the runtime to bound its console logs.
func trimLogs(ctx context.Context, rt runtime.Runtime, log *slog.Logger) {
	if t, ok := rt.(runtime.LogTrimmer); ok {
		if err := t.TrimLogs(ctx, MaxLogBytes); err != nil {
			log.Warn("trim sandbox logs", "err", err)
		}
	}
}

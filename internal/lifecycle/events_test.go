package lifecycle

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/moat-sandbox/moat/internal/errdefs"
	"github.com/moat-sandbox/moat/internal/runtime"
	"github.com/moat-sandbox/moat/internal/runtime/fake"
)

func eventTypes(evs []Event) []string {
	var out []string
	for _, e := range evs {
		out = append(out, e.Type)
	}
	return out
}

func TestEventsRecordedPersistedAndPruned(t *testing.T) {
	h := newHarness(t)
	ctx := context.Background()
	sb, err := h.svc.Create(ctx, req(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	if err := h.svc.Pause(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	if err := h.svc.Resume(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := h.svc.Renew(ctx, sb.ID, h.clk.Now().Add(2*time.Hour)); err != nil {
		t.Fatal(err)
	}
	exp, _ := h.svc.Create(ctx, req(2*time.Minute))
	h.clk.Add(time.Second)
	if err := h.svc.Delete(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	want := []string{EventCreated, EventStarted, EventPaused, EventResumed, EventRenewed, EventDeleted}
	evs, dropped, err := h.svc.Events(ctx, sb.ID)
	if err != nil || dropped != 0 || !slices.Equal(eventTypes(evs), want) {
		t.Fatalf("events %v dropped %d err %v, want %v", eventTypes(evs), dropped, err, want)
	}
	for i := 1; i < len(evs); i++ {
		if evs[i].Time.Before(evs[i-1].Time) || evs[i].Scope != ScopeLifecycle {
			t.Fatalf("event %d out of order or wrong scope: %+v", i, evs[i])
		}
	}
	// The sandbox is gone but its history is not.
	if _, err := h.svc.Get(ctx, sb.ID); !errdefs.IsNotFound(err) {
		t.Fatalf("deleted sandbox still there: %v", err)
	}
	// Expiry by the reaper records Expired then Deleted.
	h.clk.Add(3 * time.Minute)
	h.svc.ReapOnce(ctx) // also flushes
	evs, _, err = h.svc.Events(ctx, exp.ID)
	if err != nil || !slices.Equal(eventTypes(evs), []string{EventCreated, EventStarted, EventExpired, EventDeleted}) {
		t.Fatalf("expired sandbox events %v %v", eventTypes(evs), err)
	}

	// A restarted service reads the rings back from the store.
	svc2 := h.newService(t)
	if err := svc2.Recover(ctx); err != nil {
		t.Fatal(err)
	}
	evs, _, err = svc2.Events(ctx, sb.ID)
	if err != nil || !slices.Equal(eventTypes(evs), want) {
		t.Fatalf("after restart: %v %v", eventTypes(evs), err)
	}
	// After EventRetention the deleted sandbox's events are pruned, from
	// memory and from the store.
	h.clk.Add(EventRetention + time.Minute)
	svc2.ReapOnce(ctx)
	if _, _, err := svc2.Events(ctx, sb.ID); !errdefs.IsNotFound(err) {
		t.Fatalf("events of a long-gone sandbox: %v", err)
	}
	var r eventRing
	if err := h.db.Get(EventsBucket, sb.ID, &r); !errdefs.IsNotFound(err) {
		t.Fatalf("store still holds the pruned ring: %+v %v", r, err)
	}
	if _, _, err := svc2.Events(ctx, "no-such-id"); !errdefs.IsNotFound(err) {
		t.Fatalf("unknown id: %v", err)
	}
}

func TestEventRingBounded(t *testing.T) {
	h := newHarness(t)
	ctx := context.Background()
	sb, _ := h.svc.Create(ctx, req(time.Hour))
	for i := range 100 {
		if _, err := h.svc.Renew(ctx, sb.ID, h.clk.Now().Add(time.Hour+time.Duration(i+1)*time.Minute)); err != nil {
			t.Fatal(err)
		}
	}
	evs, dropped, err := h.svc.Events(ctx, sb.ID)
	if err != nil || len(evs) != MaxEventsPerSandbox || dropped != 102-MaxEventsPerSandbox {
		t.Fatalf("len %d dropped %d err %v", len(evs), dropped, err)
	}
	if last := evs[len(evs)-1]; last.Type != EventRenewed || last.Message == "" {
		t.Fatalf("last event %+v", last)
	}
}

func TestEventsOfRuntimeFailuresAndRecovery(t *testing.T) {
	h := newHarness(t)
	ctx := context.Background()
	keep, _ := h.svc.Create(ctx, req(time.Hour))
	died, _ := h.svc.Create(ctx, req(time.Hour))
	h.svc.FlushEvents()
	if err := h.rt.Stop(ctx, died.ID, 0); err != nil {
		t.Fatal(err)
	}
	h.rt = h.rt.Reopen(fake.Hooks{Create: func(s runtime.Spec) error {
		if h.hooks.Create != nil {
			return h.hooks.Create(s)
		}
		return nil
	}})
	svc := h.newService(t)
	if err := svc.Recover(ctx); err != nil {
		t.Fatal(err)
	}
	evs, _, _ := svc.Events(ctx, keep.ID)
	if got := eventTypes(evs); !slices.Equal(got, []string{EventCreated, EventStarted, EventRecovered}) || evs[2].Scope != ScopeRuntime {
		t.Fatalf("adopted sandbox events %v", evs)
	}
	evs, _, _ = svc.Events(ctx, died.ID)
	if got := eventTypes(evs); !slices.Equal(got, []string{EventCreated, EventStarted, EventExited}) || evs[2].Message == "" {
		t.Fatalf("exited sandbox events %+v", evs)
	}

	// A failed create records Failed with the reason.
	h.hooks.Create = func(runtime.Spec) error { return errdefs.ErrUnavailable }
	sb, _ := svc.Create(ctx, req(time.Hour))
	evs, _, _ = svc.Events(ctx, sb.ID)
	if got := eventTypes(evs); !slices.Equal(got, []string{EventCreated, EventFailed}) || evs[1].Reason != ReasonProvisionFailed {
		t.Fatalf("failed create events %+v", evs)
	}
}

// noLogs is a runtime without runtime.LogReader.
type noLogs struct{ runtime.Runtime }

func TestLogs(t *testing.T) {
	h := newHarness(t)
	ctx := context.Background()
	sb, _ := h.svc.Create(ctx, req(time.Hour))
	data, truncated, err := h.svc.Logs(ctx, sb.ID, 1<<20)
	if err != nil || truncated || len(data) == 0 {
		t.Fatalf("logs %q %v %v", data, truncated, err)
	}
	if data, truncated, err = h.svc.Logs(ctx, sb.ID, 5); err != nil || !truncated || len(data) != 5 {
		t.Fatalf("bounded logs %q %v %v", data, truncated, err)
	}
	if _, _, err := h.svc.Logs(ctx, "nope", 10); !errdefs.IsNotFound(err) {
		t.Fatalf("unknown id: %v", err)
	}
	h.svc.deps.Runtime = noLogs{h.rt}
	_, _, err = h.svc.Logs(ctx, sb.ID, 10)
	if p, ok := errdefs.PublicOf(err); !ok || p.Code != "DIAGNOSTICS_NOT_IMPLEMENTED" || !errdefs.IsNotImplemented(err) {
		t.Fatalf("no-logs runtime: %v", err)
	}
}

// A feature's event (RecordEvent) joins the sandbox's ring, stamped now,
// and is persisted with it; a deleted or unknown sandbox takes none, and
// an event without type or scope is refused.
func TestRecordEventOfAFeature(t *testing.T) {
	h := newHarness(t)
	ctx := context.Background()
	sb, err := h.svc.Create(ctx, req(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	h.clk.Add(time.Second)
	ev := Event{Type: "CredentialWithheld", Scope: ScopeRuntime, Reason: "UnresolvedDestination", Message: "binding api"}
	if err := h.svc.RecordEvent(ctx, sb.ID, ev); err != nil {
		t.Fatal(err)
	}
	evs, _, err := h.svc.Events(ctx, sb.ID)
	if err != nil || len(evs) == 0 {
		t.Fatalf("events %v %v", evs, err)
	}
	got := evs[len(evs)-1]
	if got.Type != ev.Type || got.Scope != ev.Scope || got.Reason != ev.Reason || got.Message != ev.Message || !got.Time.Equal(h.clk.Now()) {
		t.Fatalf("recorded %+v, want %+v at %v", got, ev, h.clk.Now())
	}
	for _, bad := range []Event{{Scope: ScopeRuntime}, {Type: "X"}} {
		if err := h.svc.RecordEvent(ctx, sb.ID, bad); !errdefs.IsInvalidArgument(err) {
			t.Fatalf("RecordEvent(%+v): %v, want invalid argument", bad, err)
		}
	}
	if err := h.svc.RecordEvent(ctx, "no-such-sandbox", ev); !errdefs.IsNotFound(err) {
		t.Fatalf("unknown sandbox: %v", err)
	}
	if _, _, err := h.svc.Events(ctx, "no-such-sandbox"); !errdefs.IsNotFound(err) {
		t.Fatalf("an unknown sandbox got an event ring: %v", err)
	}
	h.svc.ReapOnce(ctx)
	svc2 := h.newService(t)
	if err := svc2.Recover(ctx); err != nil {
		t.Fatal(err)
	}
	if evs, _, _ := svc2.Events(ctx, sb.ID); !slices.Contains(eventTypes(evs), ev.Type) {
		t.Fatalf("after restart: %v", eventTypes(evs))
	}
	if err := svc2.Delete(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	if err := svc2.RecordEvent(ctx, sb.ID, ev); !errdefs.IsNotFound(err) {
		t.Fatalf("deleted sandbox: %v", err)
	}
}

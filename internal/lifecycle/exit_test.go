package lifecycle

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/moat-sandbox/moat/internal/agentproto"
	"github.com/moat-sandbox/moat/internal/errdefs"
	"github.com/moat-sandbox/moat/internal/runtime"
	"github.com/moat-sandbox/moat/internal/runtime/fake"
)

// waitFor polls cond for up to 10 s (the notification is handled on a
// goroutine of the service).
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within 10s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// A sandbox whose agent dies is Failed at once, with the reason, an event
// and its open connections ended; no liveness pass runs here (Run is not
// started), so only the runtime's notification can tell.
func TestSandboxExitNotified(t *testing.T) {
	h := newHarness(t)
	ctx := context.Background()
	if err := h.svc.Recover(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(h.svc.Close)
	oom, _ := h.svc.Create(ctx, req(time.Hour))
	exited, _ := h.svc.Create(ctx, req(time.Hour))
	paused, _ := h.svc.Create(ctx, req(time.Hour))
	if err := h.svc.Pause(ctx, paused.ID); err != nil {
		t.Fatal(err)
	}
	ep, err := h.svc.Endpoint(ctx, oom.ID, agentproto.Port)
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-ep.Ended:
		t.Fatal("Ended is closed while the sandbox runs")
	default:
	}

	if err := h.rt.Exit(oom.ID, runtime.Exit{Reason: runtime.ExitReasonOOMKilled, ExitCode: 137, Message: "memory limit 64 MiB"}); err != nil {
		t.Fatal(err)
	}
	h.rt.Exit(exited.ID, runtime.Exit{Reason: runtime.ExitReasonExited, ExitCode: 3})
	h.rt.Exit(paused.ID, runtime.Exit{Reason: runtime.ExitReasonExited, ExitCode: 0})
	select {
	case <-ep.Ended:
	case <-time.After(10 * time.Second):
		t.Fatal("Ended not closed within 10s of the exit")
	}
	for _, c := range []struct {
		id, reason string
		words      []string
	}{
		{oom.ID, ReasonOOMKilled, []string{"OOM", "exit code 137", "64 MiB"}},
		{exited.ID, ReasonAgentExited, []string{"exited", "exit code 3"}},
		{paused.ID, ReasonAgentExited, []string{"exited", "exit code 0"}},
	} {
		var sb Sandbox
		waitFor(t, c.id+" Failed", func() bool {
			sb, _ = h.svc.Get(ctx, c.id)
			return sb.Status.State == StateFailed
		})
		if sb.Status.Reason != c.reason {
			t.Errorf("%s: reason %q, want %q", c.id, sb.Status.Reason, c.reason)
		}
		for _, w := range c.words {
			if !strings.Contains(sb.Status.Message, w) {
				t.Errorf("%s: message %q lacks %q", c.id, sb.Status.Message, w)
			}
		}
		evs, _, _ := h.svc.Events(ctx, c.id)
		if last := evs[len(evs)-1]; last.Type != EventExited || last.Scope != ScopeRuntime || last.Reason != c.reason || last.Message != sb.Status.Message {
			t.Errorf("%s: last event %+v", c.id, last)
		}
		// Its runtime resources are freed.
		if _, err := h.rt.Status(ctx, c.id); !errdefs.IsNotFound(err) {
			t.Errorf("%s: runtime still holds it: %v", c.id, err)
		}
	}
	// New connections are refused at once, with the reason.
	_, err = h.svc.Endpoint(ctx, oom.ID, agentproto.Port)
	var pub *errdefs.Public
	if !errors.As(err, &pub) || !errdefs.IsFailedPrecondition(err) || pub.Code != "SANDBOX::NOT_RUNNING" || !strings.Contains(pub.Message, "OOM") {
		t.Fatalf("Endpoint of the dead sandbox: %v (%+v)", err, pub)
	}
}

// The exit of a sandbox the service is deleting is no failure.
func TestDeleteIsNoExitFailure(t *testing.T) {
	h := newHarness(t)
	ctx := context.Background()
	if err := h.svc.Recover(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(h.svc.Close)
	sb, _ := h.svc.Create(ctx, req(time.Hour))
	ep, err := h.svc.Endpoint(ctx, sb.ID, agentproto.Port)
	if err != nil {
		t.Fatal(err)
	}
	if err := h.svc.Delete(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	select {
	case <-ep.Ended:
	default:
		t.Fatal("Ended open after the delete")
	}
	time.Sleep(100 * time.Millisecond) // let a (wrong) exit handler run
	evs, _, err := h.svc.Events(ctx, sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	if got := eventTypes(evs); slices.Contains(got, EventExited) || slices.Contains(got, EventFailed) {
		t.Fatalf("events of a deleted sandbox: %v", got)
	}
}

// A sandbox that ran out of memory while nobody listened (the server was
// down) is Failed with the OOM reason at Recover, as the runtime's status
// tells it.
func TestRecoverOOMKilled(t *testing.T) {
	h := newHarness(t)
	ctx := context.Background()
	sb, _ := h.svc.Create(ctx, req(time.Hour))
	if err := h.rt.Exit(sb.ID, runtime.Exit{Reason: runtime.ExitReasonOOMKilled, ExitCode: 137}); err != nil {
		t.Fatal(err)
	}
	h.rt = h.rt.Reopen(fake.Hooks{})
	svc := h.newService(t)
	if err := svc.Recover(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(svc.Close)
	got, err := svc.Get(ctx, sb.ID)
	if err != nil || got.Status.State != StateFailed || got.Status.Reason != ReasonOOMKilled || !strings.Contains(got.Status.Message, "OOM") {
		t.Fatalf("recovered: %+v %v, want Failed %s", got.Status, err, ReasonOOMKilled)
	}
}

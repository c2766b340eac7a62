package pool

import (
	"context"
	"testing"
	"time"

	"github.com/moat-sandbox/moat/internal/lifecycle"
)

// TestOldAgentsAreDriven: after an upgrade, sandboxes still run agents
// of an older moat, which speak agent protocol version 1 (no version
// header). The server waits for them, claims them from a pool with env
// and restarts over them like over current agents.
func TestOldAgentsAreDriven(t *testing.T) {
	h := newHarness(t)
	ctx := context.Background()
	h.rt.SetAgentVersion(1)
	sb, err := h.svc.Create(ctx, lifecycle.CreateRequest{Image: "busybox", Entrypoint: []string{"sleep", "1d"}, Timeout: time.Hour})
	if err != nil || sb.Status.State != lifecycle.StateRunning {
		t.Fatalf("create with a version-1 agent: %+v, %v", sb, err)
	}
	if _, err := h.svc.CreatePool(ctx, testPool("old", 1, 1, 2)); err != nil {
		t.Fatal(err)
	}
	waitIdle(t, h.svc, "old", 1)
	claimed, err := h.svc.Create(ctx, lifecycle.CreateRequest{Extensions: map[string]string{lifecycle.ExtPoolRef: "old"}, Env: map[string]string{"B": "2"}})
	if err != nil {
		t.Fatalf("claim of a version-1 agent: %v", err)
	}
	if _, env, err := h.rt.AgentState(claimed.ID); err != nil || env["B"] != "2" {
		t.Errorf("the old agent did not get the claim's env: %v, %v", env, err)
	}
	h.svc.Close()

	// A new server process over the same sandboxes (agents still old).
	h.rt.SetAgentVersion(0)
	h.svc = h.newService(t)
	defer h.svc.Close()
	if err := h.svc.Recover(ctx); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{sb.ID, claimed.ID} {
		got, err := h.svc.Get(ctx, id)
		if err != nil || got.Status.State != lifecycle.StateRunning {
			t.Errorf("after restart %s: %+v, %v", id, got.Status, err)
		}
	}
}

package snapshot_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/moat-sandbox/moat/internal/errdefs"
	"github.com/moat-sandbox/moat/internal/lifecycle"
	"github.com/moat-sandbox/moat/internal/lifecycle/snapshot"
	"github.com/moat-sandbox/moat/internal/runtime"
)

// TestMemorySnapshot covers snapshots of sandboxes whose runtime can
// checkpoint them: the snapshot keeps the source's class, entrypoint and
// (server-side only) token; a restore runs from the checkpoint, gets its
// own token and the request's env, and refuses what it cannot honour.
func TestMemorySnapshot(t *testing.T) {
	h := newHarness(t)
	h.rt.SetCheckpointable(true)
	c := &fakeCommitter{}
	svc := h.snapService(t, c)
	ctx := context.Background()
	src, err := svc.Create(ctx, req(0))
	if err != nil {
		t.Fatal(err)
	}
	srcToken, _ := svc.AgentToken(ctx, src.ID)

	// Paused sources are refused: their processes cannot be continued.
	if err := svc.Pause(ctx, src.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := svc.CreateSnapshot(ctx, src.ID, ""); publicCode(err) != "SNAPSHOT::INVALID_SOURCE_STATE" {
		t.Fatalf("memory snapshot of a paused sandbox: %v", err)
	}
	if err := svc.Resume(ctx, src.ID); err != nil {
		t.Fatal(err)
	}

	sn, err := svc.CreateSnapshot(ctx, src.ID, "mem")
	if err != nil {
		t.Fatal(err)
	}
	if sn.Kind != snapshot.SnapshotMemory || sn.Status.State != snapshot.SnapshotReady || sn.Class != src.Class ||
		!slices.Equal(sn.Entrypoint, src.Entrypoint) || sn.AgentToken != srcToken || !strings.Contains(sn.Status.Message, "memory") {
		t.Fatalf("snapshot %+v (source %+v)", sn, src)
	}
	if !h.rt.HasCheckpoint(sn.ID) {
		t.Fatal("no checkpoint was taken")
	}
	// The image is the source's plus an empty layer (the checkpoint holds
	// the writable layer).
	if rec, ok := c.commits[lifecycle.SnapshotImagePrefix+sn.ID]; !ok || rec.base != "busybox" || len(rec.files) != 0 {
		t.Fatalf("commits %+v", c.commits)
	}
	if got, _ := svc.Get(ctx, src.ID); got.Status.State != lifecycle.StateRunning {
		t.Fatalf("source after snapshot: %s", got.Status.State)
	}

	// Requests a restore cannot honour.
	bad := []lifecycle.CreateRequest{
		{SnapshotID: sn.ID, Volumes: []lifecycle.Volume{{Name: "v", MountPath: "/data"}}},
		{SnapshotID: sn.ID, Extensions: map[string]string{lifecycle.ExtRuntimeClass: "runc"}},
	}
	for _, r := range bad {
		if _, err := svc.Create(ctx, r); !errdefs.IsInvalidArgument(err) {
			t.Errorf("create %+v: %v, want invalid argument", r, err)
		}
	}

	var specs []runtime.Spec
	var mu sync.Mutex
	h.hooks.Create = func(s runtime.Spec) error {
		mu.Lock()
		specs = append(specs, s)
		mu.Unlock()
		return nil
	}
	forks, err := svc.CreateBatch(ctx, lifecycle.CreateRequest{SnapshotID: sn.ID, Entrypoint: []string{"ignored"},
		Env: map[string]string{"FORKED": "yes"}}, 2)
	if err != nil {
		t.Fatal(err)
	}
	h.hooks.Create = nil
	for i, f := range forks {
		if f.Status.State != lifecycle.StateRunning || !slices.Equal(f.Entrypoint, src.Entrypoint) || f.Class != src.Class {
			t.Fatalf("fork %+v", f)
		}
		if specs[i].Checkpoint != sn.ID {
			t.Fatalf("runtime spec %+v has no checkpoint", specs[i])
		}
		want, _ := svc.AgentToken(ctx, f.ID)
		tok, env, err := h.rt.AgentState(f.ID)
		if err != nil || want == srcToken || tok != want || env["FORKED"] != "yes" {
			t.Fatalf("fork agent: token %q (want %q, source %q), env %v, err %v", tok, want, srcToken, env, err)
		}
	}

	// A failed checkpoint leaves a Failed snapshot and no checkpoint; a
	// failed commit removes the checkpoint it took.
	c.err = errors.New("disk full")
	failed, err := svc.CreateSnapshot(ctx, src.ID, "")
	if err == nil || failed.Status.State != snapshot.SnapshotFailed {
		t.Fatalf("snapshot with a failing commit: %+v %v", failed, err)
	}
	c.err = nil
	if h.rt.HasCheckpoint(failed.ID) {
		t.Fatal("the failed snapshot's checkpoint was left")
	}

	if err := svc.DeleteSnapshot(ctx, sn.ID); publicCode(err) != "SNAPSHOT::IN_USE" {
		t.Fatalf("delete in use: %v", err)
	}
	for _, f := range forks {
		if err := svc.Delete(ctx, f.ID); err != nil {
			t.Fatal(err)
		}
	}
	if err := svc.DeleteSnapshot(ctx, sn.ID); err != nil {
		t.Fatal(err)
	}
	if h.rt.HasCheckpoint(sn.ID) {
		t.Fatal("checkpoint left after the snapshot was deleted")
	}

	// A runtime that can no longer restore it (e.g. runsc downgraded)
	// refuses clearly instead of starting the wrong thing.
	sn2, err := svc.CreateSnapshot(ctx, src.ID, "")
	if err != nil {
		t.Fatal(err)
	}
	h.rt.SetCheckpointable(false)
	if _, err := svc.Create(ctx, lifecycle.CreateRequest{SnapshotID: sn2.ID}); publicCode(err) != "SANDBOX::API_NOT_SUPPORTED" {
		t.Fatalf("restore without checkpoint support: %v", err)
	}
}

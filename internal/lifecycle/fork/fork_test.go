package fork_test

import (
	"context"
	"errors"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/moat-sandbox/moat/internal/errdefs"
	"github.com/moat-sandbox/moat/internal/image"
	"github.com/moat-sandbox/moat/internal/lifecycle"
	"github.com/moat-sandbox/moat/internal/lifecycle/fork"
	"github.com/moat-sandbox/moat/internal/lifecycle/snapshot"
	"github.com/moat-sandbox/moat/internal/runtime/fake"
	"github.com/moat-sandbox/moat/internal/store"
)

type fakeImages struct{}

func (fakeImages) Ensure(ctx context.Context, ref string, auth *image.Auth) (image.Image, error) {
	return image.Image{Name: ref, ID: "sha256:00"}, nil
}

type committer struct{}

func (committer) Commit(ctx context.Context, upper, base, name string) (image.Image, error) {
	return image.Image{Name: name, ID: "sha256:11"}, nil
}
func (committer) Remove(ctx context.Context, ref string) error { return nil }

// hygiene records the children it was asked about; fail fails the nth.
type hygiene struct {
	mu   sync.Mutex
	n    int
	fail int
	seen []string
}

func (h *hygiene) Apply(ctx context.Context, sb lifecycle.Sandbox, memory bool) (fork.Identity, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.n++
	h.seen = append(h.seen, sb.ID)
	if h.n == h.fail {
		return fork.Identity{}, errors.New("no agent")
	}
	return fork.Identity{Hostname: fork.Hostname(sb.ID), MachineID: fork.NewMachineID()}, nil
}

type harness struct {
	core  *lifecycle.Service
	snaps *snapshot.Snapshots
	forks *fork.Forks
	rt    *fake.Runtime
	db    *store.DB
	hyg   *hygiene
}

func open(t *testing.T, rt *fake.Runtime, db *store.DB) *harness {
	t.Helper()
	core, err := lifecycle.New(lifecycle.Config{}, lifecycle.Deps{Store: db, Runtime: rt, Images: fakeImages{}})
	if err != nil {
		t.Fatal(err)
	}
	snaps, err := snapshot.New(core, committer{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	core.Use(lifecycle.Features{Snapshots: snaps})
	h := &harness{core: core, snaps: snaps, rt: rt, db: db, hyg: &hygiene{}}
	h.forks = fork.New(core, core, snaps, h.hyg)
	if err := core.Recover(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := h.forks.Reconcile(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.forks.Wait(); core.Close() })
	return h
}

func newHarness(t *testing.T) *harness {
	t.Helper()
	db, err := store.Open(context.Background(), filepath.Join(t.TempDir(), "state.db"), time.Second)
	if err != nil {
		t.Fatal(err)
	}
	rt := fake.New(fake.Hooks{})
	t.Cleanup(func() { rt.Close(); db.Close() })
	return open(t, rt, db)
}

func (h *harness) source(t *testing.T) lifecycle.Sandbox {
	t.Helper()
	sb, err := h.core.Create(context.Background(), lifecycle.CreateRequest{Image: "busybox", Entrypoint: []string{"sleep", "1000"},
		Timeout: time.Hour, Env: map[string]string{"A": "src", "B": "src"}, Metadata: map[string]string{"team": "a"}})
	if err != nil {
		t.Fatal(err)
	}
	return sb
}

func (h *harness) wait(t *testing.T, id string) fork.Operation {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		op, err := h.forks.Get(context.Background(), id)
		if err != nil {
			t.Fatal(err)
		}
		if op.State != fork.StateRunning {
			return op
		}
		if time.Now().After(deadline) {
			t.Fatalf("operation %s still Running", id)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestForkMakesIndependentChildren(t *testing.T) {
	h := newHarness(t)
	src := h.source(t)
	op, err := h.forks.Fork(context.Background(), src.ID, fork.Request{Count: 3,
		All:      fork.Override{Env: map[string]string{"B": "all"}, Metadata: map[string]string{"role": "child"}},
		Children: []fork.Override{{Env: map[string]string{"A": "first"}, Timeout: 2 * time.Hour}}})
	if err != nil {
		t.Fatal(err)
	}
	if op.State != fork.StateRunning || op.SnapshotID == "" || op.Count != 3 {
		t.Fatalf("accepted: %+v", op)
	}
	op = h.wait(t, op.ID)
	if op.State != fork.StateSucceeded || len(op.Children) != 3 {
		t.Fatalf("done: %+v", op)
	}
	seen := map[string]bool{src.AgentToken: true}
	ids := map[string]bool{src.ID: true}
	for i, c := range op.Children {
		sb, err := h.core.Get(context.Background(), c.ID)
		if err != nil {
			t.Fatal(err)
		}
		if sb.Status.State != lifecycle.StateRunning || sb.SnapshotID != op.SnapshotID || sb.Extensions[fork.ExtOperation] != op.ID {
			t.Errorf("child %d: %+v", i, sb)
		}
		if seen[sb.AgentToken] || ids[sb.ID] || c.MachineID == "" || c.Hostname != fork.Hostname(sb.ID) {
			t.Errorf("child %d shares an identity: %+v", i, c)
		}
		seen[sb.AgentToken], ids[sb.ID] = true, true
		wantA := "src"
		if i == 0 {
			wantA = "first"
		}
		if sb.Env["A"] != wantA || sb.Env["B"] != "all" || sb.Metadata["team"] != "a" || sb.Metadata["role"] != "child" {
			t.Errorf("child %d: env %v metadata %v", i, sb.Env, sb.Metadata)
		}
		if sb.ExpiresAt == nil {
			t.Errorf("child %d has no expiry", i)
		} else if d := sb.ExpiresAt.Sub(sb.CreatedAt); (i == 0 && d != 2*time.Hour) || (i > 0 && (d > time.Hour || d < 59*time.Minute)) {
			t.Errorf("child %d lives %s", i, d)
		}
	}
	if got, _ := h.core.Get(context.Background(), src.ID); got.Status.State != lifecycle.StateRunning {
		t.Errorf("source is %s after the fork", got.Status.State)
	}
}

func TestForkRefusesBadInput(t *testing.T) {
	h := newHarness(t)
	src := h.source(t)
	ctx := context.Background()
	for _, tc := range []struct {
		name string
		id   string
		req  fork.Request
		is   func(error) bool
	}{
		{"count 0", src.ID, fork.Request{Count: 0}, errdefs.IsInvalidArgument},
		{"count 101", src.ID, fork.Request{Count: 101}, errdefs.IsInvalidArgument},
		{"children > count", src.ID, fork.Request{Count: 1, Children: make([]fork.Override, 2)}, errdefs.IsInvalidArgument},
		{"bad env", src.ID, fork.Request{Count: 2, Children: []fork.Override{{}, {Env: map[string]string{"A=B": "x"}}}}, errdefs.IsInvalidArgument},
		{"bad policy", src.ID, fork.Request{Count: 1, All: fork.Override{NetworkPolicy: []byte(`{"defaultAction":"maybe"}`)}}, func(err error) bool {
			return errdefs.IsInvalidArgument(err) || errdefs.IsNotImplemented(err)
		}},
		{"unknown source", "nope", fork.Request{Count: 1}, errdefs.IsNotFound},
	} {
		_, err := h.forks.Fork(ctx, tc.id, tc.req)
		if err == nil || !tc.is(err) {
			t.Errorf("%s: %v", tc.name, err)
			continue
		}
		if p, ok := errdefs.PublicOf(err); !ok || p.Code == "" || p.Message == "" {
			t.Errorf("%s: no public code and message: %v", tc.name, err)
		}
	}
	if err := h.core.Pause(ctx, src.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := h.forks.Fork(ctx, src.ID, fork.Request{Count: 1}); !errdefs.IsFailedPrecondition(err) {
		t.Errorf("paused source: %v", err)
	}
	if n := len(h.hyg.seen); n != 0 {
		t.Errorf("refused forks made %d children", n)
	}
	if sns, _ := h.snaps.ListSnapshots(ctx, snapshot.SnapshotFilter{}, 1, 100); len(sns) != 0 {
		t.Errorf("refused forks left snapshots: %+v", sns)
	}
}

// A fork is all or nothing: a child that fails takes its siblings along.
func TestForkAllOrNothing(t *testing.T) {
	h := newHarness(t)
	src := h.source(t)
	h.hyg.fail = 2
	op, err := h.forks.Fork(context.Background(), src.ID, fork.Request{Count: 4})
	if err != nil {
		t.Fatal(err)
	}
	op = h.wait(t, op.ID)
	if op.State != fork.StateFailed || op.Error == nil || op.Error.Code == "" || len(op.Children) != 0 {
		t.Fatalf("op: %+v", op)
	}
	if n := live(h); n != 1 {
		h.core.Each(func(e *lifecycle.Entry) { t.Logf("%+v", *e.Sandbox()) })
		t.Fatalf("%d live sandboxes after a failed fork, want the source only", n)
	}
	if sns, _ := h.snaps.ListSnapshots(context.Background(), snapshot.SnapshotFilter{}, 1, 100); len(sns) != 0 {
		t.Errorf("the failed fork's snapshot is left: %+v", sns)
	}
}

func live(h *harness) int {
	n := 0
	h.core.Each(func(e *lifecycle.Entry) {
		if st := e.Sandbox().Status.State; st != lifecycle.StateTerminated && st != lifecycle.StateFailed {
			n++
		}
	})
	return n
}

// A server that stopped mid-fork: on start the operation is Failed and
// the children it had made are deleted; the source lives on.
func TestReconcileInterruptedFork(t *testing.T) {
	h := newHarness(t)
	src := h.source(t)
	op, err := h.forks.Fork(context.Background(), src.ID, fork.Request{Count: 2})
	if err != nil {
		t.Fatal(err)
	}
	done := h.wait(t, op.ID)
	if done.State != fork.StateSucceeded {
		t.Fatalf("fork: %+v", done)
	}
	// Make it look interrupted: the record says Running, as it did when
	// the children were being made.
	rec := done
	rec.State, rec.Children = fork.StateRunning, []fork.Child{}
	if err := h.db.Put(fork.Bucket, rec.ID, &rec); err != nil {
		t.Fatal(err)
	}
	h.forks.Wait()
	h.core.Close()
	h2 := open(t, h.rt, h.db)
	got, err := h2.forks.Get(context.Background(), op.ID)
	if err != nil {
		t.Fatal(err)
	}
	if got.State != fork.StateFailed || got.Error == nil || got.Error.Code != "OPERATION::INTERRUPTED" {
		t.Fatalf("after restart: %+v", got)
	}
	for _, c := range done.Children {
		if _, err := h2.core.Get(context.Background(), c.ID); !errdefs.IsNotFound(err) {
			t.Errorf("child %s of the interrupted fork: %v", c.ID, err)
		}
	}
	if sb, err := h2.core.Get(context.Background(), src.ID); err != nil || sb.Status.State != lifecycle.StateRunning {
		t.Errorf("source after restart: %+v %v", sb, err)
	}
}

// The fork's snapshot goes once its last child is gone.
func TestSweepDropsTheForkSnapshot(t *testing.T) {
	h := newHarness(t)
	src := h.source(t)
	ctx := context.Background()
	op, err := h.forks.Fork(ctx, src.ID, fork.Request{Count: 2})
	if err != nil {
		t.Fatal(err)
	}
	op = h.wait(t, op.ID)
	h.forks.Sweep(ctx)
	if _, err := h.snaps.GetSnapshot(ctx, op.SnapshotID); err != nil {
		t.Fatalf("the snapshot went while children use it: %v", err)
	}
	for _, c := range op.Children {
		if err := h.core.Delete(ctx, c.ID); err != nil {
			t.Fatal(err)
		}
	}
	h.forks.Sweep(ctx)
	if _, err := h.snaps.GetSnapshot(ctx, op.SnapshotID); !errdefs.IsNotFound(err) {
		t.Fatalf("the snapshot of a fork without children: %v", err)
	}
	if got, err := h.forks.Get(ctx, op.ID); err != nil || got.State != fork.StateSucceeded {
		t.Fatalf("the operation after the sweep: %+v %v", got, err)
	}
}

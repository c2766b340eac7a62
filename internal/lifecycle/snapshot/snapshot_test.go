package snapshot_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/moat-sandbox/moat/internal/errdefs"
	"github.com/moat-sandbox/moat/internal/image"
	"github.com/moat-sandbox/moat/internal/lifecycle"
	"github.com/moat-sandbox/moat/internal/lifecycle/pool"
	"github.com/moat-sandbox/moat/internal/lifecycle/snapshot"
	"github.com/moat-sandbox/moat/internal/runtime"
	"github.com/moat-sandbox/moat/internal/sandbox"
)

// fakeCommitter records commits: for each image name, the base ref and
// the file names found in the upper dir at commit time.
type fakeCommitter struct {
	mu  sync.Mutex
	err error
	// during, if set, runs inside Commit.
	during  func()
	commits map[string]commitRec
	removed []string
}

type commitRec struct {
	base  string
	files []string
}

func (f *fakeCommitter) Commit(ctx context.Context, upperDir, baseRef, name string) (image.Image, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.during != nil {
		f.during()
	}
	if f.err != nil {
		return image.Image{}, f.err
	}
	ents, err := os.ReadDir(upperDir)
	if err != nil {
		return image.Image{}, err
	}
	var files []string
	for _, e := range ents {
		files = append(files, e.Name())
	}
	if f.commits == nil {
		f.commits = map[string]commitRec{}
	}
	f.commits[name] = commitRec{base: baseRef, files: files}
	return image.Image{Name: name, ID: "sha256:11"}, nil
}

func (f *fakeCommitter) Remove(ctx context.Context, ref string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.removed = append(f.removed, ref)
	return nil
}

func (h *harness) snapService(t *testing.T, c *fakeCommitter) *sandbox.Service {
	t.Helper()
	svc, err := sandbox.New(sandbox.Config{}, sandbox.Deps{Deps: lifecycle.Deps{Store: h.db, Runtime: h.rt, Images: fakeImages{}, Now: h.clk.Now}, Committer: c})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(svc.Close)
	return svc
}

func publicCode(err error) string {
	if p, ok := errdefs.PublicOf(err); ok {
		return p.Code
	}
	return ""
}

func TestSnapshotCreateAndRestore(t *testing.T) {
	h := newHarness(t)
	c := &fakeCommitter{}
	svc := h.snapService(t, c)
	ctx := context.Background()
	src, err := svc.Create(ctx, req(0))
	if err != nil {
		t.Fatal(err)
	}
	upper, err := h.rt.SnapshotDir(ctx, src.ID)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(upper, "hello"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	// The sandbox is frozen while committing.
	var during runtime.State
	c.during = func() {
		st, _ := h.rt.Status(ctx, src.ID)
		during = st.State
	}
	sn, err := svc.CreateSnapshot(ctx, src.ID, "first")
	if err != nil {
		t.Fatal(err)
	}
	c.during = nil
	if during != runtime.StatePaused {
		t.Fatalf("sandbox was %s during the commit", during)
	}
	if sn.Status.State != snapshot.SnapshotReady || sn.Status.Reason != snapshot.ReasonSnapshotReady || sn.SandboxID != src.ID || sn.Name != "first" || sn.ID == "" {
		t.Fatalf("snapshot %+v", sn)
	}
	rec, ok := c.commits[lifecycle.SnapshotImagePrefix+sn.ID]
	if !ok || rec.base != "busybox" || !slices.Equal(rec.files, []string{"hello"}) {
		t.Fatalf("commits %+v", c.commits)
	}
	if st, _ := h.rt.Status(ctx, src.ID); st.State != runtime.StateRunning {
		t.Fatalf("source sandbox not thawed: %s", st.State)
	}
	if got, _ := svc.Get(ctx, src.ID); got.Status.State != lifecycle.StateRunning {
		t.Fatalf("source sandbox state %s", got.Status.State)
	}

	// Restore: a batch of 3 from the snapshot, default entrypoint.
	var specs []runtime.Spec
	var mu sync.Mutex
	h.hooks.Create = func(s runtime.Spec) error {
		mu.Lock()
		specs = append(specs, s)
		mu.Unlock()
		return nil
	}
	forks, err := svc.CreateBatch(ctx, lifecycle.CreateRequest{SnapshotID: sn.ID}, 3)
	if err != nil {
		t.Fatal(err)
	}
	if len(forks) != 3 || len(specs) != 3 {
		t.Fatalf("forks %d specs %d", len(forks), len(specs))
	}
	for i, f := range forks {
		if f.SnapshotID != sn.ID || f.Image != "" || !slices.Equal(f.Entrypoint, []string{"tail", "-f", "/dev/null"}) || f.Status.State != lifecycle.StateRunning {
			t.Fatalf("fork %+v", f)
		}
		if specs[i].Image != lifecycle.SnapshotImagePrefix+sn.ID {
			t.Fatalf("spec image %q", specs[i].Image)
		}
	}
	// A snapshot of a fork is based on the snapshot image.
	sn2, err := svc.CreateSnapshot(ctx, forks[0].ID, "")
	if err != nil {
		t.Fatal(err)
	}
	if c.commits[lifecycle.SnapshotImagePrefix+sn2.ID].base != lifecycle.SnapshotImagePrefix+sn.ID {
		t.Fatalf("fork snapshot base %q", c.commits[lifecycle.SnapshotImagePrefix+sn2.ID].base)
	}

	// Delete is refused while any fork exists.
	for i, f := range forks {
		err := svc.DeleteSnapshot(ctx, sn.ID)
		if publicCode(err) != "SNAPSHOT::IN_USE" || !errors.Is(err, errdefs.ErrFailedPrecondition) {
			t.Fatalf("delete with %d forks left: %v", 3-i, err)
		}
		if got, _ := svc.GetSnapshot(ctx, sn.ID); got.Status.State != snapshot.SnapshotReady {
			t.Fatalf("refused delete left state %s", got.Status.State)
		}
		if err := svc.Delete(ctx, f.ID); err != nil {
			t.Fatal(err)
		}
	}
	if err := svc.DeleteSnapshot(ctx, sn.ID); err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(c.removed, lifecycle.SnapshotImagePrefix+sn.ID) {
		t.Fatalf("image not removed: %v", c.removed)
	}
	if _, err := svc.GetSnapshot(ctx, sn.ID); !errdefs.IsNotFound(err) {
		t.Fatalf("get deleted: %v", err)
	}
	if err := svc.DeleteSnapshot(ctx, sn.ID); !errdefs.IsNotFound(err) {
		t.Fatalf("delete twice: %v", err)
	}
	_, err = svc.Create(ctx, lifecycle.CreateRequest{SnapshotID: sn.ID})
	if !errdefs.IsNotFound(err) || publicCode(err) != "SNAPSHOT::NOT_FOUND" {
		t.Fatalf("create from deleted snapshot: %v", err)
	}
	if _, err := svc.Create(ctx, lifecycle.CreateRequest{SnapshotID: sn.ID, Image: "busybox"}); !errdefs.IsInvalidArgument(err) {
		t.Fatalf("image+snapshotId: %v", err)
	}
}

func TestSnapshotSourceStates(t *testing.T) {
	h := newHarness(t)
	c := &fakeCommitter{}
	svc := h.snapService(t, c)
	ctx := context.Background()

	if _, err := svc.CreateSnapshot(ctx, "nope", ""); !errdefs.IsNotFound(err) {
		t.Fatalf("unknown sandbox: %v", err)
	}
	// Paused: allowed, and stays paused.
	sb, err := svc.Create(ctx, req(0))
	if err != nil {
		t.Fatal(err)
	}
	if err := svc.Pause(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := svc.CreateSnapshot(ctx, sb.ID, ""); err != nil {
		t.Fatal(err)
	}
	if st, _ := h.rt.Status(ctx, sb.ID); st.State != runtime.StatePaused {
		t.Fatalf("paused sandbox is %s after snapshot", st.State)
	}
	// Failed (create failed): refused.
	h.hooks.Create = func(runtime.Spec) error { return errors.New("boom") }
	failed, err := svc.Create(ctx, req(0))
	if err == nil {
		t.Fatal("create should fail")
	}
	h.hooks.Create = nil
	_, err = svc.CreateSnapshot(ctx, failed.ID, "")
	if publicCode(err) != "SNAPSHOT::INVALID_SOURCE_STATE" || !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Fatalf("snapshot of failed sandbox: %v", err)
	}
	if _, err := svc.CreateSnapshot(ctx, sb.ID, "bad\x00name"); !errdefs.IsInvalidArgument(err) {
		t.Fatalf("bad name: %v", err)
	}

	// A failed commit leaves a Failed snapshot, which cannot be restored
	// but can be deleted.
	c.err = errors.New("disk full")
	sn, err := svc.CreateSnapshot(ctx, sb.ID, "")
	if err == nil || sn.Status.State != snapshot.SnapshotFailed || publicCode(err) != "SNAPSHOT::CAPTURE_FAILED" {
		t.Fatalf("failed commit: %+v %v", sn, err)
	}
	if !strings.Contains(err.Error(), "disk full") {
		t.Fatalf("cause lost: %v", err)
	}
	if _, err := svc.Create(ctx, lifecycle.CreateRequest{SnapshotID: sn.ID}); publicCode(err) != "SNAPSHOT::INVALID_STATE" {
		t.Fatalf("create from failed snapshot: %v", err)
	}
	if err := svc.DeleteSnapshot(ctx, sn.ID); err != nil {
		t.Fatal(err)
	}

	// Without a committer, snapshots are not supported.
	plain := h.newService(t)
	if _, err := plain.CreateSnapshot(ctx, sb.ID, ""); !errors.Is(err, errdefs.ErrNotImplemented) {
		t.Fatalf("no committer: %v", err)
	}
}

func TestSnapshotListFilters(t *testing.T) {
	h := newHarness(t)
	c := &fakeCommitter{}
	svc := h.snapService(t, c)
	ctx := context.Background()
	a, err := svc.Create(ctx, req(0))
	if err != nil {
		t.Fatal(err)
	}
	b, err := svc.Create(ctx, req(0))
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for i, src := range []string{a.ID, a.ID, b.ID} {
		h.clk.Add(time.Second)
		sn, err := svc.CreateSnapshot(ctx, src, "")
		if err != nil {
			t.Fatal(i, err)
		}
		ids = append(ids, sn.ID)
	}
	c.err = errors.New("boom")
	h.clk.Add(time.Second)
	failed, _ := svc.CreateSnapshot(ctx, b.ID, "")
	c.err = nil

	idsOf := func(sns []snapshot.Snapshot) []string {
		var out []string
		for _, s := range sns {
			out = append(out, s.ID)
		}
		return out
	}
	for i, tc := range []struct {
		f          snapshot.SnapshotFilter
		page, size int
		want       []string
		total      int
	}{
		{snapshot.SnapshotFilter{}, 1, 20, []string{failed.ID, ids[2], ids[1], ids[0]}, 4},
		{snapshot.SnapshotFilter{SandboxID: a.ID}, 1, 20, []string{ids[1], ids[0]}, 2},
		{snapshot.SnapshotFilter{SandboxID: b.ID, States: []snapshot.SnapshotState{snapshot.SnapshotReady}}, 1, 20, []string{ids[2]}, 1},
		{snapshot.SnapshotFilter{States: []snapshot.SnapshotState{snapshot.SnapshotFailed}}, 1, 20, []string{failed.ID}, 1},
		{snapshot.SnapshotFilter{States: []snapshot.SnapshotState{snapshot.SnapshotFailed, snapshot.SnapshotReady}}, 2, 3, []string{ids[0]}, 4},
		{snapshot.SnapshotFilter{SandboxID: "other"}, 1, 20, nil, 0},
		{snapshot.SnapshotFilter{}, 3, 2, nil, 4},
	} {
		got, total := svc.ListSnapshots(ctx, tc.f, tc.page, tc.size)
		if total != tc.total || !slices.Equal(idsOf(got), tc.want) {
			t.Errorf("%d: got %v (%d), want %v (%d)", i, idsOf(got), total, tc.want, tc.total)
		}
	}
	if st, err := snapshot.ParseSnapshotState("ready"); err != nil || st != snapshot.SnapshotReady {
		t.Fatalf("parse: %v %v", st, err)
	}
	if _, err := snapshot.ParseSnapshotState("Running"); !errdefs.IsInvalidArgument(err) {
		t.Fatalf("parse bad: %v", err)
	}
}

func TestSnapshotsSurviveRestart(t *testing.T) {
	h := newHarness(t)
	c := &fakeCommitter{}
	svc := h.snapService(t, c)
	ctx := context.Background()
	src, err := svc.Create(ctx, req(0))
	if err != nil {
		t.Fatal(err)
	}
	sn, err := svc.CreateSnapshot(ctx, src.ID, "keep")
	if err != nil {
		t.Fatal(err)
	}
	fork, err := svc.Create(ctx, lifecycle.CreateRequest{SnapshotID: sn.ID, Entrypoint: []string{"sleep", "9"}})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(fork.Entrypoint, []string{"sleep", "9"}) {
		t.Fatalf("entrypoint %v", fork.Entrypoint)
	}
	// A record left Creating by a crash mid-commit.
	stale := snapshot.Snapshot{ID: "stale", SandboxID: src.ID, Image: lifecycle.SnapshotImagePrefix + "stale",
		Status: snapshot.SnapshotStatus{State: snapshot.SnapshotCreating}, CreatedAt: h.clk.Now()}
	if err := h.db.Put(snapshot.SnapshotBucket, stale.ID, &stale); err != nil {
		t.Fatal(err)
	}
	svc.Close()

	svc2 := h.snapService(t, c)
	if err := svc2.Recover(ctx); err != nil {
		t.Fatal(err)
	}
	got, err := svc2.GetSnapshot(ctx, sn.ID)
	if err != nil || got.Status.State != snapshot.SnapshotReady || got.Name != "keep" || got.SandboxID != src.ID || !got.CreatedAt.Equal(sn.CreatedAt) {
		t.Fatalf("after restart: %+v %v", got, err)
	}
	if g, _ := svc2.GetSnapshot(ctx, "stale"); g.Status.State != snapshot.SnapshotFailed || g.Status.Reason != snapshot.ReasonSnapshotCaptureFailed {
		t.Fatalf("stale snapshot %+v", g)
	}
	// The re-adopted fork still holds the snapshot.
	if err := svc2.DeleteSnapshot(ctx, sn.ID); publicCode(err) != "SNAPSHOT::IN_USE" {
		t.Fatalf("delete in use after restart: %v", err)
	}
	if _, err := svc2.Create(ctx, lifecycle.CreateRequest{SnapshotID: sn.ID}); err != nil {
		t.Fatalf("restore after restart: %v", err)
	}
}

// TestForkPool: a pool whose template is a snapshot keeps forks warm, a
// batch claim with the snapshot's id takes them, and the snapshot cannot
// be deleted while the pool exists.
func TestForkPool(t *testing.T) {
	h := newHarness(t)
	svc := h.snapService(t, &fakeCommitter{})
	ctx := context.Background()
	src, err := svc.Create(ctx, req(0))
	if err != nil {
		t.Fatal(err)
	}
	sn, err := svc.CreateSnapshot(ctx, src.ID, "")
	if err != nil {
		t.Fatal(err)
	}
	bad := pool.Pool{Name: "both", Template: pool.PoolTemplate{Image: "busybox", SnapshotID: sn.ID}, Capacity: pool.Capacity{BufferMax: 1, PoolMax: 1}}
	if _, err := svc.CreatePool(ctx, bad); !errdefs.IsInvalidArgument(err) {
		t.Fatalf("pool with image and snapshot: %v", err)
	}
	missing := pool.Pool{Name: "missing", Template: pool.PoolTemplate{SnapshotID: "nope"}, Capacity: pool.Capacity{BufferMax: 1, PoolMax: 1}}
	if _, err := svc.CreatePool(ctx, missing); !errdefs.IsNotFound(err) && !errdefs.IsInvalidArgument(err) {
		t.Fatalf("pool of a missing snapshot: %v", err)
	}
	p := pool.Pool{Name: "forks", Template: pool.PoolTemplate{SnapshotID: sn.ID}, Capacity: pool.Capacity{BufferMin: 4, BufferMax: 4, PoolMax: 10}}
	if _, err := svc.CreatePool(ctx, p); err != nil {
		t.Fatal(err)
	}
	waitIdle(t, svc, "forks", 4)
	before, _ := h.rt.List(ctx)
	forks, err := svc.CreateBatch(ctx, lifecycle.CreateRequest{SnapshotID: sn.ID, Extensions: map[string]string{lifecycle.ExtPoolRef: "forks"}}, 4)
	if err != nil {
		t.Fatal(err)
	}
	after, _ := h.rt.List(ctx)
	// The claim itself started no container (refills may have begun, so
	// only count what existed before).
	for _, f := range forks {
		if f.SnapshotID != sn.ID || f.Status.State != lifecycle.StateRunning || f.Pool != "" && f.Pool != "forks" {
			t.Fatalf("fork %+v", f)
		}
		found := false
		for _, b := range before {
			if b.ID == f.ID {
				found = true
			}
		}
		if !found {
			t.Fatalf("fork %s was created cold (before %d, after %d)", f.ID, len(before), len(after))
		}
	}
	other, err := svc.CreateSnapshot(ctx, src.ID, "")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := svc.CreateBatch(ctx, lifecycle.CreateRequest{SnapshotID: other.ID, Extensions: map[string]string{lifecycle.ExtPoolRef: "forks"}}, 1); !errdefs.IsInvalidArgument(err) {
		t.Fatalf("claim with another snapshot: %v", err)
	}
	for _, f := range forks {
		if err := svc.Delete(ctx, f.ID); err != nil {
			t.Fatal(err)
		}
	}
	if err := svc.DeleteSnapshot(ctx, sn.ID); publicCode(err) != "SNAPSHOT::IN_USE" {
		t.Fatalf("delete of a pool's snapshot: %v", err)
	}
	if err := svc.DeletePool(ctx, "forks"); err != nil {
		t.Fatal(err)
	}
	if err := svc.DeleteSnapshot(ctx, sn.ID); err != nil {
		t.Fatal(err)
	}
}

package snapshot_test

import (
	"context"
	"strings"
	"sync"
	"testing"

	"github.com/moat-sandbox/moat/internal/errdefs"
	"github.com/moat-sandbox/moat/internal/lifecycle"
	"github.com/moat-sandbox/moat/internal/lifecycle/snapshot"
	"github.com/moat-sandbox/moat/internal/runtime"
	"github.com/moat-sandbox/moat/internal/runtime/fake"
	"github.com/moat-sandbox/moat/internal/sandbox"
)

// imageRuntime is the fake runtime committing snapshot images itself
// (runtime.ImageSnapshotter), as the kubernetes backend does.
type imageRuntime struct {
	*fake.Runtime
	mu      sync.Mutex
	err     error
	made    map[string]string // snapshot name -> sandbox ID
	removed []string
}

func (r *imageRuntime) SnapshotImage(ctx context.Context, id, name string) (string, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.err != nil {
		return "", r.err
	}
	if _, err := r.Status(ctx, id); err != nil {
		return "", err
	}
	r.made[name] = id
	return "registry.test/snaps/" + name + "@sha256:aa", nil
}

func (r *imageRuntime) RemoveSnapshotImage(ctx context.Context, name string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.removed = append(r.removed, name)
	return nil
}

// TestSnapshotImageRuntime: on a runtime that commits snapshot images
// itself, a snapshot is the image it names (no committer needed), a
// create from the snapshot runs that image, deleting the snapshot
// removes it, a runtime's refusal leaves no record (501) and a failure
// a Failed one with the runtime's words.
func TestSnapshotImageRuntime(t *testing.T) {
	h := newHarness(t)
	var mu sync.Mutex
	var images []string
	h.hooks.Create = func(s runtime.Spec) error {
		mu.Lock()
		images = append(images, s.Image)
		mu.Unlock()
		return nil
	}
	rt := &imageRuntime{Runtime: h.rt, made: map[string]string{}}
	svc, err := sandbox.New(sandbox.Config{}, sandbox.Deps{Deps: lifecycle.Deps{Store: h.db, Runtime: rt, Images: fakeImages{}, Now: h.clk.Now}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(svc.Close)
	ctx := context.Background()
	src, err := svc.Create(ctx, req(0))
	if err != nil {
		t.Fatal(err)
	}
	sn, err := svc.CreateSnapshot(ctx, src.ID, "k8s")
	if err != nil {
		t.Fatal(err)
	}
	want := "registry.test/snaps/" + sn.ID + "@sha256:aa"
	if sn.Status.State != snapshot.SnapshotReady || sn.Image != want || rt.made[sn.ID] != src.ID {
		t.Fatalf("snapshot %+v (made %v)", sn, rt.made)
	}
	child, err := svc.Create(ctx, lifecycle.CreateRequest{SnapshotID: sn.ID})
	if err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	got := images[len(images)-1]
	mu.Unlock()
	if got != want {
		t.Fatalf("sandbox from the snapshot runs %q, want %q", got, want)
	}
	if err := svc.DeleteSnapshot(ctx, sn.ID); publicCode(err) != "SNAPSHOT::IN_USE" {
		t.Fatalf("delete in use: %v", err)
	}
	if err := svc.Delete(ctx, child.ID); err != nil {
		t.Fatal(err)
	}
	if err := svc.DeleteSnapshot(ctx, sn.ID); err != nil {
		t.Fatal(err)
	}
	if len(rt.removed) != 1 || rt.removed[0] != sn.ID {
		t.Fatalf("removed %v", rt.removed)
	}

	// Refused by the runtime: as a runtime without snapshots, no record.
	rt.err = errdefs.Newf(errdefs.ErrNotImplemented, "no registry")
	if _, err := svc.CreateSnapshot(ctx, src.ID, "refused"); publicCode(err) != "SANDBOX::API_NOT_SUPPORTED" {
		t.Fatalf("refused snapshot: %v", err)
	}
	if list, n := svc.ListSnapshots(ctx, snapshot.SnapshotFilter{}, 1, 10); n != 0 {
		t.Fatalf("a refused snapshot was recorded: %+v", list)
	}
	// Failed in the runtime: recorded Failed, the error says why.
	rt.err = errdefs.Newf(errdefs.ErrUnavailable, "no moat node answered")
	_, err = svc.CreateSnapshot(ctx, src.ID, "failed")
	if p, ok := errdefs.PublicOf(err); !ok || p.Code != "SNAPSHOT::CAPTURE_FAILED" || !strings.Contains(p.Message, "no moat node answered") {
		t.Fatalf("failed snapshot: %v", err)
	}
	if list, _ := svc.ListSnapshots(ctx, snapshot.SnapshotFilter{States: []snapshot.SnapshotState{snapshot.SnapshotFailed}}, 1, 10); len(list) != 1 {
		t.Fatalf("failed snapshots %+v", list)
	}
	if got, _ := svc.Get(ctx, src.ID); got.Status.State != lifecycle.StateRunning {
		t.Fatalf("source is %s", got.Status.State)
	}
}

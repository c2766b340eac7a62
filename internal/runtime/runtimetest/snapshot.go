package runtimetest

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/moat-sandbox/moat/internal/errdefs"
	"github.com/moat-sandbox/moat/internal/runtime"
)

// snapshotImage: a backend that commits snapshot images itself
// (runtime.ImageSnapshotter) captures a running sandbox's files, the
// sandbox keeps running, sandboxes created from the image see the files,
// and the image is removed with the snapshot (Options.ImageExists tells).
func (s *suite) snapshotImage(t *testing.T) {
	rt := s.newRuntime(t)
	is, ok := rt.(runtime.ImageSnapshotter)
	if !ok {
		t.Skipf("%s does not implement runtime.ImageSnapshotter", rt.Name())
	}
	ctx := s.ctxFor(t)
	name := NewID("snap")
	t.Cleanup(func() { is.RemoveSnapshotImage(context.Background(), name) })
	if _, err := is.SnapshotImage(ctx, NewID("missing"), name); !errdefs.IsNotFound(err) {
		t.Errorf("SnapshotImage of an unknown sandbox: %v, want ErrNotFound", err)
	}
	src := NewID("snap-src")
	s.create(t, ctx, rt, src)
	WaitAgent(t, ctx, rt, src, s.opts.AgentTimeout)
	if !s.opts.NoCommands {
		if out, code, err := Exec(ctx, rt, src, "mkdir -p /snapdir && echo captured > /snapdir/file && rm -f /linuxrc"); err != nil || code != 0 {
			t.Fatalf("write: %q %d %v", out, code, err)
		}
	}
	img, err := is.SnapshotImage(ctx, src, name)
	if s.opts.SnapshotImagesOff {
		if !errors.Is(err, errdefs.ErrNotImplemented) {
			t.Fatalf("SnapshotImage with snapshots off: %q %v, want ErrNotImplemented", img, err)
		}
		if st, err := rt.Status(ctx, src); err != nil || st.State != runtime.StateRunning {
			t.Fatalf("source after a refused SnapshotImage: %+v %v", st, err)
		}
		if err := is.RemoveSnapshotImage(ctx, name); err != nil {
			t.Errorf("RemoveSnapshotImage of a refused snapshot: %v", err)
		}
		return
	}
	if err != nil {
		t.Fatalf("SnapshotImage: %v", err)
	}
	t.Logf("snapshot image %s", img)
	if st, err := rt.Status(ctx, src); err != nil || st.State != runtime.StateRunning {
		t.Fatalf("source after SnapshotImage: %+v %v", st, err)
	}
	spec := s.spec(NewID("snap-dst"))
	spec.Image = img
	s.createSpec(t, ctx, rt, spec)
	WaitAgent(t, ctx, rt, spec.ID, s.opts.AgentTimeout)
	if !s.opts.NoCommands {
		// The source runs on (it was thawed), the copy has its files and
		// its deletions.
		if out, code, err := Exec(ctx, rt, src, "echo after > /snapdir/later"); err != nil || code != 0 {
			t.Fatalf("source after the snapshot: %q %d %v", out, code, err)
		}
		out, _, err := Exec(ctx, rt, spec.ID, "cat /snapdir/file; test -e /linuxrc && echo linuxrc; test -e /snapdir/later && echo later")
		if err != nil || strings.TrimSpace(out) != "captured" {
			t.Fatalf("sandbox from the snapshot: %q %v, want just the captured file", out, err)
		}
	}
	if err := is.RemoveSnapshotImage(ctx, name); err != nil {
		t.Fatalf("RemoveSnapshotImage: %v", err)
	}
	if err := is.RemoveSnapshotImage(ctx, name); err != nil {
		t.Errorf("RemoveSnapshotImage of a removed snapshot: %v", err)
	}
	if s.opts.ImageExists != nil {
		if ok, err := s.opts.ImageExists(ctx, img); err != nil || ok {
			t.Errorf("image %s after RemoveSnapshotImage: exists %v, %v", img, ok, err)
		}
	}
}

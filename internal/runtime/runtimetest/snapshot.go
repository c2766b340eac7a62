package runtimetest

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/moat-sandbox/moat/internal/errdefs"
	"github.com/moat-sandbox/moat/internal/runtime"
)

// snapshot checks how the backend's sandboxes are snapshotted: through
// runtime.ImageSnapshotter (snapshotImage) or runtime.Snapshotter
// (snapshotDir).
func (s *suite) snapshot(t *testing.T) {
	rt := s.newRuntime(t)
	if is, ok := rt.(runtime.ImageSnapshotter); ok {
		s.snapshotImage(t, rt, is)
		return
	}
	sn, ok := rt.(runtime.Snapshotter)
	if !ok {
		t.Skipf("%s implements neither runtime.ImageSnapshotter nor runtime.Snapshotter", rt.Name())
	}
	s.snapshotDir(t, rt, sn)
}

// snapshotDir: a backend whose sandboxes keep their writable layer on the
// host (runtime.Snapshotter) names it for a running sandbox, and a file
// the sandbox wrote is in it; an unknown sandbox is ErrNotFound. A class
// it refuses (ErrNotImplemented) must be one it can checkpoint instead
// (runtime.Checkpointer: gVisor keeps its writes in its own memory).
func (s *suite) snapshotDir(t *testing.T, rt runtime.Runtime, sn runtime.Snapshotter) {
	ctx := s.ctxFor(t)
	if _, err := sn.SnapshotDir(ctx, NewID("missing")); !errdefs.IsNotFound(err) {
		t.Errorf("SnapshotDir of an unknown sandbox: %v, want ErrNotFound", err)
	}
	src := NewID("snapdir-src")
	s.create(t, ctx, rt, src)
	WaitAgent(t, ctx, rt, src, s.opts.AgentTimeout)
	if !s.opts.NoCommands {
		if out, code, err := Exec(ctx, rt, src, "mkdir -p /snapdir && echo captured > /snapdir/file"); err != nil || code != 0 {
			t.Fatalf("write: %q %d %v", out, code, err)
		}
	}
	dir, err := sn.SnapshotDir(ctx, src)
	if errors.Is(err, errdefs.ErrNotImplemented) {
		if _, ok := rt.(runtime.Checkpointer); !ok {
			t.Fatalf("SnapshotDir refused class %q (%v), and %s cannot checkpoint it either", s.opts.Class, err, rt.Name())
		}
		t.Logf("class %q is snapshotted with its memory: %v", s.opts.Class, err)
		return
	}
	if err != nil {
		t.Fatalf("SnapshotDir: %v", err)
	}
	if fi, err := os.Stat(dir); err != nil || !fi.IsDir() {
		t.Fatalf("SnapshotDir %q: %v, want a directory", dir, err)
	}
	if !s.opts.NoCommands {
		if b, err := os.ReadFile(filepath.Join(dir, "snapdir", "file")); err != nil || string(b) != "captured\n" {
			t.Fatalf("the written file in %s: %q %v", dir, b, err)
		}
	}
}

// snapshotImage: a backend that commits snapshot images itself
// (runtime.ImageSnapshotter) captures a running sandbox's files, the
// sandbox keeps running, sandboxes created from the image see the files,
// and the image is removed with the snapshot (Options.ImageExists tells).
func (s *suite) snapshotImage(t *testing.T, rt runtime.Runtime, is runtime.ImageSnapshotter) {
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

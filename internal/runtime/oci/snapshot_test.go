package oci

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/moat-sandbox/moat/internal/image"
	"github.com/moat-sandbox/moat/internal/runtime"
	"github.com/moat-sandbox/moat/internal/runtime/runtimetest"
)

// TestSnapshotCommit checks that the writable layer of a sandbox, as the
// production mount (image.MountRootfs) leaves it, commits as a portable
// layer: a renamed lower directory is copied up instead of recorded as an
// overlay redirect (which CommitLayer could not express), deletions become
// whiteouts, and the committed image shows exactly the changed tree.
func TestSnapshotCommit(t *testing.T) {
	r := newEnv(t, "runc", nil).open(t)
	ctx := context.Background()
	id := runtimetest.NewID("snap")
	sb, err := r.Create(ctx, runtime.Spec{ID: id, Image: testImage})
	if err != nil {
		t.Fatal(err)
	}
	runtimetest.WaitAgent(t, ctx, r, id, 10*time.Second)

	// Change the root as a process in the sandbox would, through the
	// overlay mount (the sandbox's: the host's copy is dropped).
	root := fmt.Sprintf("/proc/%d/root", sb.Pid)
	if err := os.Rename(filepath.Join(root, "bin"), filepath.Join(root, "bin2")); !errors.Is(err, unix.EXDEV) {
		// redirect_dir=off: the kernel refuses, and tools fall back to copying.
		t.Fatalf("rename of a lower directory = %v, want EXDEV (overlay redirects must be off)", err)
	}
	if err := os.Remove(filepath.Join(root, "bin", "ls")); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(root, "work"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "work", "f"), []byte("data"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := r.Pause(ctx, id); err != nil {
		t.Fatal(err)
	}
	upper, err := r.SnapshotDir(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	st, err := image.Open(ctx, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	snap, err := st.CommitLayer(ctx, upper, image.Image{}, "local/snap:1")
	if err != nil {
		t.Fatalf("commit of the sandbox's upper dir: %v", err)
	}
	if err := r.Resume(ctx, id); err != nil {
		t.Fatal(err)
	}

	// Mount the busybox layer under the committed one, read-only.
	paths, err := st.LayerPaths(ctx, snap)
	if err != nil {
		t.Fatal(err)
	}
	rootfs, _ := r.images.Rootfs(ctx, "", testImage)
	mnt := filepath.Join(t.TempDir(), "mnt")
	if err := os.Mkdir(mnt, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := image.MountRootfs(append(rootfs.Layers, paths...), "", "", mnt); err != nil {
		t.Fatal(err)
	}
	defer image.Unmount(mnt)
	if _, err := os.Lstat(filepath.Join(mnt, "bin", "ls")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("deleted bin/ls is visible in the snapshot (err %v)", err)
	}
	if _, err := os.Lstat(filepath.Join(mnt, "bin", "sh")); err != nil {
		t.Errorf("bin/sh of the base layer: %v", err)
	}
	if data, err := os.ReadFile(filepath.Join(mnt, "work", "f")); err != nil || string(data) != "data" {
		t.Errorf("work/f = %q, %v", data, err)
	}
}

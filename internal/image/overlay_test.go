package image

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/moat-sandbox/moat/internal/testutil"
)

// mountT mounts and registers the unmount with t.Cleanup.
func mountT(t *testing.T, lowers []string, upper, work string) string {
	t.Helper()
	target := filepath.Join(t.TempDir(), "mnt")
	if err := os.Mkdir(target, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := MountRootfs(lowers, upper, work, target); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := Unmount(target); err != nil {
			t.Error(err)
		}
	})
	return target
}

func mustNotExist(t *testing.T, p string) {
	t.Helper()
	if _, err := os.Lstat(p); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("%s should not exist (err=%v)", p, err)
	}
}

func TestOverlayWhiteoutsAndCommit(t *testing.T) {
	testutil.RequiresRoot(t)
	ctx := context.Background()
	reg := startRegistry(t, "", "")
	ref := reg.push(t, "test/ovl:1", buildImage(t, nil, layerOf(t, baseLayerTar(t)), layerOf(t, upperLayerTar(t))))
	s := openStore(t)
	img, err := s.Pull(ctx, ref, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	lease, err := s.Acquire(ctx, ref)
	if err != nil {
		t.Fatal(err)
	}
	defer lease.Release()

	dir := t.TempDir()
	upper, work := filepath.Join(dir, "upper"), filepath.Join(dir, "work")
	os.Mkdir(upper, 0o755)
	os.Mkdir(work, 0o755)
	mnt := mountT(t, lease.Layers, upper, work)

	// The OCI whiteout and the opaque dir of layer 2 take effect.
	mustNotExist(t, filepath.Join(mnt, "gone"))
	mustNotExist(t, filepath.Join(mnt, "opq/lower"))
	if got := readFile(t, filepath.Join(mnt, "opq/upper")); got != "upper" {
		t.Errorf("opq/upper = %q", got)
	}
	if got := readFile(t, filepath.Join(mnt, "etc/hosts")); got != "h2" {
		t.Errorf("etc/hosts = %q", got)
	}
	if got := readFile(t, filepath.Join(mnt, "bin/sh")); got != "tool" {
		t.Errorf("bin/sh = %q", got)
	}

	// Change the rootfs: delete a lower file, replace a lower dir, add a file.
	if err := os.Remove(filepath.Join(mnt, "bin/tool-link")); err != nil {
		t.Fatal(err)
	}
	if err := os.RemoveAll(filepath.Join(mnt, "etc")); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(mnt, "etc"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(mnt, "etc/only"), []byte("only"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(mnt, "new"), []byte("new"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := Unmount(mnt); err != nil {
		t.Fatal(err)
	}

	// The upper dir archives as a portable OCI layer.
	var buf bytes.Buffer
	if err := writeTar(ctx, &buf, upper, tarOptions{overlayUpper: true}); err != nil {
		t.Fatal(err)
	}
	names := map[string]bool{}
	tr := tar.NewReader(&buf)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		names[h.Name] = true
		if h.Typeflag == tar.TypeChar {
			t.Errorf("overlay whiteout %s leaked into the OCI tar", h.Name)
		}
	}
	for _, n := range []string{"bin/.wh.tool-link", "etc/", "etc/.wh..wh..opq", "etc/only", "new"} {
		if !names[n] {
			t.Errorf("commit tar lacks %s (has %v)", n, names)
		}
	}

	snap, err := s.CommitLayer(ctx, upper, img, "snap:1")
	if err != nil {
		t.Fatal(err)
	}
	if len(snap.Layers) != 3 || snap.Layers[1] != img.Layers[1] || snap.Size <= img.Size {
		t.Fatalf("snapshot = %+v", snap)
	}
	again, err := s.CommitLayer(ctx, upper, img, "snap:2")
	if err != nil {
		t.Fatal(err)
	}
	if again.Layers[2] != snap.Layers[2] || again.ID != snap.ID {
		t.Fatalf("recommit not deduplicated: %s vs %s", again.Layers[2], snap.Layers[2])
	}

	// Mount the snapshot read-only: it shows exactly the changed rootfs.
	paths, err := s.LayerPaths(ctx, snap)
	if err != nil {
		t.Fatal(err)
	}
	ro := mountT(t, paths, "", "")
	mustNotExist(t, filepath.Join(ro, "bin/tool-link"))
	mustNotExist(t, filepath.Join(ro, "etc/hosts"))
	mustNotExist(t, filepath.Join(ro, "gone"))
	mustNotExist(t, filepath.Join(ro, "opq/lower"))
	for p, want := range map[string]string{"etc/only": "only", "new": "new", "bin/tool": "tool", "opq/upper": "upper"} {
		if got := readFile(t, filepath.Join(ro, p)); got != want {
			t.Errorf("%s = %q, want %q", p, got, want)
		}
	}
	if err := os.WriteFile(filepath.Join(ro, "x"), nil, 0o644); !errors.Is(err, unix.EROFS) {
		t.Errorf("write to read-only rootfs: %v", err)
	}
	// The snapshot's config is inherited from the base image.
	if snap.Config.WorkingDir != "/work" {
		t.Errorf("snapshot config = %+v", snap.Config)
	}
}

func TestMountManyLayers(t *testing.T) {
	testutil.RequiresRoot(t)
	base := filepath.Join(t.TempDir(), strings.Repeat("long-directory-name-", 5))
	const n = 80
	var lowers []string
	for i := range n {
		d := filepath.Join(base, fmt.Sprintf("layer-%03d-%s", i, strings.Repeat("x", 40)))
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
		os.WriteFile(filepath.Join(d, fmt.Sprintf("f%d", i)), []byte{byte(i)}, 0o644)
		os.WriteFile(filepath.Join(d, "top"), []byte{byte(i)}, 0o644)
		lowers = append(lowers, d)
	}
	if len(overlayOptions(lowers, "", "")) < os.Getpagesize() {
		t.Fatal("test does not exceed the page size")
	}
	mnt := mountT(t, lowers, "", "")
	for i := range n {
		if _, err := os.Stat(filepath.Join(mnt, fmt.Sprintf("f%d", i))); err != nil {
			t.Fatal(err)
		}
	}
	// The last lower (top of the stack) wins.
	if b, err := os.ReadFile(filepath.Join(mnt, "top")); err != nil || b[0] != n-1 {
		t.Fatalf("top = %v, %v", b, err)
	}
	if err := Unmount(mnt); err != nil {
		t.Fatal(err)
	}
	if err := Unmount(mnt); err != nil {
		t.Fatalf("second unmount: %v", err)
	}
}

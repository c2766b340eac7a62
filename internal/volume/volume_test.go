package volume

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"
	"golang.org/x/sys/unix"

	"github.com/moat-sandbox/moat/internal/errdefs"
	"github.com/moat-sandbox/moat/internal/runtime"
	"github.com/moat-sandbox/moat/internal/testutil"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestOpenSubPath: directories are created, and no symlink or ".." leads
// out of the root, whatever the volume holds.
func TestOpenSubPath(t *testing.T) {
	root := t.TempDir()
	outside := t.TempDir()
	os.WriteFile(filepath.Join(outside, "secret"), []byte("s"), 0o600)
	os.Symlink(outside, filepath.Join(root, "abs-out"))
	os.Symlink("../../", filepath.Join(root, "rel-out"))
	os.Mkdir(filepath.Join(root, "d"), 0o755)
	os.Symlink("../d", filepath.Join(root, "d", "self")) // stays inside
	os.WriteFile(filepath.Join(root, "file"), []byte("f"), 0o644)
	for _, tc := range []struct {
		sub string
		ok  bool
	}{
		{"", true}, {"new/dir", true}, {"d/self", true}, {"file", true},
		{"abs-out", false}, {"abs-out/secret", false}, {"rel-out", false}, {"rel-out/x", false}, {"file/x", false}, {"../x", false},
	} {
		f, err := OpenSubPath(root, tc.sub)
		if tc.ok != (err == nil) {
			t.Errorf("OpenSubPath(%q) = %v, want ok=%v", tc.sub, err, tc.ok)
		}
		if err == nil {
			f.Close()
		} else if !errdefs.IsInvalidArgument(err) {
			t.Errorf("OpenSubPath(%q): %v is not InvalidArgument", tc.sub, err)
		}
	}
	if st, err := os.Stat(filepath.Join(root, "new", "dir")); err != nil || !st.IsDir() {
		t.Errorf("subPath directory not created: %v", err)
	}
	if _, err := os.Stat(filepath.Join(outside, "x")); err == nil {
		t.Error("something was created outside the root")
	}
}

// TestStore exercises the native store as root: a volume is created with
// its quota, mounted only while used, its quota enforced, shared, refused
// deletion while in use, swept after a "crash", and deleted without
// leaving a mount or loop device behind.
func TestStore(t *testing.T) {
	testutil.RequiresRoot(t)
	testutil.RequireBinary(t, "mkfs.ext4")
	ctx := context.Background()
	root := filepath.Join(t.TempDir(), "volumes")
	s, err := OpenStore(root, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		s.Sweep(func(string) bool { return false })
		if l := LoopsReleased(root, 10*time.Second); len(l) > 0 {
			t.Errorf("loop devices left: %v", l)
		}
	})
	v, err := s.Create(ctx, runtime.VolumeSpec{Name: "data", SizeBytes: 32 << 20, Labels: map[string]string{"k": "v"}})
	if err != nil {
		t.Fatal(err)
	}
	if v.Name != "data" || v.SizeBytes != 32<<20 || !v.Managed || v.Labels["k"] != "v" || v.CreatedAt.IsZero() {
		t.Fatalf("created %+v", v)
	}
	if _, err := s.Create(ctx, runtime.VolumeSpec{Name: "data"}); !errdefs.IsAlreadyExists(err) {
		t.Fatalf("second create: %v", err)
	}
	for _, bad := range []runtime.VolumeSpec{{Name: "Bad"}, {Name: "x", SizeBytes: 1 << 10}} {
		if _, err := s.Create(ctx, bad); !errdefs.IsInvalidArgument(err) {
			t.Fatalf("create %+v: %v", bad, err)
		}
	}
	if _, err := s.Get(ctx, "nope"); !errdefs.IsNotFound(err) {
		t.Fatalf("get missing: %v", err)
	}
	if l := LoopsBacking(root); len(l) != 0 {
		t.Fatalf("an unused volume holds loop devices %v", l)
	}

	p1, err := s.Acquire(ctx, "data", "sb-1")
	if err != nil {
		t.Fatal(err)
	}
	p2, err := s.Acquire(ctx, "data", "sb-2")
	if err != nil || p2 != p1 {
		t.Fatalf("second acquire: %q %v", p2, err)
	}
	if l := LoopsBacking(root); len(l) != 1 {
		t.Fatalf("a used volume has loop devices %v, want one", l)
	}
	// The quota: writing 64 MiB into a 32 MiB volume stops at ENOSPC.
	f, err := os.Create(filepath.Join(p1, "fill"))
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 1<<20)
	var werr error
	for range 64 {
		if _, werr = f.Write(buf); werr != nil {
			break
		}
	}
	f.Close()
	if !errors.Is(werr, unix.ENOSPC) {
		t.Fatalf("writing past the quota: %v", werr)
	}
	if v, _ := s.Get(ctx, "data"); !slices.Equal(v.Users, []string{"sb-1", "sb-2"}) || v.UsedBytes < 16<<20 {
		t.Fatalf("in use: %+v", v)
	}
	if err := s.Delete(ctx, "data"); !errdefs.IsFailedPrecondition(err) {
		t.Fatalf("delete in use: %v", err)
	}
	// A bind of a subPath, as the runtimes make it.
	target := filepath.Join(t.TempDir(), "bind")
	if err := BindSubPath(p1, "sub/dir", target, true); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(target, "x"), nil, 0o644); !errors.Is(err, unix.EROFS) {
		t.Errorf("write to a read-only bind: %v", err)
	}
	os.WriteFile(filepath.Join(p1, "sub", "dir", "seen"), []byte("1"), 0o644)
	if _, err := os.Stat(filepath.Join(target, "seen")); err != nil {
		t.Errorf("bind does not show the volume: %v", err)
	}
	os.Symlink("/etc", filepath.Join(p1, "esc"))
	if err := BindSubPath(p1, "esc", filepath.Join(t.TempDir(), "esc"), false); !errdefs.IsInvalidArgument(err) {
		t.Errorf("bind through a symlink out: %v", err)
	}
	if err := unix.Unmount(target, 0); err != nil {
		t.Fatal(err)
	}

	// A restart: sb-2 no longer exists; sb-1 does.
	s2, err := OpenStore(root, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := s2.Sweep(func(id string) bool { return id == "sb-1" }); err != nil {
		t.Fatal(err)
	}
	if v, _ := s2.Get(ctx, "data"); !slices.Equal(v.Users, []string{"sb-1"}) {
		t.Fatalf("after sweep: %+v", v)
	}
	if err := s2.Release("data", "sb-1"); err != nil {
		t.Fatal(err)
	}
	if l := LoopsReleased(root, 10*time.Second); len(l) != 0 {
		t.Fatalf("a released volume holds loop devices %v", l)
	}
	if m, _ := isMountPoint(p1); m {
		t.Fatal("a released volume is still mounted")
	}
	// The data survived the unmount.
	if st, err := os.Stat(filepath.Join(s2.Root(), "data", imageFile)); err != nil || st.Size() != 32<<20 {
		t.Fatalf("image: %v", err)
	}
	p3, err := s2.Acquire(ctx, "data", "sb-3")
	if err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(filepath.Join(p3, "sub", "dir", "seen")); string(b) != "1" {
		t.Fatalf("data after remount: %q", b)
	}
	s2.Release("data", "sb-3")
	list, err := s2.List(ctx)
	if err != nil || len(list) != 1 {
		t.Fatalf("list: %+v %v", list, err)
	}
	if err := s2.Delete(ctx, "data"); err != nil {
		t.Fatal(err)
	}
	if _, err := s2.Get(ctx, "data"); !errdefs.IsNotFound(err) {
		t.Fatalf("after delete: %v", err)
	}
	if ents, _ := os.ReadDir(root); len(ents) != 0 {
		t.Fatalf("left in the store: %v", ents)
	}
}

// A volume unmounted while a mount namespace cloned elsewhere on the host
// (any container being set up) still holds a copy of its mount, then
// mounted again: the new mount must see everything written before the
// unmount, and the filesystem must stay one (fsck-clean) once the copy
// goes. A second ext4 instance on a new loop device saw the image without
// the data still in the first one's cache (the JavaScript SDK's "the data
// outlives the sandboxes that wrote it" read an empty file), and the two
// instances would then overwrite each other's blocks.
func TestRemountWhileAnotherNamespaceHoldsTheVolume(t *testing.T) {
	testutil.RequiresRoot(t)
	testutil.RequireBinary(t, "mkfs.ext4")
	testutil.RequireBinary(t, "e2fsck")
	ctx := context.Background()
	root := filepath.Join(t.TempDir(), "volumes")
	s, err := OpenStore(root, 0)
	if err != nil {
		t.Fatal(err)
	}
	var holder *exec.Cmd
	t.Cleanup(func() {
		if holder != nil {
			holder.Process.Kill()
			holder.Wait()
		}
		s.Sweep(func(string) bool { return false })
		if l := LoopsReleased(root, 10*time.Second); len(l) > 0 {
			t.Errorf("loop devices left: %v", l)
		}
	})
	if _, err := s.Create(ctx, runtime.VolumeSpec{Name: "data", SizeBytes: 32 << 20}); err != nil {
		t.Fatal(err)
	}
	p, err := s.Acquire(ctx, "data", "sb-1")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(p, "a.txt"), []byte("from-a"), 0o644); err != nil {
		t.Fatal(err)
	}
	// A process in a new mount namespace: it holds a copy of every mount
	// of the host's, the volume's included, until it exits.
	holder = exec.Command("sleep", "600")
	holder.SysProcAttr = &syscall.SysProcAttr{Unshareflags: syscall.CLONE_NEWNS}
	if err := holder.Start(); err != nil {
		t.Fatal(err)
	}
	if err := s.Release("data", "sb-1"); err != nil {
		t.Fatal(err)
	}
	if m, _ := isMountPoint(p); m {
		t.Fatal("the released volume is still mounted here")
	}
	p, err = s.Acquire(ctx, "data", "sb-2")
	if err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(p, "a.txt")); string(b) != "from-a" {
		t.Fatalf("remounted while a copy lives: a.txt %q (%v)", b, err)
	}
	if err := os.WriteFile(filepath.Join(p, "b.txt"), []byte("from-b"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := s.Release("data", "sb-2"); err != nil {
		t.Fatal(err)
	}
	holder.Process.Kill()
	holder.Wait()
	holder = nil
	if l := LoopsReleased(root, 10*time.Second); len(l) > 0 {
		t.Fatalf("loop devices left after the copy went: %v", l)
	}
	img := filepath.Join(root, "data", imageFile)
	if out, err := exec.Command("e2fsck", "-fn", img).CombinedOutput(); err != nil {
		t.Fatalf("the volume's filesystem is damaged: %v\n%s", err, out)
	}
	p, err = s.Acquire(ctx, "data", "sb-3")
	if err != nil {
		t.Fatal(err)
	}
	for f, want := range map[string]string{"a.txt": "from-a", "b.txt": "from-b"} {
		if b, err := os.ReadFile(filepath.Join(p, f)); string(b) != want {
			t.Errorf("after the copy went: %s %q (%v)", f, b, err)
		}
	}
	s.Release("data", "sb-3")
}

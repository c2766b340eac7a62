package image

import (
	"archive/tar"
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/moat-sandbox/moat/internal/errdefs"
)

var isRoot = os.Geteuid() == 0

func baseLayerTar(t testing.TB) []byte {
	return mkTar(t,
		entry{name: "etc/", typ: tar.TypeDir},
		entry{name: "etc/hosts", body: "h1"},
		entry{name: "bin/", typ: tar.TypeDir},
		entry{name: "bin/tool", body: "tool", mode: 0o755, uid: 1000, gid: 1001, xattrs: map[string]string{"user.test": "v", "trusted.overlay.redirect": "/etc"}},
		entry{name: "bin/tool-link", typ: tar.TypeLink, link: "bin/tool"},
		entry{name: "bin/sh", typ: tar.TypeSymlink, link: "tool"},
		entry{name: "/abs/file", body: "abs"}, // leading slash is tolerated, parent created implicitly
		entry{name: "opq/", typ: tar.TypeDir},
		entry{name: "opq/lower", body: "lower"},
		entry{name: "gone", body: "bye"},
		entry{name: "ro/", typ: tar.TypeDir, mode: 0o555},
		entry{name: "ro/file", body: "x", mode: 0o444},
		entry{name: "suid", body: "s", mode: 0o4755},
		entry{name: "dev/", typ: tar.TypeDir},
		entry{name: "dev/null", typ: tar.TypeChar, mode: 0o666, major: 1, minor: 3},
		entry{name: "dev/fifo", typ: tar.TypeFifo, mode: 0o600},
	)
}

func upperLayerTar(t testing.TB) []byte {
	return mkTar(t,
		entry{name: ".wh.gone"},
		entry{name: "opq/", typ: tar.TypeDir},
		entry{name: "opq/.wh..wh..opq"},
		entry{name: "opq/upper", body: "upper"},
		entry{name: "etc/", typ: tar.TypeDir},
		entry{name: "etc/hosts", body: "h2"},
	)
}

func stat(t *testing.T, p string) unix.Stat_t {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Lstat(p, &st); err != nil {
		t.Fatal(err)
	}
	return st
}

func readFile(t *testing.T, p string) string {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func TestPullExtractsOverlayReadyLayers(t *testing.T) {
	ctx := context.Background()
	reg := startRegistry(t, "", "")
	ref := reg.push(t, "test/app:v1", buildImage(t, []string{"A=1"},
		layerOf(t, baseLayerTar(t)), layerOf(t, upperLayerTar(t), zstdLayer)))
	s := openStore(t)

	var mu sync.Mutex
	var events []Progress
	img, err := s.Pull(ctx, ref, nil, func(p Progress) { mu.Lock(); events = append(events, p); mu.Unlock() })
	if err != nil {
		t.Fatal(err)
	}
	if img.Name != ref || len(img.Layers) != 2 || img.Digest == "" || !validDigest(img.ID) {
		t.Fatalf("image = %+v", img)
	}
	if !slices.Equal(img.Config.Env, []string{"A=1"}) || img.Config.WorkingDir != "/work" || !slices.Equal(img.Config.Cmd, []string{"/bin/sh"}) {
		t.Fatalf("config = %+v", img.Config)
	}
	if img.Size != int64(len(baseLayerTar(t))+len(upperLayerTar(t))) {
		t.Fatalf("size = %d", img.Size)
	}
	done := 0
	for _, e := range events {
		if e.Done && !e.Cached {
			done++
		}
	}
	if done != 2 {
		t.Fatalf("progress: %d layers done, events %+v", done, events)
	}
	if got, err := s.Get(ctx, ref); err != nil || got.ID != img.ID {
		t.Fatalf("Get = %+v, %v", got, err)
	}
	if got, err := s.Get(ctx, img.ID[7:19]); err != nil || got.ID != img.ID {
		t.Fatalf("Get by ID prefix = %+v, %v", got, err)
	}
	list, err := s.List(ctx)
	if err != nil || len(list) != 1 {
		t.Fatalf("List = %v, %v", list, err)
	}
	paths, err := s.LayerPaths(ctx, img)
	if err != nil {
		t.Fatal(err)
	}
	base, upper := paths[0], paths[1]

	// Base layer: hard link, symlink, modes, owners, times, xattrs, devices.
	tool, link := stat(t, filepath.Join(base, "bin/tool")), stat(t, filepath.Join(base, "bin/tool-link"))
	if tool.Ino != link.Ino || tool.Nlink != 2 {
		t.Errorf("hard link: ino %d vs %d, nlink %d", tool.Ino, link.Ino, tool.Nlink)
	}
	if tool.Mode&0o7777 != 0o755 || tool.Mtim.Sec != testTime.Unix() {
		t.Errorf("bin/tool mode %o mtime %d", tool.Mode&0o7777, tool.Mtim.Sec)
	}
	if target, _ := os.Readlink(filepath.Join(base, "bin/sh")); target != "tool" {
		t.Errorf("bin/sh -> %q", target)
	}
	if got := readFile(t, filepath.Join(base, "abs/file")); got != "abs" {
		t.Errorf("abs/file = %q", got)
	}
	if st := stat(t, filepath.Join(base, "ro")); st.Mode&0o7777 != 0o555 || st.Mtim.Sec != testTime.Unix() {
		t.Errorf("ro/ mode %o mtime %d", st.Mode&0o7777, st.Mtim.Sec)
	}
	if st := stat(t, filepath.Join(base, "dev/fifo")); st.Mode&unix.S_IFMT != unix.S_IFIFO {
		t.Errorf("dev/fifo mode %o", st.Mode)
	}
	buf := make([]byte, 16)
	if n, err := unix.Lgetxattr(filepath.Join(base, "bin/tool"), "user.test", buf); err != nil || string(buf[:n]) != "v" {
		t.Errorf("user.test xattr = %q, %v", buf[:n], err)
	}
	if isRoot {
		if tool.Uid != 1000 || tool.Gid != 1001 {
			t.Errorf("bin/tool owner %d:%d", tool.Uid, tool.Gid)
		}
		if st := stat(t, filepath.Join(base, "suid")); st.Mode&0o7777 != 0o4755 {
			t.Errorf("suid mode %o", st.Mode&0o7777)
		}
		if st := stat(t, filepath.Join(base, "dev/null")); st.Mode&unix.S_IFMT != unix.S_IFCHR || unix.Major(st.Rdev) != 1 || unix.Minor(st.Rdev) != 3 {
			t.Errorf("dev/null mode %o rdev %d:%d", st.Mode, unix.Major(st.Rdev), unix.Minor(st.Rdev))
		}
		if _, err := unix.Lgetxattr(filepath.Join(base, "bin/tool"), "trusted.overlay.redirect", buf); !errors.Is(err, unix.ENODATA) {
			t.Errorf("forged trusted.overlay.redirect xattr was applied: %v", err)
		}
	}

	// Upper layer: whiteouts converted to overlay form.
	if st := stat(t, filepath.Join(upper, "gone")); st.Mode&unix.S_IFMT != unix.S_IFCHR || st.Rdev != 0 {
		t.Errorf("whiteout gone: mode %o rdev %d", st.Mode, st.Rdev)
	}
	attr := "trusted.overlay.opaque"
	if !isRoot {
		attr = "user.overlay.opaque"
	}
	if n, err := unix.Lgetxattr(filepath.Join(upper, "opq"), attr, buf); err != nil || string(buf[:n]) != "y" {
		t.Errorf("opaque xattr = %q, %v", buf[:n], err)
	}
	for _, p := range []string{".wh.gone", "opq/.wh..wh..opq"} {
		if _, err := os.Lstat(filepath.Join(upper, p)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s should not exist: %v", p, err)
		}
	}
	if got := readFile(t, filepath.Join(upper, "opq/upper")); got != "upper" {
		t.Errorf("opq/upper = %q", got)
	}
}

func TestPullDedupAndCache(t *testing.T) {
	ctx := context.Background()
	reg := startRegistry(t, "", "")
	ref := reg.push(t, "test/dedup:latest", buildImage(t, nil,
		layerOf(t, mkTar(t, entry{name: "a", body: "a"})), layerOf(t, mkTar(t, entry{name: "b", body: "b"}))))
	s := openStore(t)

	const n = 8
	var wg sync.WaitGroup
	imgs := make([]Image, n)
	errs := make([]error, n)
	for i := range n {
		wg.Go(func() { imgs[i], errs[i] = s.Pull(ctx, ref, nil, nil) })
	}
	wg.Wait()
	for i := range n {
		if errs[i] != nil || imgs[i].ID != imgs[0].ID {
			t.Fatalf("pull %d: %+v, %v", i, imgs[i], errs[i])
		}
	}
	gets := reg.blobGets()
	if len(gets) != 3 { // config + 2 layers
		t.Fatalf("blob GETs = %v, want config and 2 layers", gets)
	}
	for d, c := range gets {
		if c != 1 {
			t.Errorf("blob %s fetched %d times, want 1", d, c)
		}
	}

	// A re-pull checks the manifest but fetches no layer.
	reg.reset()
	var cached int
	if _, err := s.Pull(ctx, ref, nil, func(p Progress) {
		if p.Cached {
			cached++
		}
	}); err != nil {
		t.Fatal(err)
	}
	if cached != 2 {
		t.Errorf("cached layers reported = %d, want 2", cached)
	}
	for d := range reg.blobGets() {
		if d != imgs[0].ID {
			t.Errorf("re-pull fetched layer blob %s", d)
		}
	}

	// Ensure of a present image does not touch the registry.
	reg.reset()
	if img, err := s.Ensure(ctx, ref, nil); err != nil || img.ID != imgs[0].ID {
		t.Fatalf("Ensure = %+v, %v", img, err)
	}
	if reg.total() != 0 {
		t.Errorf("Ensure sent %d requests", reg.total())
	}

	// A second store on the same root (another process) sees the image.
	s2, err := Open(ctx, s.Root())
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Close()
	if _, err := s2.Get(ctx, ref); err != nil {
		t.Fatal(err)
	}
}

func TestPullAuth(t *testing.T) {
	ctx := context.Background()
	reg := startRegistry(t, "alice", "s3cret")
	ref := reg.push(t, "private/img:1", buildImage(t, nil, layerOf(t, mkTar(t, entry{name: "x", body: "x"}))))
	s := openStore(t)

	for _, auth := range []*Auth{nil, {Username: "alice", Password: "wrong"}} {
		_, err := s.Pull(ctx, ref, auth, nil)
		if !errors.Is(err, errdefs.ErrPermissionDenied) {
			t.Fatalf("pull with %+v: err = %v, want ErrPermissionDenied", auth, err)
		}
		if p, ok := errdefs.PublicOf(err); !ok || p.Message == "" {
			t.Fatalf("no public message on %v", err)
		}
	}
	img, err := s.Pull(ctx, ref, &Auth{Username: "alice", Password: "s3cret"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.LayerPaths(ctx, img); err != nil {
		t.Fatal(err)
	}
}

func TestPullErrors(t *testing.T) {
	ctx := context.Background()
	reg := startRegistry(t, "", "")
	reg.push(t, "test/exists:1", buildImage(t, nil, layerOf(t, mkTar(t, entry{name: "x", body: "x"}))))
	s := openStore(t)

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closedAddr := ln.Addr().String()
	ln.Close()

	for i, tc := range []struct {
		ref  string
		want error
	}{
		{"UPPER/Case::bad", errdefs.ErrInvalidArgument},
		{"", errdefs.ErrInvalidArgument},
		{reg.host + "/test/missing:1", errdefs.ErrNotFound},
		{reg.host + "/test/exists:nope", errdefs.ErrNotFound},
		{closedAddr + "/test/x:1", errdefs.ErrUnavailable},
	} {
		_, err := s.Pull(ctx, tc.ref, nil, nil)
		if !errors.Is(err, tc.want) {
			t.Errorf("%d: Pull(%q) = %v, want %v", i, tc.ref, err, tc.want)
		}
	}
	if _, err := s.Get(ctx, "nope"); !errdefs.IsNotFound(err) {
		t.Errorf("Get(nope) = %v", err)
	}
	if err := s.Remove(ctx, "nope"); !errdefs.IsNotFound(err) {
		t.Errorf("Remove(nope) = %v", err)
	}
}

func TestPullCancelledWaiterDoesNotCancelOthers(t *testing.T) {
	var g flightGroup[int]
	started, release := make(chan struct{}), make(chan struct{})
	var workCtx context.Context
	fn := func(ctx context.Context) (int, error) {
		workCtx = ctx
		close(started)
		select {
		case <-release:
			return 42, nil
		case <-ctx.Done():
			return 0, ctx.Err()
		}
	}
	ctx1, cancel1 := context.WithCancel(context.Background())
	res1 := make(chan error, 1)
	go func() { _, _, err := g.Do(ctx1, "k", fn); res1 <- err }()
	<-started
	res2 := make(chan int, 1)
	go func() {
		v, shared, err := g.Do(context.Background(), "k", fn)
		if err != nil || !shared {
			t.Errorf("second caller: shared=%v err=%v", shared, err)
		}
		res2 <- v
	}()
	// Wait until the second caller joined.
	for {
		g.mu.Lock()
		w := g.m["k"].waiters
		g.mu.Unlock()
		if w == 2 {
			break
		}
		time.Sleep(time.Millisecond)
	}
	cancel1()
	if err := <-res1; !errors.Is(err, context.Canceled) {
		t.Fatalf("first caller err = %v", err)
	}
	if workCtx.Err() != nil {
		t.Fatal("work cancelled although a waiter remains")
	}
	close(release)
	if v := <-res2; v != 42 {
		t.Fatalf("second caller got %d", v)
	}

	// When the only waiter leaves, the work is cancelled.
	ctx3, cancel3 := context.WithCancel(context.Background())
	stopped := make(chan struct{})
	go func() {
		g.Do(ctx3, "k2", func(ctx context.Context) (int, error) { cancel3(); <-ctx.Done(); close(stopped); return 0, ctx.Err() })
	}()
	select {
	case <-stopped:
	case <-time.After(5 * time.Second):
		t.Fatal("work not cancelled after the last waiter left")
	}
}

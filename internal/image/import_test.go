package image

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/moat-sandbox/moat/internal/errdefs"
	"github.com/moat-sandbox/moat/internal/testutil"
)

func TestImportRootfsDir(t *testing.T) {
	ctx := context.Background()
	src := testutil.BusyboxRootfs(t)
	s := openStore(t)
	img, err := s.Import(ctx, "busybox", src)
	if err != nil {
		t.Fatal(err)
	}
	if img.Name != "index.docker.io/library/busybox:latest" || len(img.Layers) != 1 || img.Size == 0 {
		t.Fatalf("image = %+v", img)
	}
	if len(img.Config.Env) != 1 || img.Config.Env[0] != DefaultPath {
		t.Fatalf("config = %+v", img.Config)
	}
	// Deterministic: same tree, same IDs; the layer is shared.
	again, err := s.Import(ctx, "other:v2", src)
	if err != nil {
		t.Fatal(err)
	}
	if again.ID != img.ID || again.Layers[0] != img.Layers[0] {
		t.Fatalf("re-import gave %s/%s, want %s/%s", again.ID, again.Layers[0], img.ID, img.Layers[0])
	}
	// Ensure finds the imported image by its short name, no network.
	if got, err := s.Ensure(ctx, "busybox:latest", nil); err != nil || got.ID != img.ID {
		t.Fatalf("Ensure = %+v, %v", got, err)
	}
	paths, err := s.LayerPaths(ctx, img)
	if err != nil {
		t.Fatal(err)
	}
	out, err := exec.CommandContext(ctx, "diff", "-r", "--no-dereference", src, paths[0]).CombinedOutput()
	if err != nil {
		t.Fatalf("extracted tree differs from source: %v\n%s", err, out)
	}
	// The diff ID is the sha256 of the tar we build.
	var buf bytes.Buffer
	if err := writeTar(ctx, &buf, src, tarOptions{}); err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(buf.Bytes())
	if want := "sha256:" + hex.EncodeToString(sum[:]); img.Layers[0] != want {
		t.Fatalf("diff ID %s, want %s", img.Layers[0], want)
	}
}

func TestImportTarballs(t *testing.T) {
	ctx := context.Background()
	s := openStore(t)
	data := mkTar(t, entry{name: "./", typ: tar.TypeDir, mode: 0o750}, entry{name: "./hello", body: "world"})
	sum := sha256.Sum256(data)
	wantDiff := "sha256:" + hex.EncodeToString(sum[:])

	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	zw.Write(data)
	zw.Close()

	for _, p := range []string{writeTemp(t, "rootfs.tar", data), writeTemp(t, "rootfs.tar.gz", gz.Bytes())} {
		img, err := s.Import(ctx, "127.0.0.1:5000/tarred", p)
		if err != nil {
			t.Fatalf("%s: %v", p, err)
		}
		if img.Name != "127.0.0.1:5000/tarred:latest" || len(img.Layers) != 1 || img.Layers[0] != wantDiff {
			t.Fatalf("%s: image = %+v, want layer %s", p, img, wantDiff)
		}
		paths, err := s.LayerPaths(ctx, img)
		if err != nil {
			t.Fatal(err)
		}
		if got := readFile(t, filepath.Join(paths[0], "hello")); got != "world" {
			t.Fatalf("hello = %q", got)
		}
		if st := stat(t, paths[0]); st.Mode&0o777 != 0o750 {
			t.Fatalf("layer root mode %o, want 750 from the ./ entry", st.Mode&0o777)
		}
	}

	// docker save format and OCI layout, both with two layers.
	src := buildImage(t, []string{"FROM=save"}, layerOf(t, data), layerOf(t, mkTar(t, entry{name: "second", body: "2"})))
	tag, _ := name.NewTag("example.com/saved:1")
	savePath := filepath.Join(t.TempDir(), "save.tar")
	if err := tarball.WriteToFile(savePath, tag, src); err != nil {
		t.Fatal(err)
	}
	layoutDir := filepath.Join(t.TempDir(), "layout")
	if _, err := layout.Write(layoutDir, mutate.AppendManifests(empty.Index, mutate.IndexAddendum{Add: src})); err != nil {
		t.Fatal(err)
	}
	wantID, _ := src.ConfigName()
	for _, p := range []string{savePath, layoutDir} {
		img, err := s.Import(ctx, "saved", p)
		if err != nil {
			t.Fatalf("%s: %v", p, err)
		}
		if img.ID != wantID.String() || len(img.Layers) != 2 || img.Layers[0] != wantDiff || img.Config.Env[0] != "FROM=save" {
			t.Fatalf("%s: image = %+v", p, img)
		}
	}

	if _, err := s.Import(ctx, "x", filepath.Join(t.TempDir(), "missing")); !errdefs.IsNotFound(err) {
		t.Fatalf("import missing path: %v", err)
	}
	if _, err := s.Import(ctx, "Bad::Name", savePath); !errdefs.IsInvalidArgument(err) {
		t.Fatalf("import bad name: %v", err)
	}
}

func TestExtractRejectsTraversal(t *testing.T) {
	ctx := context.Background()
	outside := t.TempDir()
	victim := filepath.Join(outside, "victim")
	cases := map[string][]byte{
		"dotdot":           mkTar(t, entry{name: "../../../../" + victim[1:], body: "pwned"}),
		"nested dotdot":    mkTar(t, entry{name: "a/../../x", body: "pwned"}),
		"abs symlink dir":  mkTar(t, entry{name: "link", typ: tar.TypeSymlink, link: outside}, entry{name: "link/victim", body: "pwned"}),
		"rel symlink dir":  mkTar(t, entry{name: "d/", typ: tar.TypeDir}, entry{name: "d/link", typ: tar.TypeSymlink, link: "../../../../../../../../" + outside[1:]}, entry{name: "d/link/victim", body: "pwned"}),
		"hardlink escape":  mkTar(t, entry{name: "h", typ: tar.TypeLink, link: "../../../../etc/passwd"}),
		"hardlink via sym": mkTar(t, entry{name: "link", typ: tar.TypeSymlink, link: "/etc"}, entry{name: "h", typ: tar.TypeLink, link: "link/passwd"}),
		"whiteout via sym": mkTar(t, entry{name: "link", typ: tar.TypeSymlink, link: outside}, entry{name: "link/.wh.victim"}),
		"opaque via sym":   mkTar(t, entry{name: "link", typ: tar.TypeSymlink, link: outside}, entry{name: "link/.wh..wh..opq"}),
	}
	s := openStore(t)
	for name, data := range cases {
		t.Run(name, func(t *testing.T) {
			if err := os.WriteFile(victim, []byte("safe"), 0o644); err != nil {
				t.Fatal(err)
			}
			_, err := s.Import(ctx, "evil", writeTemp(t, "evil.tar", data))
			t.Log(err)
			if !errdefs.IsInvalidArgument(err) {
				t.Fatalf("import = %v, want ErrInvalidArgument", err)
			}
			if got := readFile(t, victim); got != "safe" {
				t.Fatalf("victim overwritten: %q", got)
			}
			ents, _ := os.ReadDir(outside)
			if len(ents) != 1 {
				t.Fatalf("files created outside the layer: %v", ents)
			}
		})
	}
	// Nothing half-extracted remains visible, and the store is empty.
	if ents, _ := os.ReadDir(filepath.Join(s.Root(), "layers", "sha256")); len(ents) != 0 {
		t.Fatalf("layers left behind: %v", ents)
	}
	if ents, _ := os.ReadDir(filepath.Join(s.Root(), "tmp")); len(ents) != 0 {
		t.Fatalf("tmp left behind: %v", ents)
	}

	// A symlink that stays inside the layer may be written through.
	img, err := s.Import(ctx, "ok", writeTemp(t, "ok.tar", mkTar(t,
		entry{name: "usr/lib/", typ: tar.TypeDir}, entry{name: "lib", typ: tar.TypeSymlink, link: "usr/lib"},
		entry{name: "lib/x.so", body: "so"})))
	if err != nil {
		t.Fatal(err)
	}
	paths, _ := s.LayerPaths(ctx, img)
	if got := readFile(t, filepath.Join(paths[0], "usr/lib/x.so")); got != "so" {
		t.Fatalf("usr/lib/x.so = %q", got)
	}
}

func TestLayerDigestMismatch(t *testing.T) {
	s := openStore(t)
	unlock, err := s.writerLock()
	if err != nil {
		t.Fatal(err)
	}
	defer unlock()
	_, _, err = s.putLayer(context.Background(), bytes.NewReader(mkTar(t, entry{name: "a", body: "a"})), "sha256:"+strings.Repeat("0", 64))
	if !errdefs.IsInvalidArgument(err) {
		t.Fatalf("putLayer = %v, want ErrInvalidArgument", err)
	}
	if ents, _ := os.ReadDir(filepath.Join(s.Root(), "layers", "sha256")); len(ents) != 0 {
		t.Fatalf("unverified layer installed: %v", ents)
	}
}

func TestRemoveAndGC(t *testing.T) {
	ctx := context.Background()
	var inUse string
	s := openStore(t, WithInUse(func(d string) bool { return d == inUse }))
	base := mkTar(t, entry{name: "base", body: "b"})
	reg := startRegistry(t, "", "")
	refA := reg.push(t, "gc/a:1", buildImage(t, nil, layerOf(t, base), layerOf(t, mkTar(t, entry{name: "a", body: "a"}))))
	refB := reg.push(t, "gc/b:1", buildImage(t, nil, layerOf(t, base), layerOf(t, mkTar(t, entry{name: "b", body: "b"}))))
	a, err := s.Pull(ctx, refA, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	b, err := s.Pull(ctx, refB, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	exists := func(d string) bool { _, err := os.Stat(s.layerDir(d)); return err == nil }
	blobExists := func(d string) bool { _, err := os.Stat(s.blobPath(d)); return err == nil }

	if err := s.Remove(ctx, refA); err != nil {
		t.Fatal(err)
	}
	if exists(a.Layers[1]) || !exists(a.Layers[0]) || !exists(b.Layers[1]) {
		t.Fatal("GC removed the wrong layers after rm a")
	}
	if blobExists(a.ID) || blobExists(a.Digest) || !blobExists(b.ID) {
		t.Fatal("GC did not collect a's blobs only")
	}
	if _, err := s.Get(ctx, refA); !errdefs.IsNotFound(err) {
		t.Fatalf("Get removed = %v", err)
	}

	// A lease keeps b's layers after rm; so does the InUse hook.
	lease, err := s.Acquire(ctx, refB)
	if err != nil {
		t.Fatal(err)
	}
	if len(lease.Layers) != 2 {
		t.Fatalf("lease layers = %v", lease.Layers)
	}
	if err := s.Remove(ctx, b.ID[:16]); err != nil { // by ID prefix
		t.Fatal(err)
	}
	if !exists(b.Layers[0]) || !exists(b.Layers[1]) {
		t.Fatal("GC removed leased layers")
	}
	// Another store instance on the root (the CLI) honours the lease too.
	s2, err := Open(ctx, s.Root())
	if err != nil {
		t.Fatal(err)
	}
	if err := s2.GC(ctx); err != nil {
		t.Fatal(err)
	}
	s2.Close()
	if !exists(b.Layers[0]) {
		t.Fatal("second store collected a leased layer")
	}
	inUse = b.Layers[0]
	lease.Release()
	lease.Release() // idempotent
	if err := s.GC(ctx); err != nil {
		t.Fatal(err)
	}
	if !exists(b.Layers[0]) || exists(b.Layers[1]) {
		t.Fatal("InUse hook not honoured, or unused layer kept")
	}
	inUse = ""
	if err := s.GC(ctx); err != nil {
		t.Fatal(err)
	}
	if exists(b.Layers[0]) {
		t.Fatal("unused layer kept")
	}
	if _, err := s.Acquire(ctx, refB); !errdefs.IsNotFound(err) {
		t.Fatalf("Acquire removed = %v", err)
	}
	idx, err := s.load()
	if err != nil {
		t.Fatal(err)
	}
	if len(idx.Images) != 0 || len(idx.Layers) != 0 {
		t.Fatalf("index not empty: %+v", idx)
	}

	// GC defers to an in-flight writer.
	img, err := s.Import(ctx, "keep", writeTemp(t, "k.tar", mkTar(t, entry{name: "k", body: "k"})))
	if err != nil {
		t.Fatal(err)
	}
	if err := s.update(func(idx *indexFile) error { delete(idx.Images, img.Name); return nil }); err != nil {
		t.Fatal(err)
	}
	unlock, err := s.writerLock()
	if err != nil {
		t.Fatal(err)
	}
	if err := s.GC(ctx); err != nil {
		t.Fatal(err)
	}
	if !exists(img.Layers[0]) {
		t.Fatal("GC ran while a writer held the lock")
	}
	unlock()
	if err := s.GC(ctx); err != nil || exists(img.Layers[0]) {
		t.Fatalf("GC after writer finished: %v, exists=%v", err, exists(img.Layers[0]))
	}
	if !errors.Is(s.Remove(ctx, "keep"), errdefs.ErrNotFound) {
		t.Fatal("removed name still resolvable")
	}
}

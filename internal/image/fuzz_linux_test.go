package image

import (
	"archive/tar"
	"bytes"
	"context"
	"os"
	"path/filepath"
	"syscall"
	"testing"
)

// FuzzExtractTar unpacks arbitrary layer tars: no panic, and nothing is created, changed or linked outside the layer
// directory whatever the names, links and whiteouts say.
func FuzzExtractTar(f *testing.F) {
	for _, es := range [][]entry{
		{{name: "etc/", typ: tar.TypeDir}, {name: "etc/os-release", body: "ID=fz\n"}, {name: "bin/sh", typ: tar.TypeSymlink, link: "/bin/busybox"}},
		{{name: "esc", typ: tar.TypeSymlink, link: "../outside"}, {name: "esc/pwned", body: "x"}},
		{{name: "abs", typ: tar.TypeSymlink, link: "/"}, {name: "abs/tmp/pwned", body: "x"}},
		{{name: "../pwned", body: "x"}},
		{{name: "hl", typ: tar.TypeLink, link: "../outside/keep"}},
		{{name: "a/b", body: "1"}, {name: "a/.wh.b"}, {name: "a/.wh..wh..opq"}, {name: ".wh...", body: ""}},
		{{name: "x", body: "1", xattrs: map[string]string{"user.k": "v", "trusted.overlay.opaque": "y"}}},
		{{name: "dev/null", typ: tar.TypeChar, major: 1, minor: 3}, {name: "fifo", typ: tar.TypeFifo}},
		{{name: "d", typ: tar.TypeDir, mode: 0o7777}, {name: "d", body: "replaces the dir"}, {name: "d/e", body: "under a file"}},
	} {
		f.Add(mkTar(f, es...))
	}
	f.Add([]byte("not a tar"))
	f.Add([]byte{})
	rootless := os.Geteuid() != 0
	f.Fuzz(func(t *testing.T, data []byte) {
		base := t.TempDir()
		layer, outside := filepath.Join(base, "layer"), filepath.Join(base, "outside")
		for _, d := range []string{layer, outside} {
			if err := os.Mkdir(d, 0o755); err != nil {
				t.Fatal(err)
			}
		}
		keep := filepath.Join(outside, "keep")
		if err := os.WriteFile(keep, []byte("keep"), 0o644); err != nil {
			t.Fatal(err)
		}
		err := extractTar(context.Background(), bytes.NewReader(data), layer, rootless)
		_ = err // refusing an archive is fine; what it could do is checked below
		ents, _ := os.ReadDir(base)
		if len(ents) != 2 {
			t.Fatalf("extraction created %v next to the layer", ents)
		}
		ents, _ = os.ReadDir(outside)
		b, rerr := os.ReadFile(keep)
		st, serr := os.Lstat(keep)
		if len(ents) != 1 || rerr != nil || string(b) != "keep" || serr != nil || st.Mode() != 0o644 || st.Sys().(*syscall.Stat_t).Nlink != 1 {
			t.Fatalf("extraction touched the outside: %v %q %v", ents, b, st)
		}
		// Make the layer removable for TempDir's cleanup.
		filepath.Walk(layer, func(p string, info os.FileInfo, err error) error {
			if err == nil && info.IsDir() {
				os.Chmod(p, 0o755)
			}
			return nil
		})
	})
}

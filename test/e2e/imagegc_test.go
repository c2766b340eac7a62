package e2e

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/moat-sandbox/moat/internal/testutil"
	"github.com/moat-sandbox/moat/internal/testutil/localregistry"
)

// TestImageGC: an image's layers go when its last sandbox does, and not
// before: `moat image prune` (run beside the server, and while it is
// down) keeps the image a sandbox runs and removes one whose sandbox was
// deleted; a restarted server re-pins the layers of the sandbox it
// re-adopts; the automatic GC of --image-disk-budget then removes the
// image once that sandbox is deleted too.
func TestImageGC(t *testing.T) {
	srv := newServer(t)
	reg, err := localregistry.Start()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { reg.Close() })
	ctx := context.Background()
	// Two images with layers of their own.
	refs := map[string]string{}
	for _, n := range []string{"kept", "dropped"} {
		dir := filepath.Join(t.TempDir(), "rootfs")
		if out, err := exec.Command("cp", "-a", testutil.BusyboxRootfs(t), dir).CombinedOutput(); err != nil {
			t.Fatalf("cp: %v: %s", err, out)
		}
		if err := os.WriteFile(filepath.Join(dir, "which"), []byte(n), 0o644); err != nil {
			t.Fatal(err)
		}
		ref, err := reg.PushDir(ctx, dir, "e2e/gc-"+n+":1", []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin"})
		if err != nil {
			t.Fatal(err)
		}
		refs[n] = ref
	}
	layers := func() map[string]bool {
		ents, _ := os.ReadDir(filepath.Join(srv.root, "images", "layers", "sha256"))
		out := map[string]bool{}
		for _, e := range ents {
			out[e.Name()] = true
		}
		return out
	}
	images := func() string {
		r := cli(t, srv, nil, "image", "--root", srv.root, "ls")
		if r.code != 0 {
			t.Fatalf("image ls: %d %s", r.code, r.stderr)
		}
		return r.stdout
	}
	prune := func() []string {
		t.Helper()
		r := cli(t, srv, nil, "image", "--root", srv.root, "prune")
		if r.code != 0 {
			t.Fatalf("image prune: exit %d: %s", r.code, r.stderr)
		}
		return strings.Fields(r.stdout)
	}
	create := func(ref string) string {
		var c sandboxResp
		srv.mustJSON(202, "POST", "/v1/sandboxes", map[string]any{"image": map[string]any{"uri": ref},
			"entrypoint": []string{"tail", "-f", "/dev/null"}}, &c)
		return c.ID
	}

	srv.start()
	kept := create(refs["kept"])
	before := layers()
	dropped := create(refs["dropped"])
	dropLayers := map[string]bool{}
	for l := range layers() {
		if !before[l] {
			dropLayers[l] = true
		}
	}
	if len(dropLayers) == 0 {
		t.Fatal("the second image added no layer of its own")
	}
	srv.mustJSON(204, "DELETE", "/v1/sandboxes/"+dropped, nil, nil)

	// Beside the running server: only the image without a sandbox goes.
	if got := prune(); len(got) != 1 || !strings.Contains(got[0], "gc-dropped") {
		t.Fatalf("prune removed %v, want only the dropped image", got)
	}
	for l := range dropLayers {
		if layers()[l] {
			t.Fatalf("layer %s of the pruned image is still on disk", l)
		}
	}
	if !strings.Contains(images(), "gc-kept") {
		t.Fatal("prune removed the image a sandbox runs")
	}

	// While the server is down: the mounted root still protects it.
	srv.stop()
	if got := prune(); len(got) != 0 {
		t.Fatalf("prune with the server down removed %v", got)
	}
	// A restarted server re-adopts the sandbox and pins its layers; the
	// disk-budget GC (1 byte: everything unused must go) keeps them.
	srv.start("--image-disk-budget", "1")
	if out, ok := shell(t, srv, kept, "cat /which"); !ok || strings.TrimSpace(out) != "kept" {
		t.Fatalf("re-adopted sandbox: ok=%v %q", ok, out)
	}
	if got := prune(); len(got) != 0 {
		t.Fatalf("prune removed %v under a re-adopted sandbox", got)
	}
	srv.mustJSON(204, "DELETE", "/v1/sandboxes/"+kept, nil, nil)
	srv.stop()
	// Its last sandbox gone, the automatic GC removes it at the next start.
	srv.start("--image-disk-budget", "1")
	deadline := time.Now().Add(30 * time.Second)
	for strings.Contains(images(), "gc-kept") {
		if time.Now().After(deadline) {
			t.Fatalf("the disk-budget GC kept an unused image for 30 s:\n%s", images())
		}
		time.Sleep(200 * time.Millisecond)
	}
	if left := layers(); len(left) != 0 {
		t.Fatalf("layers left after every image went: %v", left)
	}
}

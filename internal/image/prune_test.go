package image

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/moat-sandbox/moat/internal/testutil"
)

// importTar imports a one-layer image whose only file is name (content
// body) and returns it.
func importTar(t *testing.T, s *Store, ref, name, body string) Image {
	t.Helper()
	img, err := s.Import(context.Background(), ref, writeTemp(t, "l.tar", mkTar(t, entry{name: name, body: body})))
	if err != nil {
		t.Fatal(err)
	}
	return img
}

func names(imgs []Image) []string {
	var out []string
	for _, i := range imgs {
		out = append(out, i.Name)
	}
	slices.Sort(out)
	return out
}

func layerGone(s *Store, img Image) bool {
	_, err := os.Stat(s.layerDir(img.Layers[0]))
	return os.IsNotExist(err)
}

// TestPruneReleasesUnusedImages: Prune removes the images no sandbox uses
// and their layers, keeps a leased one (a sandbox runs it, also after a
// restart: LeaseLayers by path) and snapshot images, and releases the
// leased one once its lease goes.
func TestPruneReleasesUnusedImages(t *testing.T) {
	s := openStore(t)
	ctx := context.Background()
	used := importTar(t, s, "t/used:1", "u", "used")
	unused := importTar(t, s, "t/unused:1", "x", "unused")
	snap := importTar(t, s, SnapshotRepo+":sn-1", "s", "snapshot")
	paths, err := s.LayerPaths(ctx, used)
	if err != nil {
		t.Fatal(err)
	}
	lease, err := s.LeaseLayers(paths)
	if err != nil {
		t.Fatal(err)
	}
	res, err := s.Prune(ctx, PruneOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got := names(res.Removed); !slices.Equal(got, []string{unused.Name}) {
		t.Fatalf("pruned %v, want only %s", got, unused.Name)
	}
	if !layerGone(s, unused) || layerGone(s, used) || layerGone(s, snap) {
		t.Fatalf("layers after prune: unused gone=%v used gone=%v snapshot gone=%v", layerGone(s, unused), layerGone(s, used), layerGone(s, snap))
	}
	if img, _ := s.Get(ctx, used.Name); img.LastUsed.IsZero() {
		t.Error("an image in use was not marked used")
	}
	lease.Release()
	if _, err := s.Prune(ctx, PruneOptions{}); err != nil {
		t.Fatal(err)
	}
	if !layerGone(s, used) {
		t.Fatal("the image stayed after its last sandbox's lease went")
	}
	if _, err := s.Get(ctx, snap.Name); err != nil || layerGone(s, snap) {
		t.Fatalf("the snapshot image went: %v", err)
	}
	if _, err := s.LeaseLayers([]string{"/etc"}); err == nil {
		t.Fatal("LeaseLayers accepted a path outside the store")
	}
}

// TestPruneBudgetEvictsLeastRecentlyUsed: with a budget, Prune removes the
// least recently used unused images until the rest fit, and no more.
func TestPruneBudgetEvictsLeastRecentlyUsed(t *testing.T) {
	s := openStore(t)
	ctx := context.Background()
	var imgs []Image
	for i, n := range []string{"a", "b", "c"} {
		imgs = append(imgs, importTar(t, s, "t/"+n+":1", n, strings.Repeat(n, 4096*(i+1))))
	}
	// a is the oldest use, c the newest.
	s.update(func(idx *indexFile) error {
		for i, img := range imgs {
			img.LastUsed = time.Date(2026, 1, 1+i, 0, 0, 0, 0, time.UTC)
			idx.Images[img.Name] = img
		}
		return nil
	})
	total := imgs[0].Size + imgs[1].Size + imgs[2].Size
	res, err := s.Prune(ctx, PruneOptions{Budget: total - imgs[0].Size})
	if err != nil {
		t.Fatal(err)
	}
	if got := names(res.Removed); !slices.Equal(got, []string{imgs[0].Name}) || res.Size != total-imgs[0].Size {
		t.Fatalf("budget prune removed %v (size %d), want only %s (size %d)", got, res.Size, imgs[0].Name, total-imgs[0].Size)
	}
	res, err = s.Prune(ctx, PruneOptions{Budget: imgs[2].Size})
	if err != nil {
		t.Fatal(err)
	}
	if got := names(res.Removed); !slices.Equal(got, []string{imgs[1].Name}) || res.Size != imgs[2].Size {
		t.Fatalf("second budget prune removed %v (size %d)", got, res.Size)
	}
}

// TestGCKeepsMountedLayers: a layer under a mounted overlay stays, even
// with no name and no lease (a sandbox whose server is down), and goes
// once unmounted.
func TestGCKeepsMountedLayers(t *testing.T) {
	testutil.RequiresRoot(t)
	s := openStore(t)
	ctx := context.Background()
	img := importTar(t, s, "t/mounted:1", "m", "mounted")
	lower, err := s.LayerPaths(ctx, img)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	upper, work, target := filepath.Join(dir, "u"), filepath.Join(dir, "w"), filepath.Join(dir, "r")
	for _, d := range []string{upper, work, target} {
		os.Mkdir(d, 0o755)
	}
	if err := MountRootfs(lower, upper, work, target); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Unmount(target, unix.MNT_DETACH) })
	if err := s.Remove(ctx, img.Name); err != nil {
		t.Fatal(err)
	}
	if layerGone(s, img) {
		t.Fatal("GC removed the layer of a mounted root")
	}
	if err := Unmount(target); err != nil {
		t.Fatal(err)
	}
	if err := s.GC(ctx); err != nil {
		t.Fatal(err)
	}
	if !layerGone(s, img) {
		t.Fatal("the layer stayed after the unmount")
	}
}

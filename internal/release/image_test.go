package release

import (
	"archive/tar"
	"bytes"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// TestImageLayout builds a two-platform image into a temporary OCI
// layout and reads it back: an index named by the ref, one OCI image per
// platform whose config has the platform, the entrypoint and the labels,
// and whose one layer holds that platform's binary at /moat, mode 0755,
// owned by root.
func TestImageLayout(t *testing.T) {
	dir := t.TempDir()
	bins := map[string][]byte{"linux/amd64": []byte("\x7fELF amd64 moat"), "linux/arm64": []byte("\x7fELF arm64 moat, longer")}
	img := Image{Binaries: map[string]string{}, Version: "v0.3.0", Commit: "0123abcd", Created: time.Unix(1700000000, 0).UTC()}
	for p, data := range bins {
		f := filepath.Join(dir, filepath.Base(p))
		if err := os.WriteFile(f, data, 0o600); err != nil {
			t.Fatal(err)
		}
		img.Binaries[p] = f
	}
	idx, err := Build(img)
	if err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, "oci")
	if err := WriteLayout(out, "ghcr.io/moat-sandbox/moat:v0.3.0", idx); err != nil {
		t.Fatal(err)
	}

	lp, err := layout.FromPath(out)
	if err != nil {
		t.Fatal(err)
	}
	top, err := lp.ImageIndex()
	if err != nil {
		t.Fatal(err)
	}
	tm, err := top.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	if len(tm.Manifests) != 1 || tm.Manifests[0].MediaType != types.OCIImageIndex ||
		tm.Manifests[0].Annotations["org.opencontainers.image.ref.name"] != "v0.3.0" ||
		tm.Manifests[0].Annotations["io.containerd.image.name"] != "ghcr.io/moat-sandbox/moat:v0.3.0" {
		t.Fatalf("index.json: %+v", tm.Manifests)
	}
	multi, err := top.ImageIndex(tm.Manifests[0].Digest)
	if err != nil {
		t.Fatal(err)
	}
	mm, err := multi.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	if len(mm.Manifests) != 2 {
		t.Fatalf("multi-arch index: %d manifests", len(mm.Manifests))
	}
	for i, want := range []string{"linux/amd64", "linux/arm64"} {
		d := mm.Manifests[i]
		if d.Platform == nil || d.Platform.OS+"/"+d.Platform.Architecture != want || d.MediaType != types.OCIManifestSchema1 {
			t.Fatalf("manifest %d: %+v, want %s", i, d, want)
		}
		im, err := multi.Image(d.Digest)
		if err != nil {
			t.Fatal(err)
		}
		checkImage(t, want, im, bins[want], img)
	}

	// The same input builds the same index (reproducible).
	again, err := Build(img)
	if err != nil {
		t.Fatal(err)
	}
	d1, err1 := idx.Digest()
	d2, err2 := again.Digest()
	if err1 != nil || err2 != nil || d1 != d2 {
		t.Errorf("two builds of the same binaries differ: %v %v, %v %v", d1, err1, d2, err2)
	}

	// A layout is written only into an empty directory.
	if err := WriteLayout(out, "moat:v0.3.0", idx); err == nil {
		t.Error("WriteLayout into a non-empty directory")
	}

	// The archive holds the layout's files.
	arch := filepath.Join(dir, "moat-oci.tar")
	if err := WriteArchive(out, arch, img.Created); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(arch)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	names := map[string]bool{}
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		names[h.Name] = true
	}
	for _, n := range []string{"oci-layout", "index.json", "blobs/", "blobs/sha256/"} {
		if !names[n] {
			t.Errorf("archive lacks %s: %v", n, names)
		}
	}
}

func checkImage(t *testing.T, platform string, im v1.Image, bin []byte, img Image) {
	t.Helper()
	cf, err := im.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	if cf.OS+"/"+cf.Architecture != platform || len(cf.Config.Entrypoint) != 1 || cf.Config.Entrypoint[0] != "/moat" ||
		cf.Config.Labels["org.opencontainers.image.version"] != "v0.3.0" || cf.Config.Labels["org.opencontainers.image.revision"] != "0123abcd" ||
		!cf.Created.Time.Equal(img.Created) {
		b, _ := json.Marshal(cf)
		t.Fatalf("%s config: %s", platform, b)
	}
	if mt, _ := im.MediaType(); mt != types.OCIManifestSchema1 {
		t.Errorf("%s manifest media type %s", platform, mt)
	}
	layers, err := im.Layers()
	if err != nil || len(layers) != 1 {
		t.Fatalf("%s layers: %d, %v", platform, len(layers), err)
	}
	if mt, _ := layers[0].MediaType(); mt != types.OCILayer {
		t.Errorf("%s layer media type %s", platform, mt)
	}
	rc, err := layers[0].Uncompressed()
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	tr := tar.NewReader(rc)
	h, err := tr.Next()
	if err != nil {
		t.Fatal(err)
	}
	data, _ := io.ReadAll(tr)
	if h.Name != "moat" || h.Typeflag != tar.TypeReg || h.Mode != 0o755 || h.Uid != 0 || h.Gid != 0 || !bytes.Equal(data, bin) {
		t.Errorf("%s layer entry %q type %c mode %o uid %d gid %d, content %q; want moat 0755 root %q", platform, h.Name, h.Typeflag, h.Mode, h.Uid, h.Gid, data, bin)
	}
	if _, err := tr.Next(); err != io.EOF {
		t.Errorf("%s layer holds more than moat: %v", platform, err)
	}
}

func TestBuildRefusesBadInput(t *testing.T) {
	if _, err := Build(Image{}); err == nil {
		t.Error("no binaries accepted")
	}
	if _, err := Build(Image{Binaries: map[string]string{"amd64": "/nonexistent"}}); err == nil {
		t.Error("platform without os accepted")
	}
	if _, err := Build(Image{Binaries: map[string]string{"linux/amd64": filepath.Join(t.TempDir(), "missing")}}); err == nil {
		t.Error("missing binary accepted")
	}
}

// Package release builds what `make release` ships besides the archives:
// the OCI image of moat (the server and the Kubernetes controller run the
// same binary, /moat, its entrypoint), one image per platform under a
// multi-arch index, written as an OCI image layout directory and as a
// tarball of it (an oci-archive) — without Docker or any daemon. It is
// linked into cmd/moat-release only.
package release

import (
	"archive/tar"
	"bytes"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// BinaryPath is where the image holds moat, and its entrypoint.
const BinaryPath = "/moat"

// Image describes the image to build.
type Image struct {
	// Binaries maps a platform ("linux/amd64") to the moat binary built
	// for it.
	Binaries map[string]string
	// Version and Commit label the image (org.opencontainers.image.*).
	Version, Commit string
	// Created is the image's creation time and every file's mtime (a
	// fixed time makes the build reproducible).
	Created time.Time
}

// Build returns the multi-arch index of img's platforms, in sorted
// platform order.
func Build(img Image) (v1.ImageIndex, error) {
	if len(img.Binaries) == 0 {
		return nil, fmt.Errorf("release: no binaries")
	}
	platforms := make([]string, 0, len(img.Binaries))
	for p := range img.Binaries {
		platforms = append(platforms, p)
	}
	slices.Sort(platforms)
	idx := mutate.IndexMediaType(empty.Index, types.OCIImageIndex)
	for _, p := range platforms {
		goos, goarch, ok := strings.Cut(p, "/")
		if !ok || goos == "" || goarch == "" {
			return nil, fmt.Errorf("release: platform %q: want os/arch", p)
		}
		im, err := platformImage(img, goos, goarch, img.Binaries[p])
		if err != nil {
			return nil, fmt.Errorf("release: %s: %w", p, err)
		}
		idx = mutate.AppendManifests(idx, mutate.IndexAddendum{Add: im,
			Descriptor: v1.Descriptor{Platform: &v1.Platform{OS: goos, Architecture: goarch}}})
	}
	return idx, nil
}

// platformImage is one layer holding bin at BinaryPath (mode 0755, owned
// by root) on an empty OCI image.
func platformImage(img Image, goos, goarch, bin string) (v1.Image, error) {
	data, err := os.ReadFile(bin)
	if err != nil {
		return nil, err
	}
	layerTar, err := binaryLayer(data, img.Created)
	if err != nil {
		return nil, err
	}
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(layerTar)), nil
	}, tarball.WithMediaType(types.OCILayer))
	if err != nil {
		return nil, err
	}
	base := mutate.ConfigMediaType(mutate.MediaType(empty.Image, types.OCIManifestSchema1), types.OCIConfigJSON)
	im, err := mutate.Append(base, mutate.Addendum{Layer: layer, MediaType: types.OCILayer,
		History: v1.History{Created: v1.Time{Time: img.Created}, CreatedBy: "moat-release: COPY moat " + BinaryPath}})
	if err != nil {
		return nil, err
	}
	cf, err := im.ConfigFile()
	if err != nil {
		return nil, err
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = goos, goarch
	cf.Created = v1.Time{Time: img.Created}
	cf.Config.Entrypoint = []string{BinaryPath}
	cf.Config.WorkingDir = "/"
	cf.Config.Labels = map[string]string{
		"org.opencontainers.image.title":       "moat",
		"org.opencontainers.image.description": "moat: the sandbox server (moat serve) and Kubernetes controller (moat controller)",
		"org.opencontainers.image.version":     img.Version,
		"org.opencontainers.image.revision":    img.Commit,
	}
	return mutate.ConfigFile(im, cf)
}

// binaryLayer is the uncompressed tar of the layer.
func binaryLayer(data []byte, mtime time.Time) ([]byte, error) {
	var b bytes.Buffer
	tw := tar.NewWriter(&b)
	if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: strings.TrimPrefix(BinaryPath, "/"),
		Mode: 0o755, Size: int64(len(data)), ModTime: mtime, Format: tar.FormatPAX}); err != nil {
		return nil, err
	}
	if _, err := tw.Write(data); err != nil {
		return nil, err
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return b.Bytes(), nil
}

// WriteLayout writes idx as the OCI image layout dir (which must not
// exist yet or be empty), its one entry named ref ("moat:v0.3.0") for
// the tools that import layouts (skopeo, ctr, docker load, podman).
func WriteLayout(dir, ref string, idx v1.ImageIndex) error {
	if ents, err := os.ReadDir(dir); err == nil && len(ents) > 0 {
		return fmt.Errorf("release: %s is not empty", dir)
	}
	p, err := layout.Write(dir, empty.Index)
	if err != nil {
		return err
	}
	tag := ref
	if i := strings.LastIndex(ref, ":"); i >= 0 && !strings.Contains(ref[i:], "/") {
		tag = ref[i+1:]
	}
	return p.AppendIndex(idx, layout.WithAnnotations(map[string]string{
		"org.opencontainers.image.ref.name": tag,
		"io.containerd.image.name":          ref,
	}))
}

// WriteArchive writes the layout dir as an uncompressed tar at path (an
// oci-archive), entries sorted, owned by root, with mtime.
func WriteArchive(dir, path string, mtime time.Time) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	tw := tar.NewWriter(f)
	werr := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || p == dir {
			return err
		}
		rel, err := filepath.Rel(dir, p)
		if err != nil {
			return err
		}
		hdr := &tar.Header{Name: filepath.ToSlash(rel), ModTime: mtime, Format: tar.FormatPAX}
		if d.IsDir() {
			hdr.Typeflag, hdr.Name, hdr.Mode = tar.TypeDir, hdr.Name+"/", 0o755
			return tw.WriteHeader(hdr)
		}
		data, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		hdr.Typeflag, hdr.Mode, hdr.Size = tar.TypeReg, 0o644, int64(len(data))
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		_, err = tw.Write(data)
		return err
	})
	if err := tw.Close(); werr == nil {
		werr = err
	}
	if err := f.Close(); werr == nil {
		werr = err
	}
	return werr
}

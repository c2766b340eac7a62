package image

import (
	"archive/tar"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	goruntime "runtime"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/moat-sandbox/moat/internal/errdefs"
)

// DefaultPath is the PATH given to images built from a bare rootfs.
const DefaultPath = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// Import stores the image at p under name: an OCI layout directory, a
// rootfs directory, a `docker save` tarball (one image), or a rootfs tar,
// compressed or not. A rootfs gets a config with only Env=[DefaultPath]
// and no creation time, so importing one tree twice yields one image ID.
func (s *Store) Import(ctx context.Context, name, p string) (Image, error) {
	n, err := NormalizeName(name)
	if err != nil {
		return Image{}, err
	}
	fi, err := os.Stat(p)
	if errors.Is(err, fs.ErrNotExist) {
		return Image{}, fmt.Errorf("import %s: %w", p, errdefs.ErrNotFound)
	}
	if err != nil {
		return Image{}, fmt.Errorf("import %s: %w", p, err)
	}
	if fi.IsDir() {
		if _, err := os.Stat(filepath.Join(p, "oci-layout")); err == nil {
			return s.importLayout(ctx, n, p)
		}
		return s.importRootfs(ctx, n, func() (io.ReadCloser, error) {
			pr, pw := io.Pipe()
			go func() { pw.CloseWithError(writeTar(ctx, pw, p, tarOptions{})) }()
			return pr, nil
		})
	}
	if !fi.Mode().IsRegular() {
		return Image{}, fmt.Errorf("import %s: not a directory or regular file: %w", p, errdefs.ErrInvalidArgument)
	}
	if isDockerSave(p) {
		img, err := tarball.ImageFromPath(p, nil)
		if err != nil {
			return Image{}, fmt.Errorf("import %s: %v: %w", p, err, errdefs.ErrInvalidArgument)
		}
		return s.storeImage(ctx, n, img, false, nil)
	}
	return s.importRootfs(ctx, n, func() (io.ReadCloser, error) {
		f, err := os.Open(p)
		if err != nil {
			return nil, err
		}
		zr, err := decompress(f)
		if err != nil {
			f.Close()
			return nil, err
		}
		return readCloser{Reader: zr, close: func() error { zr.Close(); return f.Close() }}, nil
	})
}

type readCloser struct {
	io.Reader
	close func() error
}

func (r readCloser) Close() error { return r.close() }

// isDockerSave reports whether p is an uncompressed tar with a top-level
// manifest.json (docker save, or go-containerregistry's tarball.Write).
func isDockerSave(p string) bool {
	f, err := os.Open(p)
	if err != nil {
		return false
	}
	defer f.Close()
	tr := tar.NewReader(f) // *os.File seeks over file bodies
	for {
		hdr, err := tr.Next()
		if err != nil {
			return false
		}
		if path.Clean(hdr.Name) == "manifest.json" {
			return true
		}
	}
}

func (s *Store) importRootfs(ctx context.Context, name string, open func() (io.ReadCloser, error)) (Image, error) {
	unlock, err := s.writerLock()
	if err != nil {
		return Image{}, err
	}
	defer unlock()
	rc, err := open()
	if err != nil {
		return Image{}, fmt.Errorf("import: %w", err)
	}
	diffID, size, err := s.putLayer(ctx, rc, "")
	rc.Close()
	if err != nil {
		return Image{}, fmt.Errorf("import %s: %w", name, err)
	}
	cf := &v1.ConfigFile{
		Architecture: goruntime.GOARCH,
		OS:           "linux",
		RootFS:       v1.RootFS{Type: "layers"},
		Config:       v1.Config{Env: []string{DefaultPath}},
	}
	return s.addLayerImage(name, cf, diffID, size)
}

// addLayerImage appends diffID to cf's layers, stores the config blob and
// records the image. Preconditions: the writer lock is held.
func (s *Store) addLayerImage(name string, cf *v1.ConfigFile, diffID string, size int64) (Image, error) {
	h, err := v1.NewHash(diffID)
	if err != nil {
		return Image{}, err
	}
	cf.RootFS.DiffIDs = append(cf.RootFS.DiffIDs, h)
	cf.History = append(cf.History, v1.History{CreatedBy: "moat", Comment: "moat layer"})
	raw, err := json.Marshal(cf)
	if err != nil {
		return Image{}, err
	}
	id, err := s.writeBlob(raw)
	if err != nil {
		return Image{}, err
	}
	idx, err := s.load()
	if err != nil {
		return Image{}, err
	}
	img := Image{Name: name, ID: id, Config: configOf(cf), CreatedAt: time.Now().UTC()}
	sizes := make([]int64, len(cf.RootFS.DiffIDs))
	for i, d := range cf.RootFS.DiffIDs {
		img.Layers = append(img.Layers, d.String())
		sizes[i] = idx.Layers[d.String()].Size
	}
	sizes[len(sizes)-1] = size
	for _, n := range sizes {
		img.Size += n
	}
	if err := s.record(img, cf.RootFS.DiffIDs, sizes); err != nil {
		return Image{}, err
	}
	return img, nil
}

func (s *Store) importLayout(ctx context.Context, name, dir string) (Image, error) {
	ii, err := layout.ImageIndexFromPath(dir)
	if err != nil {
		return Image{}, fmt.Errorf("import OCI layout %s: %v: %w", dir, err, errdefs.ErrInvalidArgument)
	}
	img, err := s.pickImage(ii, 0)
	if err != nil {
		return Image{}, fmt.Errorf("import OCI layout %s: %w", dir, err)
	}
	return s.storeImage(ctx, name, img, false, nil)
}

// pickImage finds the image for the store's platform in ii (descending
// into nested indexes), or the only image if none declares a platform.
func (s *Store) pickImage(ii v1.ImageIndex, depth int) (v1.Image, error) {
	if depth > 4 {
		return nil, fmt.Errorf("image indexes nested too deeply: %w", errdefs.ErrInvalidArgument)
	}
	im, err := ii.IndexManifest()
	if err != nil {
		return nil, fmt.Errorf("%v: %w", err, errdefs.ErrInvalidArgument)
	}
	var candidates []v1.Descriptor
	for _, d := range im.Manifests {
		if d.Platform == nil || d.Platform.Satisfies(s.opts.platform) {
			candidates = append(candidates, d)
		}
	}
	for _, d := range candidates {
		switch {
		case d.MediaType.IsImage():
			return ii.Image(d.Digest)
		case d.MediaType.IsIndex():
			child, err := ii.ImageIndex(d.Digest)
			if err != nil {
				return nil, err
			}
			if img, err := s.pickImage(child, depth+1); err == nil {
				return img, nil
			}
		}
	}
	return nil, fmt.Errorf("no image for %s: %w", s.opts.platform.String(), errdefs.ErrNotFound)
}

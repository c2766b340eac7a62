package image

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	goruntime "runtime"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/moat-sandbox/moat/internal/errdefs"
)

// CommitLayer turns an overlayfs upper directory into a new layer on top
// of base and stores the result under name (a snapshot). Overlay whiteouts
// (0:0 character devices) become OCI ".wh." entries and opaque directories
// get ".wh..wh..opq", so the layer's diff ID is that of a portable OCI
// layer; the stored tree is converted back to overlay form like any pulled
// layer. Identical upper dirs produce the same diff ID and share one
// extracted tree. base may be the zero Image for a single-layer image.
//
// The upper dir should not be modified during the commit (pause the
// sandbox first); upper dirs that use overlay redirects or metacopy are
// ErrNotImplemented.
func (s *Store) CommitLayer(ctx context.Context, upperDir string, base Image, name string) (Image, error) {
	n, err := NormalizeName(name)
	if err != nil {
		return Image{}, err
	}
	if fi, err := os.Stat(upperDir); err != nil || !fi.IsDir() {
		return Image{}, fmt.Errorf("commit: upper dir %q is not a directory: %w", upperDir, errdefs.ErrInvalidArgument)
	}
	unlock, err := s.writerLock()
	if err != nil {
		return Image{}, err
	}
	defer unlock()

	cf := &v1.ConfigFile{Architecture: goruntime.GOARCH, OS: "linux", RootFS: v1.RootFS{Type: "layers"}}
	if base.ID != "" {
		if _, err := s.LayerPaths(ctx, base); err != nil {
			return Image{}, fmt.Errorf("commit: base %s: %w", base.Name, err)
		}
		raw, err := s.readBlob(base.ID)
		if err != nil {
			return Image{}, fmt.Errorf("commit: base %s config: %w", base.Name, err)
		}
		if err := json.Unmarshal(raw, cf); err != nil {
			return Image{}, fmt.Errorf("commit: base %s config: %v: %w", base.Name, err, errdefs.ErrInternal)
		}
	} else {
		cf.Config.Env = []string{DefaultPath}
	}

	pr, pw := io.Pipe()
	go func() { pw.CloseWithError(writeTar(ctx, pw, upperDir, tarOptions{overlayUpper: true})) }()
	diffID, size, err := s.putLayer(ctx, pr, "")
	pr.Close()
	if err != nil {
		return Image{}, fmt.Errorf("commit %s: %w", n, err)
	}
	return s.addLayerImage(n, cf, diffID, size)
}

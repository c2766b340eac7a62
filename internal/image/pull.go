package image

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/remote/transport"
	"golang.org/x/sync/errgroup"

	"github.com/moat-sandbox/moat/internal/errdefs"
)

// pullJobs bounds concurrent layer downloads per image.
const pullJobs = 3

// Pull fetches ref (platform per WithPlatform) and stores it under its
// normalized name; extracted layers are not fetched again. Loopback and
// RFC 1918 registries are spoken to over HTTP, others over HTTPS, and
// the host's docker config is never read. Concurrent pulls of one ref
// with the same auth share one download (progress, which may be nil, goes
// to the first caller). Errors carry errdefs classes.
func (s *Store) Pull(ctx context.Context, ref string, auth *Auth, progress func(Progress)) (Image, error) {
	r, err := parseRef(ref)
	if err != nil {
		return Image{}, err
	}
	if err := s.opts.registryAllowed(r.Context().RegistryStr()); err != nil {
		return Image{}, err
	}
	key := r.Name()
	if auth != nil {
		key += "\x00" + auth.Username + "\x00" + auth.Password
	}
	img, _, err := s.pulls.Do(ctx, key, func(ctx context.Context) (Image, error) {
		return s.pull(ctx, r, auth, progress)
	})
	return img, err
}

// Ensure returns the local image for ref if it is present and complete,
// and pulls it otherwise.
func (s *Store) Ensure(ctx context.Context, ref string, auth *Auth) (Image, error) {
	img, err := s.Get(ctx, ref)
	if err == nil {
		if _, lerr := s.LayerPaths(ctx, img); lerr == nil {
			return img, nil
		}
	} else if !errdefs.IsNotFound(err) {
		return Image{}, err
	}
	return s.Pull(ctx, ref, auth, nil)
}

func (s *Store) pull(ctx context.Context, r name.Reference, auth *Auth, progress func(Progress)) (Image, error) {
	var a authn.Authenticator = authn.Anonymous
	if auth != nil && (auth.Username != "" || auth.Password != "") {
		a = authn.FromConfig(authn.AuthConfig{Username: auth.Username, Password: auth.Password})
	}
	rimg, err := remote.Image(r,
		remote.WithContext(ctx),
		remote.WithAuth(a),
		remote.WithPlatform(s.opts.platform),
		remote.WithUserAgent("moat"),
	)
	if err != nil {
		return Image{}, classifyRemote(ctx, r.Name(), err)
	}
	img, err := s.storeImage(ctx, r.Name(), rimg, true, progress)
	if err != nil {
		return Image{}, classifyRemote(ctx, r.Name(), err)
	}
	return img, nil
}

// storeImage extracts every layer of src not yet present and records src
// under name. fromRegistry selects fetching compressed blobs (so progress
// is in transferred bytes) over the source's uncompressed streams.
func (s *Store) storeImage(ctx context.Context, name string, src v1.Image, fromRegistry bool, progress func(Progress)) (Image, error) {
	unlock, err := s.writerLock()
	if err != nil {
		return Image{}, err
	}
	defer unlock()

	in, err := readSource(src)
	if err != nil {
		return Image{}, err
	}
	diffIDs := in.config.RootFS.DiffIDs
	sizes, err := s.fetchLayers(ctx, in.layers, diffIDs, fromRegistry, progress)
	if err != nil {
		return Image{}, err
	}
	id, err := s.writeBlob(in.rawConfig)
	if err != nil {
		return Image{}, err
	}
	if in.rawManifest != nil {
		if _, err := s.writeBlob(in.rawManifest); err != nil {
			return Image{}, err
		}
	}
	img := Image{
		Name:      name,
		ID:        id,
		Digest:    in.manifestDigest,
		Config:    configOf(in.config),
		CreatedAt: time.Now().UTC(),
	}
	for i, d := range diffIDs {
		img.Layers = append(img.Layers, d.String())
		img.Size += sizes[i]
	}
	if err := s.record(img, diffIDs, sizes); err != nil {
		return Image{}, err
	}
	return img, nil
}

// source is what storeImage reads of an image before fetching its layers.
type source struct {
	rawConfig      []byte
	config         *v1.ConfigFile
	layers         []v1.Layer
	rawManifest    []byte // nil if the source has none
	manifestDigest string
}

func readSource(src v1.Image) (source, error) {
	var in source
	var err error
	if in.rawConfig, err = src.RawConfigFile(); err != nil {
		return source{}, fmt.Errorf("image config: %w", err)
	}
	if in.config, err = src.ConfigFile(); err != nil {
		return source{}, fmt.Errorf("image config: %v: %w", err, errdefs.ErrInvalidArgument)
	}
	if in.layers, err = src.Layers(); err != nil {
		return source{}, fmt.Errorf("image layers: %w", err)
	}
	if len(in.layers) != len(in.config.RootFS.DiffIDs) {
		return source{}, fmt.Errorf("image has %d layers but %d diff IDs: %w", len(in.layers), len(in.config.RootFS.DiffIDs), errdefs.ErrInvalidArgument)
	}
	if m, err := src.RawManifest(); err == nil {
		in.rawManifest = m
		if d, err := src.Digest(); err == nil {
			in.manifestDigest = d.String()
		}
	}
	return in, nil
}

// fetchLayers extracts the layers not yet present, pullJobs at a time,
// and returns every layer's size. Preconditions: the writer lock is held.
func (s *Store) fetchLayers(ctx context.Context, layers []v1.Layer, diffIDs []v1.Hash, fromRegistry bool, progress func(Progress)) ([]int64, error) {
	idx, err := s.load()
	if err != nil {
		return nil, err
	}
	sizes := make([]int64, len(layers))
	var report func(Progress)
	if progress != nil {
		var mu sync.Mutex // serialise callbacks across layer goroutines
		report = func(p Progress) { mu.Lock(); progress(p); mu.Unlock() }
	}
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(pullJobs)
	for i, l := range layers {
		diffID := diffIDs[i].String()
		if s.hasLayer(diffID) {
			sizes[i] = idx.Layers[diffID].Size
			if report != nil {
				report(Progress{Layer: diffID, Done: true, Cached: true})
			}
			continue
		}
		g.Go(func() error {
			n, shared, err := s.layers.Do(gctx, diffID, func(ctx context.Context) (int64, error) {
				if s.hasLayer(diffID) {
					return idx.Layers[diffID].Size, nil
				}
				return s.fetchLayer(ctx, l, diffID, fromRegistry, report)
			})
			if err != nil {
				return fmt.Errorf("layer %s: %w", diffID, err)
			}
			sizes[i] = n
			if shared && report != nil {
				report(Progress{Layer: diffID, Done: true, Cached: true})
			}
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return nil, err
	}
	return sizes, nil
}

// record writes img and its layer sizes to the index.
func (s *Store) record(img Image, diffIDs []v1.Hash, sizes []int64) error {
	return s.update(func(idx *indexFile) error {
		idx.Images[img.Name] = img
		for i, d := range diffIDs {
			if sizes[i] > 0 || idx.Layers[d.String()].Size == 0 {
				idx.Layers[d.String()] = layerRecord{Size: sizes[i]}
			}
		}
		return nil
	})
}

func (s *Store) fetchLayer(ctx context.Context, l v1.Layer, diffID string, fromRegistry bool, report func(Progress)) (int64, error) {
	var total int64
	var rc io.ReadCloser
	var err error
	if fromRegistry {
		total, _ = l.Size()
		rc, err = l.Compressed()
	} else {
		rc, err = l.Uncompressed()
	}
	if err != nil {
		return 0, err
	}
	defer rc.Close()
	var in io.Reader = &ctxReader{ctx: ctx, r: rc}
	if report != nil {
		in = &progressReader{r: in, layer: diffID, total: total, report: report}
	}
	tarStream := io.NopCloser(in)
	if fromRegistry {
		if tarStream, err = decompress(in); err != nil {
			return 0, err
		}
		defer tarStream.Close()
	}
	_, n, err := s.putLayer(ctx, tarStream, diffID)
	if err != nil {
		return 0, err
	}
	// Consume the rest so the registry reader verifies the blob digest.
	if _, err := io.Copy(io.Discard, in); err != nil {
		return 0, err
	}
	if report != nil {
		report(Progress{Layer: diffID, Complete: total, Total: total, Done: true})
	}
	return n, nil
}

// ctxReader fails reads once ctx is done, so a stalled local source
// cannot outlive its caller.
type ctxReader struct {
	ctx context.Context
	r   io.Reader
}

func (c *ctxReader) Read(p []byte) (int, error) {
	if err := c.ctx.Err(); err != nil {
		return 0, err
	}
	return c.r.Read(p)
}

// progressReader reports at most every 512 KiB.
type progressReader struct {
	r       io.Reader
	layer   string
	total   int64
	n, last int64
	report  func(Progress)
}

func (p *progressReader) Read(b []byte) (int, error) {
	n, err := p.r.Read(b)
	p.n += int64(n)
	if p.n-p.last >= 512<<10 {
		p.last = p.n
		p.report(Progress{Layer: p.layer, Complete: p.n, Total: p.total})
	}
	return n, err
}

func configOf(cf *v1.ConfigFile) Config {
	return Config{
		Env:        cf.Config.Env,
		Entrypoint: cf.Config.Entrypoint,
		Cmd:        cf.Config.Cmd,
		WorkingDir: cf.Config.WorkingDir,
		User:       cf.Config.User,
	}
}

// classifyRemote maps go-containerregistry and network errors to error
// classes, with a public message that does not echo registry responses.
func classifyRemote(ctx context.Context, ref string, err error) error {
	if err == nil {
		return nil
	}
	var pub *errdefs.Public
	if errors.As(err, &pub) {
		return err // already classified
	}
	if cerr := ctx.Err(); cerr != nil {
		if errors.Is(cerr, context.DeadlineExceeded) {
			return fmt.Errorf("pull %s: %v: %w", ref, err, errdefs.ErrDeadlineExceeded)
		}
		return fmt.Errorf("pull %s: %w", ref, cerr)
	}
	class, msg := errdefs.ErrInternal, fmt.Sprintf("pulling image %q failed", ref)
	var te *transport.Error
	var ne net.Error
	var ue *url.Error
	switch {
	case errors.As(err, &te):
		switch {
		case te.StatusCode == 401 || te.StatusCode == 403 || hasCode(te, transport.UnauthorizedErrorCode, transport.DeniedErrorCode):
			class, msg = errdefs.ErrPermissionDenied, fmt.Sprintf("access to image %q denied by the registry", ref)
		case te.StatusCode == 404 || hasCode(te, transport.ManifestUnknownErrorCode, transport.NameUnknownErrorCode, transport.BlobUnknownErrorCode):
			class, msg = errdefs.ErrNotFound, fmt.Sprintf("image %q not found in the registry", ref)
		case te.StatusCode == 429 || te.StatusCode >= 500:
			class, msg = errdefs.ErrUnavailable, fmt.Sprintf("registry for image %q is unavailable", ref)
		}
	case strings.Contains(err.Error(), "no child with platform"):
		class, msg = errdefs.ErrNotFound, fmt.Sprintf("image %q has no variant for this platform", ref)
	case errors.As(err, &ne), errors.As(err, &ue), errors.Is(err, io.ErrUnexpectedEOF):
		class, msg = errdefs.ErrUnavailable, fmt.Sprintf("registry for image %q is unreachable", ref)
	case errdefs.IsInvalidArgument(err), errdefs.IsNotFound(err), errdefs.IsConflict(err), errdefs.IsNotImplemented(err):
		return fmt.Errorf("pull %s: %w", ref, err)
	}
	return errdefs.WithPublic(fmt.Errorf("pull %s: %w: %w: %w", ref, err, ErrPull, class), "", msg)
}

func hasCode(te *transport.Error, codes ...transport.ErrorCode) bool {
	for _, d := range te.Errors {
		for _, c := range codes {
			if d.Code == c {
				return true
			}
		}
	}
	return false
}

package node

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	goruntime "runtime"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/partial"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// Content reads containerd's content store.
type Content interface {
	// Has reports whether blob digest is in the store.
	Has(ctx context.Context, digest string) bool
	// Open reads blob digest.
	Open(ctx context.Context, digest string) (io.ReadCloser, error)
}

// snapshotImage is l's image with l's diff as one more layer: the base
// image's manifest, config and layers are read from the node's content
// store (where the kubelet pulled them), the new layer too. created (the
// snapshot's) dates the layer's history, so that the same files give the
// same image.
func snapshotImage(ctx context.Context, c Content, l Layer, created time.Time) (v1.Image, error) {
	manifest, mt, err := platformManifest(ctx, c, l.Image)
	if err != nil {
		return nil, err
	}
	var m v1.Manifest
	if err := json.Unmarshal(manifest, &m); err != nil {
		return nil, fmt.Errorf("image manifest: %w", err)
	}
	config, err := readBlob(ctx, c, m.Config.Digest.String())
	if err != nil {
		return nil, fmt.Errorf("image config: %w", err)
	}
	base, err := partial.CompressedToImage(&storeImage{ctx: ctx, c: c, manifest: manifest, mt: mt, m: &m, config: config})
	if err != nil {
		return nil, err
	}
	h, err := v1.NewHash(l.Diff.Digest)
	if err != nil {
		return nil, fmt.Errorf("diff digest: %w", err)
	}
	layer := &tarLayer{storeBlob{ctx: ctx, c: c, d: v1.Descriptor{MediaType: types.OCIUncompressedLayer, Digest: h, Size: l.Diff.Size}}}
	return mutate.Append(base, mutate.Addendum{Layer: layer, MediaType: types.OCIUncompressedLayer,
		History: v1.History{Created: v1.Time{Time: created.UTC()}, CreatedBy: "moat snapshot", Comment: "the sandbox's writable layer"}})
}

// platformManifest reads the manifest of target: target itself, or the
// entry of an index for this node's platform that the store holds.
func platformManifest(ctx context.Context, c Content, target Blob) ([]byte, types.MediaType, error) {
	data, err := readBlob(ctx, c, target.Digest)
	if err != nil {
		return nil, "", fmt.Errorf("image: %w", err)
	}
	mt := types.MediaType(target.MediaType)
	if !mt.IsIndex() {
		return data, mt, nil
	}
	var idx v1.IndexManifest
	if err := json.Unmarshal(data, &idx); err != nil {
		return nil, "", fmt.Errorf("image index: %w", err)
	}
	for _, d := range idx.Manifests {
		if d.Platform != nil && (d.Platform.OS != "linux" || d.Platform.Architecture != goruntime.GOARCH) {
			continue
		}
		if d.MediaType.IsImage() && c.Has(ctx, d.Digest.String()) {
			m, err := readBlob(ctx, c, d.Digest.String())
			return m, d.MediaType, err
		}
	}
	return nil, "", fmt.Errorf("image index %s has no linux/%s manifest on this node", target.Digest, goruntime.GOARCH)
}

func readBlob(ctx context.Context, c Content, digest string) ([]byte, error) {
	r, err := c.Open(ctx, digest)
	if err != nil {
		return nil, err
	}
	defer r.Close()
	return io.ReadAll(io.LimitReader(r, 16<<20))
}

// storeImage is an image in the content store (partial.CompressedImageCore).
type storeImage struct {
	ctx      context.Context
	c        Content
	manifest []byte
	mt       types.MediaType
	m        *v1.Manifest
	config   []byte
}

func (i *storeImage) RawConfigFile() ([]byte, error)      { return i.config, nil }
func (i *storeImage) MediaType() (types.MediaType, error) { return i.mt, nil }
func (i *storeImage) RawManifest() ([]byte, error)        { return i.manifest, nil }

func (i *storeImage) LayerByDigest(h v1.Hash) (partial.CompressedLayer, error) {
	if h == i.m.Config.Digest {
		return storeBlob{ctx: i.ctx, c: i.c, d: i.m.Config}, nil
	}
	for _, l := range i.m.Layers {
		if l.Digest == h {
			return storeBlob{ctx: i.ctx, c: i.c, d: l}, nil
		}
	}
	return nil, fmt.Errorf("image has no blob %s", h)
}

// storeBlob is a blob of the content store (partial.CompressedLayer).
type storeBlob struct {
	ctx context.Context
	c   Content
	d   v1.Descriptor
}

func (b storeBlob) Digest() (v1.Hash, error)            { return b.d.Digest, nil }
func (b storeBlob) Size() (int64, error)                { return b.d.Size, nil }
func (b storeBlob) MediaType() (types.MediaType, error) { return b.d.MediaType, nil }
func (b storeBlob) Compressed() (io.ReadCloser, error) {
	r, err := b.c.Open(b.ctx, b.d.Digest.String())
	if err != nil {
		// The kubelet's pull may have kept only the unpacked layer.
		return nil, fmt.Errorf("layer %s is not in the node's content store (neither in the snapshot registry): %w", b.d.Digest, err)
	}
	return r, nil
}

// tarLayer is an uncompressed layer: its digest is its diffID.
type tarLayer struct{ storeBlob }

func (l *tarLayer) DiffID() (v1.Hash, error)             { return l.d.Digest, nil }
func (l *tarLayer) Uncompressed() (io.ReadCloser, error) { return l.Compressed() }

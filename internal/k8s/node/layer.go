package node

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"time"

	containersapi "github.com/containerd/containerd/api/services/containers/v1"
	contentapi "github.com/containerd/containerd/api/services/content/v1"
	diffapi "github.com/containerd/containerd/api/services/diff/v1"
	imagesapi "github.com/containerd/containerd/api/services/images/v1"
	leasesapi "github.com/containerd/containerd/api/services/leases/v1"
	snapshotsapi "github.com/containerd/containerd/api/services/snapshots/v1"
	"google.golang.org/grpc/metadata"
)

// leaseHeader is the gRPC metadata key naming a containerd lease: the
// content and snapshots made under it are kept until it is deleted.
const leaseHeader = "containerd-lease"

// mediaTypeTar is the uncompressed OCI layer the diff is asked for: its
// digest is its diffID, and the node spends no CPU on compression.
const mediaTypeTar = "application/vnd.oci.image.layer.v1.tar"

// Blob is a descriptor of content in containerd's content store.
type Blob struct {
	MediaType string
	Digest    string
	Size      int64
}

// Layer is a container's writable layer as containerd computed it, with
// the image it sits on; Release frees it.
type Layer struct {
	// Diff is the layer: an uncompressed tar, its digest its diffID.
	Diff Blob
	// Image is the target of the container's image (a manifest or an
	// index) in the content store.
	Image Blob
	// Release deletes the lease holding the diff (and the view of the
	// image's snapshot made for it).
	Release func()
}

// Diff computes container id's writable layer against its image with
// containerd's snapshot and diff services, as `nerdctl commit` does: a
// view of the image's snapshot is the left side, the container's active
// snapshot the right. containerd mounts both read-only itself, so the
// node component needs no access to the snapshotter's directories. The
// caller freezes the container meanwhile.
func (c *Containerd) Diff(ctx context.Context, id string) (Layer, error) {
	ctr, err := containersapi.NewContainersClient(c.conn).Get(c.ctx(ctx), &containersapi.GetContainerRequest{ID: id})
	if err != nil {
		return Layer{}, grpcError("container "+id, err)
	}
	cn := ctr.GetContainer()
	if cn.GetSnapshotKey() == "" || cn.GetImage() == "" {
		return Layer{}, fmt.Errorf("container %s has no snapshot or image", id)
	}
	img, err := imagesapi.NewImagesClient(c.conn).Get(c.ctx(ctx), &imagesapi.GetImageRequest{Name: cn.GetImage()})
	if err != nil {
		return Layer{}, grpcError("image "+cn.GetImage(), err)
	}
	snaps := snapshotsapi.NewSnapshotsClient(c.conn)
	st, err := snaps.Stat(c.ctx(ctx), &snapshotsapi.StatSnapshotRequest{Snapshotter: cn.GetSnapshotter(), Key: cn.GetSnapshotKey()})
	if err != nil {
		return Layer{}, grpcError("snapshot of container "+id, err)
	}
	tag := randomTag()
	leases := leasesapi.NewLeasesClient(c.conn)
	// The lease expires by itself should the node component die before
	// it releases it.
	if _, err := leases.Create(c.ctx(ctx), &leasesapi.CreateRequest{ID: "moat-snapshot-" + tag,
		Labels: map[string]string{"containerd.io/gc.expire": time.Now().Add(time.Hour).UTC().Format(time.RFC3339)}}); err != nil {
		return Layer{}, grpcError("lease", err)
	}
	lctx := metadata.AppendToOutgoingContext(c.ctx(ctx), leaseHeader, "moat-snapshot-"+tag)
	release := func() {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		snaps.Remove(lctx, &snapshotsapi.RemoveSnapshotRequest{Snapshotter: cn.GetSnapshotter(), Key: "moat-snapshot-view-" + tag})
		leases.Delete(c.ctx(rctx), &leasesapi.DeleteRequest{ID: "moat-snapshot-" + tag})
	}
	ok := false
	defer func() {
		if !ok {
			release()
		}
	}()
	upper, err := snaps.Mounts(c.ctx(ctx), &snapshotsapi.MountsRequest{Snapshotter: cn.GetSnapshotter(), Key: cn.GetSnapshotKey()})
	if err != nil {
		return Layer{}, grpcError("mounts of container "+id, err)
	}
	lower, err := snaps.View(lctx, &snapshotsapi.ViewSnapshotRequest{Snapshotter: cn.GetSnapshotter(), Key: "moat-snapshot-view-" + tag, Parent: st.GetInfo().GetParent()})
	if err != nil {
		return Layer{}, grpcError("view of image of container "+id, err)
	}
	d, err := diffapi.NewDiffClient(c.conn).Diff(lctx, &diffapi.DiffRequest{Left: lower.GetMounts(), Right: upper.GetMounts(),
		MediaType: mediaTypeTar, Ref: "moat-snapshot-" + tag})
	if err != nil {
		return Layer{}, grpcError("diff of container "+id, err)
	}
	ok = true
	t := img.GetImage().GetTarget()
	return Layer{Diff: Blob{MediaType: mediaTypeTar, Digest: d.GetDiff().GetDigest(), Size: d.GetDiff().GetSize()},
		Image: Blob{MediaType: t.GetMediaType(), Digest: t.GetDigest(), Size: t.GetSize()}, Release: release}, nil
}

// Has reports whether the content store holds blob digest.
func (c *Containerd) Has(ctx context.Context, digest string) bool {
	_, err := contentapi.NewContentClient(c.conn).Info(c.ctx(ctx), &contentapi.InfoRequest{Digest: digest})
	return err == nil
}

// Open reads blob digest from containerd's content store.
func (c *Containerd) Open(ctx context.Context, digest string) (io.ReadCloser, error) {
	ctx, cancel := context.WithCancel(c.ctx(ctx))
	s, err := contentapi.NewContentClient(c.conn).Read(ctx, &contentapi.ReadContentRequest{Digest: digest})
	if err != nil {
		cancel()
		return nil, grpcError("content "+digest, err)
	}
	return &contentReader{s: s, cancel: cancel, what: digest}, nil
}

// contentReader is a content Read stream as an io.ReadCloser.
type contentReader struct {
	s      contentapi.Content_ReadClient
	cancel context.CancelFunc
	buf    []byte
	what   string
}

func (r *contentReader) Read(p []byte) (int, error) {
	for len(r.buf) == 0 {
		m, err := r.s.Recv()
		if errors.Is(err, io.EOF) {
			return 0, io.EOF
		}
		if err != nil {
			return 0, grpcError("content "+r.what, err)
		}
		r.buf = m.GetData()
	}
	n := copy(p, r.buf)
	r.buf = r.buf[n:]
	return n, nil
}

func (r *contentReader) Close() error { r.cancel(); return nil }

func randomTag() string {
	var b [8]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

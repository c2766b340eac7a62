// Package snapreg is what `moat controller` and `moat node` share about
// SandboxSnapshots: the snapshot registry (push, delete), the names of the
// snapshot images in it, and the node's answer on a snapshot (the
// Committed condition).
//
// The protocol: the controller moves a SandboxSnapshot to phase
// Committing with status.sourcePodName, status.sourceNodeName and
// status.containers[].imageUri (ImageRef) filled in; `moat node` on that
// node commits each container's writable layer, pushes it with the
// container's image to its imageUri, and answers with the condition
// Committed (True, with each imageDigest; or False with the error). The
// controller then ends the snapshot Succeed or Failed.
package snapreg

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/remote/transport"

	sbv1 "github.com/moat-sandbox/moat/api/v1alpha1"
	"github.com/moat-sandbox/moat/internal/errdefs"
)

// The node's answer on a SandboxSnapshot.
const (
	// ConditionCommitted is written by moat node: True once every
	// container's image is pushed, False with the error.
	ConditionCommitted = "Committed"
	// ReasonPushed: Committed=True.
	ReasonPushed = "Pushed"
	// ReasonCommitFailed: Committed=False.
	ReasonCommitFailed = "CommitFailed"
)

// Finalizer keeps a SandboxSnapshot until the controller has deleted its
// images from the registry.
const Finalizer = sbv1.Group + "/snapshot-image"

// Registry is where snapshot images go (--snapshot-registry).
type Registry struct {
	// Host is the registry's host[:port], optionally with a path prefix:
	// images are pushed and deleted only below it.
	Host string
	// Insecure allows plain HTTP (loopback registries are always spoken
	// to in plain HTTP).
	Insecure bool
}

// ImageRef is the image of container of SandboxSnapshot ns/snapshot:
// one repository per snapshot, one tag per container.
func (r Registry) ImageRef(ns, snapshot, container string) string {
	return r.Host + "/" + ns + "/" + snapshot + ":" + container
}

// Pinned is image (a repository and tag, ImageRef) pinned to digest: the
// repository and the digest.
func Pinned(image, digest string) string {
	repo := image
	if i := strings.LastIndex(image, ":"); i > strings.LastIndex(image, "/") {
		repo = image[:i]
	}
	return repo + "@" + digest
}

// Ref parses ref, which must be below the registry.
func (r Registry) Ref(ref string) (name.Reference, error) {
	if r.Host == "" {
		return nil, fmt.Errorf("%w: no snapshot registry is configured (--snapshot-registry)", errdefs.ErrFailedPrecondition)
	}
	if !strings.HasPrefix(ref, r.Host+"/") {
		return nil, fmt.Errorf("%w: image %q is not in the snapshot registry %s", errdefs.ErrPermissionDenied, ref, r.Host)
	}
	var opts []name.Option
	if r.Insecure {
		opts = append(opts, name.Insecure)
	}
	return name.ParseReference(ref, opts...)
}

// Push writes img to ref and returns its digest.
func (r Registry) Push(ctx context.Context, ref string, img v1.Image) (string, error) {
	nr, err := r.Ref(ref)
	if err != nil {
		return "", err
	}
	if err := remote.Write(nr, img, remote.WithContext(ctx)); err != nil {
		return "", fmt.Errorf("push %s: %w: %v", ref, errdefs.ErrUnavailable, err)
	}
	d, err := img.Digest()
	if err != nil {
		return "", err
	}
	return d.String(), nil
}

// Exists reports whether ref (a tag or digest) is in the registry.
func (r Registry) Exists(ctx context.Context, ref string) (bool, error) {
	nr, err := r.Ref(ref)
	if err != nil {
		return false, err
	}
	_, err = remote.Head(nr, remote.WithContext(ctx))
	if notFound(err) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("%s: %w: %v", ref, errdefs.ErrUnavailable, err)
	}
	return true, nil
}

// Delete removes the manifest ref (a tag or a digest) points to, then
// the tag where the registry lets a tag be deleted; a ref already gone is
// not an error.
func (r Registry) Delete(ctx context.Context, ref string) error {
	nr, err := r.Ref(ref)
	if err != nil {
		return err
	}
	d, err := remote.Head(nr, remote.WithContext(ctx))
	if notFound(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("delete %s: %w: %v", ref, errdefs.ErrUnavailable, err)
	}
	if err := remote.Delete(nr.Context().Digest(d.Digest.String()), remote.WithContext(ctx)); err != nil && !notFound(err) {
		return fmt.Errorf("delete %s: %w: %v", ref, errdefs.ErrUnavailable, err)
	}
	// Registries that drop the tags with their manifest answer 404 here,
	// others refuse tag deletes: either is fine.
	remote.Delete(nr, remote.WithContext(ctx))
	return nil
}

func notFound(err error) bool {
	var te *transport.Error
	return errors.As(err, &te) && te.StatusCode == http.StatusNotFound
}

package kubernetes

import (
	"context"
	"fmt"
	"strings"
	"time"

	nodev1 "k8s.io/api/node/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	sbv1 "github.com/moat-sandbox/moat/api/v1alpha1"
	"github.com/moat-sandbox/moat/internal/errdefs"
	"github.com/moat-sandbox/moat/internal/k8s/snapreg"
	"github.com/moat-sandbox/moat/internal/runtime"
)

var _ runtime.ImageSnapshotter = (*Runtime)(nil)

// SnapshotImage implements runtime.ImageSnapshotter: a SandboxSnapshot
// of the sandbox's BatchSandbox, named name, in its namespace; the
// controller hands it to moat node on the pod's node, which commits the
// container's writable layer and pushes it with the container's image to
// the controller's --snapshot-registry. It returns that image, pinned by
// digest. A snapshot that fails (or is not answered within
// SnapshotTimeout) is deleted again, and with it whatever was pushed.
func (r *Runtime) SnapshotImage(ctx context.Context, id, name string) (string, error) {
	if _, _, _, ok, err := r.claimed(ctx, id, true); err != nil {
		return "", err
	} else if ok {
		return "", errdefs.Newf(errdefs.ErrNotImplemented, "a sandbox claimed from a pool cannot be snapshotted on the kubernetes runtime")
	}
	b, err := r.get(ctx, id)
	if err != nil {
		return "", err
	}
	if class := b.Annotations[annoClass]; class != "" {
		// gVisor keeps the sandbox's writes inside its own filesystem:
		// containerd's snapshot holds none of them.
		// (The server's role may list RuntimeClasses, not get them.)
		var list nodev1.RuntimeClassList
		if err := r.c.List(ctx, &list); err == nil {
			for _, rc := range list.Items {
				if rc.Name == class && strings.Contains(rc.Handler, "runsc") {
					return "", errdefs.Newf(errdefs.ErrNotImplemented, "sandboxes of runtime class %s (gVisor) cannot be snapshotted on the kubernetes runtime", class)
				}
			}
		}
	}
	s := &sbv1.SandboxSnapshot{
		ObjectMeta: metav1.ObjectMeta{Namespace: b.Namespace, Name: name, Labels: map[string]string{labelScope: r.cfg.Scope}},
		Spec:       sbv1.SandboxSnapshotSpec{SandboxName: id},
	}
	if err := r.c.Create(ctx, s); err != nil {
		return "", classify("create snapshot "+name, err)
	}
	img, err := r.waitSnapshot(ctx, client.ObjectKeyFromObject(s))
	if err != nil {
		if derr := r.deleteSnapshot(context.WithoutCancel(ctx), s); derr != nil {
			return "", fmt.Errorf("%w (and deleting the snapshot failed: %v)", err, derr)
		}
		return "", err
	}
	return img, nil
}

// waitSnapshot waits until the controller ends snapshot key and returns
// the sandbox container's image.
func (r *Runtime) waitSnapshot(ctx context.Context, key types.NamespacedName) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, r.cfg.SnapshotTimeout)
	defer cancel()
	for {
		var s sbv1.SandboxSnapshot
		err := r.c.Get(ctx, key, &s)
		switch {
		case err == nil && s.Status.Phase == sbv1.SnapshotSucceed:
			for _, c := range s.Status.Containers {
				if c.ContainerName == containerName && c.ImageDigest != "" {
					return snapreg.Pinned(c.ImageURI, c.ImageDigest), nil
				}
			}
			return "", fmt.Errorf("snapshot %s: %w: no image of container %s", key.Name, errdefs.ErrUnavailable, containerName)
		case err == nil && s.Status.Phase == sbv1.SnapshotFailed:
			class := errdefs.ErrUnavailable
			if c := meta.FindStatusCondition(s.Status.Conditions, "Failed"); c != nil && c.Reason == sbv1.ReasonUnsupported {
				class = errdefs.ErrNotImplemented
			}
			return "", errdefs.Newf(class, "%s", s.Status.Message)
		case err != nil && !apierrors.IsNotFound(err) && ctx.Err() == nil:
			return "", classify("snapshot "+key.Name, err)
		}
		select {
		case <-ctx.Done():
			return "", errdefs.Newf(errdefs.ErrUnavailable, "the snapshot was not committed within %v: are moat controller and moat node running?", r.cfg.SnapshotTimeout)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// RemoveSnapshotImage implements runtime.ImageSnapshotter: the
// SandboxSnapshot is deleted, and the controller deletes its image
// (its finalizer) before it goes; this waits for that (up to
// DeleteTimeout).
func (r *Runtime) RemoveSnapshotImage(ctx context.Context, name string) error {
	var list sbv1.SandboxSnapshotList
	err := r.c.List(ctx, &list, client.InNamespace(r.listNamespace()), client.MatchingLabels{labelScope: r.cfg.Scope},
		client.MatchingFieldsSelector{Selector: fields.OneTermEqualSelector("metadata.name", name)})
	if err != nil {
		return classify("find snapshot "+name, err)
	}
	for i := range list.Items {
		if err := r.deleteSnapshot(ctx, &list.Items[i]); err != nil {
			return err
		}
	}
	return nil
}

// deleteSnapshot deletes s and waits until it is gone.
func (r *Runtime) deleteSnapshot(ctx context.Context, s *sbv1.SandboxSnapshot) error {
	if err := r.c.Delete(ctx, s, client.Preconditions{UID: &s.UID}); err != nil && !apierrors.IsNotFound(err) {
		return classify("delete snapshot "+s.Name, err)
	}
	if !r.waitGone(ctx, client.ObjectKeyFromObject(s), s.UID, &sbv1.SandboxSnapshot{}) {
		return fmt.Errorf("delete snapshot %s: %w: the controller has not deleted its image in %v", s.Name, errdefs.ErrUnavailable, r.cfg.DeleteTimeout)
	}
	return nil
}

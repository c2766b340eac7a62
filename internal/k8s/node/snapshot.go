package node

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	sbv1 "github.com/moat-sandbox/moat/api/v1alpha1"
	"github.com/moat-sandbox/moat/internal/k8s/snapreg"
)

// Layers is the node's container runtime as a snapshot sees it.
type Layers interface {
	Content
	// Diff computes container id's writable layer against its image.
	Diff(ctx context.Context, id string) (Layer, error)
}

// SnapshotReconciler commits the containers of the SandboxSnapshots the
// controller hands to this node (phase Committing, sourceNodeName this
// node; package snapreg) and answers with the Committed condition.
type SnapshotReconciler struct {
	C        client.Client
	Node     string
	Tasks    Tasks
	Layers   Layers
	Registry snapreg.Registry
	Log      *slog.Logger

	// done holds the snapshots (UID and generation) this process has
	// answered: a cache that has not caught up with the answer yet never
	// makes it commit and push the same snapshot twice.
	mu   sync.Mutex
	done map[string]bool
}

// commitTimeout bounds one snapshot's commit and push.
const commitTimeout = 10 * time.Minute

// Reconcile implements reconcile.Reconciler.
func (r *SnapshotReconciler) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	var s sbv1.SandboxSnapshot
	if err := r.C.Get(ctx, req.NamespacedName, &s); err != nil {
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	key := fmt.Sprintf("%s/%d", s.UID, s.Generation)
	r.mu.Lock()
	answered := r.done[key]
	r.mu.Unlock()
	if answered || !r.mine(&s) {
		return reconcile.Result{}, nil
	}
	ctx, cancel := context.WithTimeout(ctx, commitTimeout)
	defer cancel()
	start := time.Now()
	digests, err := r.commit(ctx, &s)
	cond := metav1.Condition{Type: snapreg.ConditionCommitted, Status: metav1.ConditionTrue, Reason: snapreg.ReasonPushed,
		Message: fmt.Sprintf("committed and pushed by moat node on %s in %v", r.Node, time.Since(start).Round(time.Millisecond)), ObservedGeneration: s.Generation}
	if err != nil {
		cond.Status, cond.Reason, cond.Message = metav1.ConditionFalse, snapreg.ReasonCommitFailed, err.Error()
	}
	r.Log.Info("snapshot", "snapshot", req.NamespacedName, "pod", s.Status.SourcePodName, "took", time.Since(start), "err", err)
	werr := r.answer(ctx, req.NamespacedName, s.UID, digests, cond)
	if werr == nil || errors.Is(werr, errGone) {
		r.mu.Lock()
		if r.done == nil {
			r.done = map[string]bool{}
		}
		r.done[key] = true
		r.mu.Unlock()
	}
	if werr != nil {
		// Not ours to answer any more (failed by the controller, or
		// deleted): what was pushed must not stay.
		r.Log.Warn("snapshot answer", "snapshot", req.NamespacedName, "err", werr)
		r.deletePushed(context.WithoutCancel(ctx), &s, digests)
		if errors.Is(werr, errGone) {
			return reconcile.Result{}, nil
		}
		return reconcile.Result{}, werr
	}
	return reconcile.Result{}, nil
}

// mine reports whether s waits for this node's commit.
func (r *SnapshotReconciler) mine(s *sbv1.SandboxSnapshot) bool {
	if s.DeletionTimestamp != nil || s.Status.Phase != sbv1.SnapshotCommitting || s.Status.SourceNodeName != r.Node {
		return false
	}
	c := meta.FindStatusCondition(s.Status.Conditions, snapreg.ConditionCommitted)
	return c == nil || c.ObservedGeneration != s.Generation
}

// commit commits every container of s's status and returns their digests
// by container name.
func (r *SnapshotReconciler) commit(ctx context.Context, s *sbv1.SandboxSnapshot) (map[string]string, error) {
	var pod corev1.Pod
	if err := r.C.Get(ctx, types.NamespacedName{Namespace: s.Namespace, Name: s.Status.SourcePodName}, &pod); err != nil {
		return nil, fmt.Errorf("pod %s: %v", s.Status.SourcePodName, err)
	}
	if pod.Spec.NodeName != r.Node || pod.DeletionTimestamp != nil {
		return nil, fmt.Errorf("pod %s is not running on node %s", pod.Name, r.Node)
	}
	if len(s.Status.Containers) == 0 {
		return nil, errors.New("the snapshot names no container")
	}
	digests := map[string]string{}
	for _, c := range s.Status.Containers {
		if _, err := r.Registry.Ref(c.ImageURI); err != nil {
			return digests, err
		}
		id, err := containerID(&pod, c.ContainerName)
		if err != nil {
			return digests, err
		}
		d, err := r.commitContainer(ctx, id, c.ImageURI, s.CreationTimestamp.Time)
		if err != nil {
			return digests, fmt.Errorf("container %s: %w", c.ContainerName, err)
		}
		digests[c.ContainerName] = d
	}
	return digests, nil
}

// commitContainer freezes container id (unless it is frozen already: a
// paused sandbox stays paused), diffs its writable layer, thaws it, and
// pushes its image with the diff on top to ref.
func (r *SnapshotReconciler) commitContainer(ctx context.Context, id, ref string, created time.Time) (string, error) {
	frozen, err := r.Tasks.Frozen(ctx, id)
	if err != nil {
		return "", err
	}
	if !frozen {
		if err := r.Tasks.Pause(ctx, id); err != nil {
			return "", fmt.Errorf("freeze: %w", err)
		}
	}
	l, err := r.Layers.Diff(ctx, id)
	if !frozen {
		// Thawed before the push: the sandbox waits only for the diff.
		if terr := r.Tasks.Resume(context.WithoutCancel(ctx), id); terr != nil {
			r.Log.Error("thaw after snapshot", "container", id, "err", terr)
			if err == nil {
				l.Release()
			}
			return "", fmt.Errorf("thaw: %w", terr)
		}
	}
	if err != nil {
		return "", fmt.Errorf("diff: %w", err)
	}
	defer l.Release()
	img, err := snapshotImage(ctx, r.Layers, l, created)
	if err != nil {
		return "", err
	}
	return r.Registry.Push(ctx, ref, img)
}

// errGone: the snapshot is no longer waiting for this node.
var errGone = errors.New("the snapshot is no longer committing on this node")

// answer writes cond and the digests into snapshot key's status, read
// afresh: only while it is the same snapshot, still Committing here.
func (r *SnapshotReconciler) answer(ctx context.Context, key types.NamespacedName, uid types.UID, digests map[string]string, cond metav1.Condition) error {
	for range 5 {
		var s sbv1.SandboxSnapshot
		if err := r.C.Get(ctx, key, &s); err != nil {
			if apierrors.IsNotFound(err) {
				return errGone
			}
			return err
		}
		if s.UID != uid || !r.mine(&s) {
			return errGone
		}
		for i := range s.Status.Containers {
			s.Status.Containers[i].ImageDigest = digests[s.Status.Containers[i].ContainerName]
		}
		meta.SetStatusCondition(&s.Status.Conditions, cond)
		err := r.C.Status().Update(ctx, &s)
		if err == nil || !apierrors.IsConflict(err) {
			return err
		}
	}
	return errors.New("the snapshot kept changing")
}

// deletePushed removes the images a commit pushed for s.
func (r *SnapshotReconciler) deletePushed(ctx context.Context, s *sbv1.SandboxSnapshot, digests map[string]string) {
	for _, c := range s.Status.Containers {
		if digests[c.ContainerName] == "" {
			continue
		}
		if err := r.Registry.Delete(ctx, c.ImageURI); err != nil {
			r.Log.Error("delete image of an abandoned snapshot", "image", c.ImageURI, "err", err)
		}
	}
}

package controller

import (
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	sbv1 "github.com/moat-sandbox/moat/api/v1alpha1"
	"github.com/moat-sandbox/moat/internal/k8s/snapreg"
)

// Reasons of a SandboxSnapshot's conditions.
const (
	snapReasonCommitting   = "Committing"
	snapReasonSucceed      = "Succeed"
	snapReasonInvalid      = "InvalidSpec"
	snapReasonNotFound     = "SandboxNotFound"
	snapReasonNotRunning   = "SandboxNotRunning"
	snapReasonPodGone      = "PodGone"
	snapReasonNodeTimeout  = "NodeTimeout"
	snapReasonCommitFailed = "CommitFailed"
)

// defaultCommitTimeout bounds how long a snapshot waits for its node.
const defaultCommitTimeout = 5 * time.Minute

// snapshotReconciler drives SandboxSnapshots: it finds the sandbox's pod
// and node, hands the commit to moat node there (phase Committing; the
// protocol is package snapreg's) and ends the snapshot Succeed or Failed
// from the node's answer. A Failed snapshot leaves no image; the
// finalizer deletes a snapshot's images with it. Without a registry
// (--snapshot-registry) every snapshot is Failed with reason Unsupported.
type snapshotReconciler struct {
	c        client.Client
	registry snapreg.Registry
	timeout  time.Duration
	events   events.EventRecorder
	now      func() time.Time
}

func (r *snapshotReconciler) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	var s sbv1.SandboxSnapshot
	if err := r.c.Get(ctx, req.NamespacedName, &s); err != nil {
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	if s.DeletionTimestamp != nil {
		return reconcile.Result{}, r.finalize(ctx, &s)
	}
	if r.registry.Host == "" {
		if s.Status.Phase == sbv1.SnapshotFailed && s.Status.ObservedGeneration == s.Generation {
			return reconcile.Result{}, nil
		}
		return reconcile.Result{}, r.fail(ctx, &s, sbv1.ReasonUnsupported, "moat controller has no snapshot registry (--snapshot-registry)")
	}
	if !controllerutil.ContainsFinalizer(&s, snapreg.Finalizer) {
		controllerutil.AddFinalizer(&s, snapreg.Finalizer)
		return reconcile.Result{}, client.IgnoreNotFound(r.c.Update(ctx, &s))
	}
	switch s.Status.Phase {
	case "", sbv1.SnapshotPending:
		return r.start(ctx, &s)
	case sbv1.SnapshotCommitting:
		return r.check(ctx, &s)
	}
	return reconcile.Result{}, nil
}

// start hands s to the node of its sandbox's pod.
func (r *snapshotReconciler) start(ctx context.Context, s *sbv1.SandboxSnapshot) (reconcile.Result, error) {
	name := s.Spec.SandboxName
	if name == "" {
		name = s.Spec.SourceBatchSandboxName
	}
	if name == "" {
		return reconcile.Result{}, r.fail(ctx, s, snapReasonInvalid, "spec.sandboxName is required")
	}
	var b sbv1.BatchSandbox
	if err := r.c.Get(ctx, types.NamespacedName{Namespace: s.Namespace, Name: name}, &b); err != nil {
		if apierrors.IsNotFound(err) {
			return reconcile.Result{}, r.fail(ctx, s, snapReasonNotFound, fmt.Sprintf("sandbox %s not found", name))
		}
		return reconcile.Result{}, err
	}
	pods := b.AllocatedPods()
	if b.GetReplicas() != 1 || len(pods) != 1 || pods[0] == "" {
		return reconcile.Result{}, r.fail(ctx, s, snapReasonNotRunning, fmt.Sprintf("sandbox %s has no single pod (only sandboxes of one replica can be snapshotted)", name))
	}
	var pod corev1.Pod
	if err := r.c.Get(ctx, types.NamespacedName{Namespace: s.Namespace, Name: pods[0]}, &pod); err != nil {
		if apierrors.IsNotFound(err) {
			return reconcile.Result{}, r.fail(ctx, s, snapReasonNotRunning, fmt.Sprintf("pod %s of sandbox %s not found", pods[0], name))
		}
		return reconcile.Result{}, err
	}
	if pod.Status.Phase != corev1.PodRunning || pod.Spec.NodeName == "" || pod.DeletionTimestamp != nil {
		return reconcile.Result{}, r.fail(ctx, s, snapReasonNotRunning, fmt.Sprintf("pod %s of sandbox %s is not running", pod.Name, name))
	}
	s.Status.Phase, s.Status.ObservedGeneration = sbv1.SnapshotCommitting, s.Generation
	s.Status.SourcePodName, s.Status.SourceNodeName = pod.Name, pod.Spec.NodeName
	s.Status.Containers = nil
	for _, c := range pod.Spec.Containers {
		s.Status.Containers = append(s.Status.Containers, sbv1.ContainerSnapshot{ContainerName: c.Name,
			ImageURI: r.registry.ImageRef(s.Namespace, s.Name, c.Name)})
	}
	s.Status.Message = "committing on node " + pod.Spec.NodeName
	meta.RemoveStatusCondition(&s.Status.Conditions, snapreg.ConditionCommitted)
	meta.SetStatusCondition(&s.Status.Conditions, metav1.Condition{Type: "Ready", Status: metav1.ConditionFalse,
		Reason: snapReasonCommitting, Message: s.Status.Message, ObservedGeneration: s.Generation})
	if err := r.c.Status().Update(ctx, s); err != nil {
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	r.events.Eventf(s, nil, corev1.EventTypeNormal, snapReasonCommitting, "Snapshot", "pod %s on node %s", pod.Name, pod.Spec.NodeName)
	return reconcile.Result{RequeueAfter: podRecheck}, nil
}

// podRecheck is how often a Committing snapshot's pod is looked at.
const podRecheck = 2 * time.Second

// check ends a Committing snapshot from its node's answer, or fails it
// when its pod went away or its node did not answer in time.
func (r *snapshotReconciler) check(ctx context.Context, s *sbv1.SandboxSnapshot) (reconcile.Result, error) {
	if c := meta.FindStatusCondition(s.Status.Conditions, snapreg.ConditionCommitted); c != nil && c.ObservedGeneration == s.Generation {
		if c.Status != metav1.ConditionTrue {
			return reconcile.Result{}, r.fail(ctx, s, snapReasonCommitFailed, c.Message)
		}
		s.Status.Phase, s.Status.Message = sbv1.SnapshotSucceed, c.Message
		meta.SetStatusCondition(&s.Status.Conditions, metav1.Condition{Type: "Ready", Status: metav1.ConditionTrue,
			Reason: snapReasonSucceed, Message: c.Message, ObservedGeneration: s.Generation})
		if err := r.c.Status().Update(ctx, s); err != nil {
			return reconcile.Result{}, client.IgnoreNotFound(err)
		}
		r.events.Eventf(s, nil, corev1.EventTypeNormal, snapReasonSucceed, "Snapshot", "%s", c.Message)
		return reconcile.Result{}, nil
	}
	var pod corev1.Pod
	err := r.c.Get(ctx, types.NamespacedName{Namespace: s.Namespace, Name: s.Status.SourcePodName}, &pod)
	if apierrors.IsNotFound(err) || (err == nil && pod.DeletionTimestamp != nil) {
		return reconcile.Result{}, r.fail(ctx, s, snapReasonPodGone, fmt.Sprintf("pod %s went away during the commit", s.Status.SourcePodName))
	}
	var since time.Time
	if c := meta.FindStatusCondition(s.Status.Conditions, "Ready"); c != nil {
		since = c.LastTransitionTime.Time
	}
	if left := r.timeout - r.now().Sub(since); left <= 0 {
		return reconcile.Result{}, r.fail(ctx, s, snapReasonNodeTimeout, fmt.Sprintf(
			"no moat node committed the snapshot within %v: is moat node (with --snapshot-registry) running on node %s?", r.timeout, s.Status.SourceNodeName))
	} else if left < podRecheck {
		return reconcile.Result{RequeueAfter: left}, nil
	}
	return reconcile.Result{RequeueAfter: podRecheck}, nil
}

// fail ends s Failed with reason and msg. Whatever its node pushed is
// deleted: a node that answers later finds it Failed and deletes what it
// pushed itself.
func (r *snapshotReconciler) fail(ctx context.Context, s *sbv1.SandboxSnapshot, reason, msg string) error {
	r.deleteImages(ctx, s)
	s.Status.Phase, s.Status.Message, s.Status.ObservedGeneration = sbv1.SnapshotFailed, msg, s.Generation
	for i := range s.Status.Containers {
		s.Status.Containers[i].ImageDigest = ""
	}
	meta.SetStatusCondition(&s.Status.Conditions, metav1.Condition{Type: "Ready", Status: metav1.ConditionFalse,
		Reason: reason, Message: msg, ObservedGeneration: s.Generation})
	meta.SetStatusCondition(&s.Status.Conditions, metav1.Condition{Type: "Failed", Status: metav1.ConditionTrue,
		Reason: reason, Message: msg, ObservedGeneration: s.Generation})
	if err := r.c.Status().Update(ctx, s); err != nil {
		return client.IgnoreNotFound(err)
	}
	r.events.Eventf(s, nil, corev1.EventTypeWarning, reason, "Snapshot", "%s", msg)
	return nil
}

// deleteImages deletes s's images from the registry (best effort).
func (r *snapshotReconciler) deleteImages(ctx context.Context, s *sbv1.SandboxSnapshot) error {
	var first error
	for _, c := range s.Status.Containers {
		if _, err := r.registry.Ref(c.ImageURI); err != nil {
			continue // not an image of this registry: not ours to delete
		}
		// The image the status names, then whatever the tag names.
		if c.ImageDigest != "" {
			if err := r.registry.Delete(ctx, snapreg.Pinned(c.ImageURI, c.ImageDigest)); err != nil && first == nil {
				first = err
			}
		}
		if err := r.registry.Delete(ctx, c.ImageURI); err != nil && first == nil {
			first = err
		}
	}
	return first
}

// finalize deletes a deleted snapshot's images, then lets it go.
func (r *snapshotReconciler) finalize(ctx context.Context, s *sbv1.SandboxSnapshot) error {
	if !controllerutil.ContainsFinalizer(s, snapreg.Finalizer) {
		return nil
	}
	if err := r.deleteImages(ctx, s); err != nil {
		r.events.Eventf(s, nil, corev1.EventTypeWarning, "DeleteFailed", "Delete", "%v", err)
		return err
	}
	controllerutil.RemoveFinalizer(s, snapreg.Finalizer)
	return client.IgnoreNotFound(r.c.Update(ctx, s))
}

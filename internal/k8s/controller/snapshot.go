package controller

import (
	"context"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	sbv1 "github.com/moat-sandbox/moat/api/v1alpha1"
)

// snapshotReconciler answers SandboxSnapshots. Committing a pod's root
// filesystem needs the node's container runtime, which moat's controller
// does not reach: every request ends Failed with reason Unsupported (never
// silently Pending), so that clients stop waiting.
type snapshotReconciler struct {
	c client.Client
}

func (r *snapshotReconciler) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	var s sbv1.SandboxSnapshot
	if err := r.c.Get(ctx, req.NamespacedName, &s); err != nil {
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	if s.DeletionTimestamp != nil || (s.Status.Phase == sbv1.SnapshotFailed && s.Status.ObservedGeneration == s.Generation) {
		return reconcile.Result{}, nil
	}
	msg := "moat's Kubernetes controller cannot snapshot sandbox pods"
	if s.Spec.SandboxName == "" && s.Spec.SourceBatchSandboxName == "" {
		msg = "spec.sandboxName is required"
	}
	s.Status.Phase, s.Status.Message, s.Status.ObservedGeneration = sbv1.SnapshotFailed, msg, s.Generation
	meta.SetStatusCondition(&s.Status.Conditions, metav1.Condition{Type: "Failed", Status: metav1.ConditionTrue,
		Reason: sbv1.ReasonUnsupported, Message: msg, ObservedGeneration: s.Generation})
	if err := r.c.Status().Update(ctx, &s); err != nil && !apierrors.IsNotFound(err) {
		return reconcile.Result{}, err
	}
	return reconcile.Result{}, nil
}

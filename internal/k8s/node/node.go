// Package node is `moat node`, the node component of moat on Kubernetes
// (one pod per node, the chart's DaemonSet): it freezes and thaws the
// sandbox pods of its own node as their pause wish asks
// (internal/k8s/podfreeze) and answers with a pod condition, and commits
// their containers' writable layers for the SandboxSnapshots the
// controller hands to it (snapshot.go, internal/k8s/snapreg), pushing
// them to the snapshot registry.
//
// It watches only the moat-managed pods bound to its node (a field
// selector on spec.nodeName), acts through the node's containerd task
// API (the unix socket, mounted from the host) and writes nothing but the
// pods' status (pods/status patch) and the SandboxSnapshots' status
// (its answer), besides the images it pushes: it serves no port, so no sandbox can
// reach it. Its state is the pods' wishes and containerd's tasks, so a
// restarted node component converges again from them; a frozen pod stays
// frozen while it is down.
package node

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/config"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	sbv1 "github.com/moat-sandbox/moat/api/v1alpha1"
	"github.com/moat-sandbox/moat/internal/k8s/kclient"
	"github.com/moat-sandbox/moat/internal/k8s/podfreeze"
	"github.com/moat-sandbox/moat/internal/k8s/snapreg"
)

// Tasks freezes and thaws containers by their container runtime ID (the
// ID in a pod's containerStatuses, without the "containerd://" prefix).
type Tasks interface {
	// Frozen reports whether container id is frozen; an error for one
	// that is neither running nor frozen.
	Frozen(ctx context.Context, id string) (bool, error)
	// Pause freezes container id.
	Pause(ctx context.Context, id string) error
	// Resume thaws container id.
	Resume(ctx context.Context, id string) error
}

// Options configure Run.
type Options struct {
	// NodeName is the node whose pods are served (required).
	NodeName string
	// Tasks is the node's container runtime (required).
	Tasks Tasks
	// Log receives what the component does (default slog.Default()).
	Log *slog.Logger
	// Resync is how often every pod is looked at again, to catch a
	// container that was restarted or thawed behind its back (default 30s).
	Resync time.Duration
	// Layers, if set, commits sandbox containers' writable layers for the
	// SandboxSnapshots the controller hands to this node (snapshot.go),
	// pushed to Registry.
	Layers   Layers
	Registry snapreg.Registry
}

// Run serves the pods of opts.NodeName until ctx ends.
func Run(ctx context.Context, rc *rest.Config, opts Options) error {
	mgr, err := New(rc, opts)
	if err != nil {
		return err
	}
	return mgr.Start(ctx)
}

// New builds the component's manager (started by the caller).
func New(rc *rest.Config, opts Options) (manager.Manager, error) {
	if opts.NodeName == "" || opts.Tasks == nil {
		return nil, errors.New("node: a node name and a container runtime are required")
	}
	if opts.Log == nil {
		opts.Log = slog.Default()
	}
	if opts.Resync <= 0 {
		opts.Resync = 30 * time.Second
	}
	managed := labels.SelectorFromSet(labels.Set{sbv1.LabelManaged: sbv1.ManagedBy})
	skip := true
	mgr, err := ctrl.NewManager(rc, manager.Options{
		Scheme: kclient.Scheme(),
		Logger: logr.FromSlogHandler(opts.Log.Handler()),
		Cache: cache.Options{
			SyncPeriod: &opts.Resync,
			ByObject: map[client.Object]cache.ByObject{&corev1.Pod{}: {
				Label: managed, Field: fields.OneTermEqualSelector("spec.nodeName", opts.NodeName),
			}},
		},
		Metrics:    metricsserver.Options{BindAddress: "0"},
		Controller: config.Controller{SkipNameValidation: &skip},
	})
	if err != nil {
		return nil, fmt.Errorf("node: %w", err)
	}
	r := &Reconciler{C: mgr.GetClient(), Tasks: opts.Tasks, Log: opts.Log}
	if err := ctrl.NewControllerManagedBy(mgr).Named("moat-node").For(&corev1.Pod{}).Complete(r); err != nil {
		return nil, fmt.Errorf("node: %w", err)
	}
	if opts.Layers != nil {
		sr := &SnapshotReconciler{C: mgr.GetClient(), Node: opts.NodeName, Tasks: opts.Tasks, Layers: opts.Layers, Registry: opts.Registry, Log: opts.Log}
		err := ctrl.NewControllerManagedBy(mgr).Named("moat-node-snapshot").For(&sbv1.SandboxSnapshot{}).
			WithOptions(controller.Options{MaxConcurrentReconciles: 2}).Complete(sr)
		if err != nil {
			return nil, fmt.Errorf("node: %w", err)
		}
	}
	return mgr, nil
}

// Reconciler brings one pod to its wish and writes the answer.
type Reconciler struct {
	C     client.Client
	Tasks Tasks
	Log   *slog.Logger
}

// Reconcile implements reconcile.Reconciler.
func (r *Reconciler) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	var pod corev1.Pod
	if err := r.C.Get(ctx, req.NamespacedName, &pod); err != nil {
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	want, ok := podfreeze.WantOf(&pod)
	if !ok || pod.DeletionTimestamp != nil {
		return reconcile.Result{}, nil
	}
	frozen, err := r.apply(ctx, &pod, want)
	if err != nil {
		r.Log.Warn("freeze", "pod", req.NamespacedName, "want", want.String(), "err", err)
	} else if frozen != want.Paused {
		err = errors.New("the container runtime did not change the containers' state")
	}
	cond := podfreeze.Condition(want, frozen, err)
	if !sameCondition(&pod, cond) {
		if werr := r.answer(ctx, &pod, cond); werr != nil {
			if apierrors.IsConflict(werr) || apierrors.IsNotFound(werr) {
				// The pod changed meanwhile (maybe its wish): its
				// event brings the new copy.
				return reconcile.Result{}, nil
			}
			return reconcile.Result{}, werr
		}
		r.Log.Info("freeze", "pod", req.NamespacedName, "want", want.String(), "frozen", frozen, "err", err)
	}
	if err != nil {
		// Try again: a container that was starting, a runtime that was
		// restarting.
		return reconcile.Result{RequeueAfter: time.Second}, nil
	}
	return reconcile.Result{}, nil
}

// apply freezes or thaws pod's containers as want asks and tells whether
// they are frozen now (all of them; a mix answers the wish undone).
func (r *Reconciler) apply(ctx context.Context, pod *corev1.Pod, want podfreeze.Want) (bool, error) {
	ids, err := containerIDs(pod)
	if err != nil {
		return false, err
	}
	all := true
	for _, id := range ids {
		frozen, err := r.Tasks.Frozen(ctx, id)
		if err == nil && frozen != want.Paused {
			if want.Paused {
				err = r.Tasks.Pause(ctx, id)
			} else {
				err = r.Tasks.Resume(ctx, id)
			}
			if err == nil {
				frozen, err = r.Tasks.Frozen(ctx, id)
			}
		}
		if err != nil {
			return false, err
		}
		all = all && frozen
	}
	return all, nil
}

// containerIDs are the runtime IDs of pod's (regular) containers, which
// must all run: its init containers, the egress sidecar among them, keep
// running while the sandbox is frozen.
func containerIDs(pod *corev1.Pod) ([]string, error) {
	var ids []string
	for _, c := range pod.Spec.Containers {
		id, err := containerID(pod, c.Name)
		if err != nil {
			return nil, err
		}
		ids = append(ids, id)
	}
	return ids, nil
}

// containerID is the runtime ID of pod's running container name.
func containerID(pod *corev1.Pod, name string) (string, error) {
	for _, cs := range pod.Status.ContainerStatuses {
		if cs.Name != name {
			continue
		}
		if cs.State.Running == nil || cs.ContainerID == "" {
			return "", fmt.Errorf("container %s is not running", name)
		}
		_, id, ok := strings.Cut(cs.ContainerID, "://")
		if !ok || id == "" {
			return "", fmt.Errorf("container %s: unexpected container ID %q", name, cs.ContainerID)
		}
		return id, nil
	}
	return "", fmt.Errorf("container %s is not running", name)
}

// sameCondition reports whether pod already carries cond (its time aside).
func sameCondition(pod *corev1.Pod, cond corev1.PodCondition) bool {
	for _, c := range pod.Status.Conditions {
		if c.Type == cond.Type {
			return c.Status == cond.Status && c.Reason == cond.Reason && c.Message == cond.Message
		}
	}
	return false
}

// answer writes cond into pod's status, guarded by the resourceVersion
// the wish was read at: an answer is never about a wish the pod no longer
// holds. A strategic merge patch keyed by type leaves the kubelet's
// conditions alone.
func (r *Reconciler) answer(ctx context.Context, pod *corev1.Pod, cond corev1.PodCondition) error {
	cond.LastTransitionTime.Time = time.Now()
	patch := map[string]any{
		"metadata": map[string]any{"resourceVersion": pod.ResourceVersion},
		"status":   map[string]any{"conditions": []corev1.PodCondition{cond}},
	}
	body, err := json.Marshal(patch)
	if err != nil {
		return err
	}
	return r.C.Status().Patch(ctx, pod, client.RawPatch(types.StrategicMergePatchType, body))
}

// Package controller is `moat controller`: the reconcilers of OpenSandbox's
// Pool, BatchSandbox and SandboxSnapshot resources (api/v1alpha1,
// sandbox.opensandbox.io), on controller-runtime.
//
// Pools keep warm sandbox pods. A BatchSandbox is allocated from its pool
// in memory (the ledger) and recorded with one write of its annotations
// (alloc-status, endpoints), whatever its size, then one status write;
// pods it needs beyond the pool's free ones are created for it. The ledger
// is rebuilt from the batches' annotations, read from the API server, on
// start, so a restarted controller never hands out a pod twice. One
// controller process must be active at a time (Options.LeaderElection in
// a multi-replica deployment).
package controller

import (
	"cmp"
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/workqueue"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/config"
	ctrlcontroller "sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

	sbv1 "github.com/moat-sandbox/moat/api/v1alpha1"
	"github.com/moat-sandbox/moat/internal/k8s/alloc"
	"github.com/moat-sandbox/moat/internal/k8s/kclient"
	"github.com/moat-sandbox/moat/internal/k8s/snapreg"
)

// +kubebuilder:rbac:groups=sandbox.opensandbox.io,resources=pools;batchsandboxes;sandboxsnapshots,verbs=get;list;watch;update;patch;delete
// +kubebuilder:rbac:groups=sandbox.opensandbox.io,resources=pools/status;batchsandboxes/status;sandboxsnapshots/status,verbs=get;update;patch
// +kubebuilder:rbac:groups="",resources=pods,verbs=get;list;watch;create;patch;delete;deletecollection
// +kubebuilder:rbac:groups="",resources=secrets,verbs=get;list;watch;create;update;delete
// +kubebuilder:rbac:groups=coordination.k8s.io,resources=leases,verbs=get;list;watch;create;update;patch
// +kubebuilder:rbac:groups="",resources=events,verbs=create;patch
// +kubebuilder:rbac:groups=events.k8s.io,resources=events,verbs=create;patch

// Options configure the controller.
type Options struct {
	// AgentImage is the default image holding /moat for the agent init
	// container (a template's AgentImage overrides it). Required.
	AgentImage string
	// Namespace restricts the controller to one namespace ("" = all).
	Namespace string
	// CreateConcurrency bounds parallel pod creates/deletes per reconcile
	// (default 32).
	CreateConcurrency int
	// BatchWorkers is the number of batches reconciled at once (default 4).
	BatchWorkers int
	// LeaderElection makes replicas elect one active controller.
	LeaderElection bool
	// LeaderElectionNamespace holds the election lease (default: Namespace,
	// or "default").
	LeaderElectionNamespace string
	// MetricsAddr serves controller-runtime metrics ("" or "0" = off).
	MetricsAddr string
	// HealthAddr serves /healthz and /readyz ("" = off).
	HealthAddr string
	// QPS and Burst limit the controller's API requests (client-go's
	// token bucket). Zero: DefaultQPS and DefaultBurst. client-go's own
	// default (5/s, burst 10) makes a pool of 100 take 20 s to fill.
	QPS   float32
	Burst int
	// Isolation is the NetworkPolicy kept in every namespace with
	// sandbox pods (isolation.go).
	Isolation Isolation
	// PauseTimeout bounds how long a spec.pause waits for the nodes to
	// confirm it before it is undone and answered PauseFailed (pause.go;
	// default 10s).
	PauseTimeout time.Duration
	// SnapshotRegistry is where SandboxSnapshots' images go (snapshot.go;
	// empty: snapshots are Failed, Unsupported).
	SnapshotRegistry snapreg.Registry
	// CommitTimeout bounds how long a SandboxSnapshot waits for its
	// node's commit (default 5m).
	CommitTimeout time.Duration
}

// New builds a controller manager with the Pool and BatchSandbox
// reconcilers; run it with Start.
func New(cfg *rest.Config, opts Options) (manager.Manager, error) {
	if opts.AgentImage == "" {
		return nil, fmt.Errorf("controller: agent image is required")
	}
	opts = opts.withDefaults()
	mgr, err := newManager(kclient.RateLimited(cfg, opts.QPS, opts.Burst), opts)
	if err != nil {
		return nil, fmt.Errorf("controller: %w", err)
	}
	led := newLedger()
	poke := make(chan event.GenericEvent, 1024)
	tab, err := newTables(mgr, poke)
	if err != nil {
		return nil, fmt.Errorf("controller: %w", err)
	}
	iso := newIsolator(mgr.GetClient(), mgr.GetAPIReader(), opts.Isolation)
	pr := &poolReconciler{c: mgr.GetClient(), api: mgr.GetAPIReader(), ledger: led, tables: tab, opts: opts, iso: iso}
	br := &batchReconciler{c: mgr.GetClient(), api: mgr.GetAPIReader(), ledger: led, tables: tab, opts: opts, poke: poke, tasks: newTaskRunner(mgr.GetAPIReader()), iso: iso,
		events: mgr.GetEventRecorder("moat-controller")}
	sr := &snapshotReconciler{c: mgr.GetClient(), registry: opts.SnapshotRegistry, timeout: opts.CommitTimeout,
		events: mgr.GetEventRecorder("moat-controller"), now: time.Now}
	if err := register(mgr, opts, pr, br, sr, led, poke); err != nil {
		return nil, err
	}
	if opts.HealthAddr != "" {
		if err := mgr.AddHealthzCheck("ping", healthz.Ping); err != nil {
			return nil, err
		}
		if err := mgr.AddReadyzCheck("ping", healthz.Ping); err != nil {
			return nil, err
		}
	}
	return mgr, nil
}

// withDefaults fills the worker counts left zero.
func (o Options) withDefaults() Options {
	if o.CreateConcurrency <= 0 {
		o.CreateConcurrency = 32
	}
	if o.BatchWorkers <= 0 {
		o.BatchWorkers = 4
	}
	if o.PauseTimeout <= 0 {
		o.PauseTimeout = defaultPauseTimeout
	}
	if o.CommitTimeout <= 0 {
		o.CommitTimeout = defaultCommitTimeout
	}
	return o
}

// newManager builds the manager: its cache holds only moat's pods and the
// allocation tables' Secrets, in opts.Namespace when set.
func newManager(cfg *rest.Config, opts Options) (manager.Manager, error) {
	managed := labels.SelectorFromSet(labels.Set{sbv1.LabelManaged: sbv1.ManagedBy})
	tables := labels.SelectorFromSet(labels.Set{alloc.LabelTable: "true"})
	copts := cache.Options{ByObject: map[client.Object]cache.ByObject{&corev1.Pod{}: {Label: managed}, &corev1.Secret{}: {Label: tables}}}
	if opts.Namespace != "" {
		copts.DefaultNamespaces = map[string]cache.Config{opts.Namespace: {}}
	}
	leNS := cmp.Or(opts.LeaderElectionNamespace, opts.Namespace, "default")
	skipNameValidation := true
	return ctrl.NewManager(cfg, manager.Options{
		Scheme: kclient.Scheme(),
		Cache:  copts,
		// The pools' token Secrets are read from the API server: through
		// the cache, the first read started an informer over every Secret
		// the controller may see (cluster-wide without --namespace) and
		// kept them all in memory.
		Client:                  client.Options{Cache: &client.CacheOptions{DisableFor: []client.Object{&corev1.Secret{}}}},
		Metrics:                 metricsserver.Options{BindAddress: cmp.Or(opts.MetricsAddr, "0")},
		HealthProbeBindAddress:  opts.HealthAddr,
		LeaderElection:          opts.LeaderElection,
		LeaderElectionID:        "moat-controller." + sbv1.Group,
		LeaderElectionNamespace: leNS,
		// Tests and `moat-bench k8s` run several managers in one process.
		Controller: config.Controller{SkipNameValidation: &skipNameValidation},
	})
}

// newTables opens the pools' allocation tables, shared with the moat
// servers that claim pool pods through the Lifecycle API: every pool pod
// the controller hands to a batch, releases or deletes as free goes
// through them, and a table changed by a server wakes the pool (to
// refill it).
func newTables(mgr manager.Manager, poke chan<- event.GenericEvent) (*alloc.Allocator, error) {
	return alloc.New(context.Background(), alloc.Options{
		Client: mgr.GetClient(), Reader: mgr.GetAPIReader(), Informers: mgr.GetCache(),
		Changed: func(pool types.NamespacedName, _ int) { pokePool(poke, pool.Namespace, pool.Name) },
		// A pool's table is sized for its PoolMax when it is made.
		Size: func(pool types.NamespacedName) int {
			var p sbv1.Pool
			if err := mgr.GetClient().Get(context.Background(), pool, &p); err != nil {
				return 0
			}
			return int(p.Spec.CapacitySpec.PoolMax)
		},
	})
}

// register adds the Pool, BatchSandbox and SandboxSnapshot reconcilers
// and what wakes them to mgr.
func register(mgr manager.Manager, opts Options, pr *poolReconciler, br *batchReconciler, sr *snapshotReconciler, led *ledger, poke chan event.GenericEvent) error {
	err := ctrl.NewControllerManagedBy(mgr).Named("pool").
		For(&sbv1.Pool{}).
		Watches(&corev1.Pod{}, podToPool(pokeDelay)).
		WatchesRawSource(source.Channel(poke, pokeHandler(pokeDelay))).
		WithOptions(ctrlcontroller.Options{MaxConcurrentReconciles: 2}).
		Complete(pr)
	if err != nil {
		return fmt.Errorf("controller: pool: %w", err)
	}
	podToBatch := handler.EnqueueRequestsFromMapFunc(func(_ context.Context, o client.Object) []reconcile.Request {
		if name := o.GetLabels()[sbv1.LabelBatch]; name != "" {
			return []reconcile.Request{{NamespacedName: types.NamespacedName{Namespace: o.GetNamespace(), Name: name}}}
		}
		if b, ok := led.owner(client.ObjectKeyFromObject(o)); ok {
			return []reconcile.Request{{NamespacedName: b}}
		}
		return nil
	})
	err = ctrl.NewControllerManagedBy(mgr).Named("batchsandbox").
		For(&sbv1.BatchSandbox{}).
		Watches(&corev1.Pod{}, podToBatch).
		WithOptions(ctrlcontroller.Options{MaxConcurrentReconciles: opts.BatchWorkers}).
		Complete(br)
	if err != nil {
		return fmt.Errorf("controller: batchsandbox: %w", err)
	}
	err = ctrl.NewControllerManagedBy(mgr).Named("sandboxsnapshot").
		For(&sbv1.SandboxSnapshot{}).
		Complete(sr)
	if err != nil {
		return fmt.Errorf("controller: sandboxsnapshot: %w", err)
	}
	return nil
}

// pokeDelay is how long a poked pool waits before its reconcile: the
// pokes of that time (a table change for every claim a moat server
// makes, hundreds a second; an event of every pod of a pool that fills)
// make one reconcile, which looks at every pod of the pool, instead of
// one each (a reconcile per pod event made a fill of 5,000 pods cost
// the controller more CPU than the API server).
const pokeDelay = 200 * time.Millisecond

// podToPool enqueues, after delay, the pool of a pool pod that changed.
func podToPool(delay time.Duration) handler.EventHandler {
	return enqueueAfter(delay, func(o client.Object) (types.NamespacedName, bool) {
		name := o.GetLabels()[sbv1.LabelPool]
		return types.NamespacedName{Namespace: o.GetNamespace(), Name: name}, name != ""
	})
}

// pokeHandler enqueues a poked pool after delay.
func pokeHandler(delay time.Duration) handler.EventHandler {
	return enqueueAfter(delay, func(o client.Object) (types.NamespacedName, bool) {
		return client.ObjectKeyFromObject(o), true
	})
}

// enqueueAfter is an event handler that enqueues the key of an event's
// object (if it has one) after delay; a key already waiting keeps its
// earlier time, so the events of that time make one reconcile.
func enqueueAfter(delay time.Duration, key func(client.Object) (types.NamespacedName, bool)) handler.EventHandler {
	add := func(o client.Object, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
		if k, ok := key(o); ok {
			q.AddAfter(reconcile.Request{NamespacedName: k}, delay)
		}
	}
	return handler.Funcs{
		CreateFunc: func(_ context.Context, e event.CreateEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
			add(e.Object, q)
		},
		UpdateFunc: func(_ context.Context, e event.UpdateEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
			add(e.ObjectNew, q)
		},
		DeleteFunc: func(_ context.Context, e event.DeleteEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
			add(e.Object, q)
		},
		GenericFunc: func(_ context.Context, e event.GenericEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
			add(e.Object, q)
		},
	}
}

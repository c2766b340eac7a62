// Package kubernetes is the "kubernetes" sandbox backend: every sandbox is
// a BatchSandbox (OpenSandbox's sandbox.opensandbox.io/v1alpha1) of one
// replica, served by `moat controller` from a Pool or created from a pod
// template, and its endpoint is the pod IP (the batch's endpoints
// annotation). The backend keeps no state of its own: List and Status read
// the BatchSandboxes of its scope, so a restarted server re-adopts them.
//
// Mapping: Create = create a Secret with the agent token plus the
// BatchSandbox; Stop = scale it to 0 replicas (the controller deletes the
// pod and keeps the batch); Delete = delete both and wait until the
// controller has released the pod; Pause and Resume = spec.pause (the
// controller and moat node freeze the pod where it runs, pause.go).
// Snapshots = a SandboxSnapshot, committed by moat node on the pod's node
// and pushed to the controller's registry (snapshot.go).
// A sandbox with a network policy gets moat's egress sidecar in its pod
// (egress.go).
package kubernetes

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	nodev1 "k8s.io/api/node/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	sbv1 "github.com/moat-sandbox/moat/api/v1alpha1"
	"github.com/moat-sandbox/moat/internal/errdefs"
	"github.com/moat-sandbox/moat/internal/k8s/alloc"
	"github.com/moat-sandbox/moat/internal/k8s/kclient"
	"github.com/moat-sandbox/moat/internal/runtime"
)

// Labels and annotations the backend puts on its BatchSandboxes.
const (
	labelScope      = "moat." + sbv1.Group + "/server-scope"
	annoLabels      = "moat." + sbv1.Group + "/sandbox-labels"
	annoCreated     = "moat." + sbv1.Group + "/created-at"
	annoClass       = "moat." + sbv1.Group + "/class"
	labelToken      = "moat." + sbv1.Group + "/agent-token"
	tokenSecretSufx = "-agent"
	tokenEnv        = "EXECD_ACCESS_TOKEN"
	tokenKey        = "token"
	containerName   = "sandbox"
)

// Config configures the backend.
type Config struct {
	// Namespace holds the sandboxes (default "default").
	Namespace string
	// Scope separates the sandboxes of servers sharing a namespace
	// (default "moat").
	Scope string
	// Pool, if set, names a Pool the sandboxes are claimed from; a
	// sandbox whose spec differs from the pool's template is created cold.
	Pool string
	// AgentImage overrides the controller's --agent-image (optional).
	AgentImage string
	// Classes are accepted Spec.Class values, each used as the pod's
	// runtimeClassName (e.g. "runsc"). Nil: the cluster's RuntimeClasses,
	// read once by New (none if they cannot be read); empty: only the
	// default class.
	Classes []string
	// DeleteTimeout bounds how long Delete waits for the controller to
	// release the pod (default 60s).
	DeleteTimeout time.Duration
	// CreateTimeout bounds how long Create waits for the pod to run,
	// scheduling and image pull included (default 5m).
	CreateTimeout time.Duration
	// SyncTimeout bounds how long New waits for its informers' first
	// lists (default 60s).
	SyncTimeout time.Duration
	// RequestFraction is the share of a sandbox's CPU and memory limits
	// its pod requests from the scheduler, in (0, 1] (0 = 1: requests
	// equal limits, a Guaranteed pod). Lower values pack more sandboxes
	// on a node than their limits add up to.
	RequestFraction float64
	// DNSUpstreams are the resolvers ("host:port") the egress sidecar of a
	// sandbox with a network policy forwards allowed names to (default:
	// the nameservers of this process's /etc/resolv.conf, the cluster DNS
	// for a server in a pod).
	DNSUpstreams []string
	// VaultUpstreamCA (PEM certificates; the server's
	// --vault-upstream-ca) goes with each sandbox's vault to its egress
	// sidecar, whose credential proxy trusts it for upstream servers
	// besides the sidecar image's roots (nil: those alone).
	VaultUpstreamCA []byte
	// Logger receives what the runtime does in the background (default
	// slog.Default()).
	Logger *slog.Logger
	// EgressTimeout bounds one call to a sandbox's egress sidecar
	// (default 10s).
	EgressTimeout time.Duration
	// PauseTimeout bounds how long Pause and Resume wait for the
	// controller's answer (default 30s; the controller's own
	// --pause-timeout, 10s by default, should be shorter).
	PauseTimeout time.Duration
	// SnapshotTimeout bounds how long SnapshotImage waits for the
	// controller's answer (default 6m, longer than the controller's own
	// --commit-timeout).
	SnapshotTimeout time.Duration
	// Tenants, if set, puts each tenant's sandboxes, pods, token Secrets
	// and volumes in a namespace of its own (tenants.go); nil: everything
	// is in Namespace.
	Tenants *TenantNamespaces
}

// Runtime is the kubernetes backend.
type Runtime struct {
	c   client.Client
	cfg Config
	// cache holds the pool pods, allocation tables, pool token Secrets
	// and Pools of the namespace; alloc serves claims from it (pools.go).
	cache cache.Cache
	alloc *alloc.Allocator
	stop  context.CancelFunc
	done  chan struct{}
	// inline is called when the inline records may have changed; nil:
	// claims write no record inline (pools.go).
	inline atomic.Pointer[func(part any)]
	// tenants is the state of the tenant namespaces (tenants.go);
	// stopTenants stops its quota resync (nil: none).
	tenants     tenantState
	stopTenants func()
	// egress is the server's side of the egress sidecars (Egress).
	egress *Egress
}

var _ runtime.Runtime = (*Runtime)(nil)

// New connects to the cluster of rc.
func New(rc *rest.Config, cfg Config) (*Runtime, error) {
	if cfg.Namespace == "" {
		cfg.Namespace = "default"
	}
	if cfg.Scope == "" {
		cfg.Scope = "moat"
	}
	if cfg.DeleteTimeout == 0 {
		cfg.DeleteTimeout = 60 * time.Second
	}
	if cfg.CreateTimeout == 0 {
		cfg.CreateTimeout = 5 * time.Minute
	}
	if cfg.SyncTimeout == 0 {
		cfg.SyncTimeout = 60 * time.Second
	}
	if cfg.EgressTimeout == 0 {
		cfg.EgressTimeout = 10 * time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.PauseTimeout == 0 {
		cfg.PauseTimeout = 30 * time.Second
	}
	if cfg.SnapshotTimeout == 0 {
		cfg.SnapshotTimeout = 6 * time.Minute
	}
	if cfg.RequestFraction < 0 || cfg.RequestFraction > 1 {
		return nil, fmt.Errorf("kubernetes: %w: request fraction %v is not in (0, 1]", errdefs.ErrInvalidArgument, cfg.RequestFraction)
	}
	if rc.QPS == 0 && rc.RateLimiter == nil {
		// client-go's default (5/s, burst 10) would be shared by every
		// request of the server: the controller's defaults instead.
		rc = kclient.RateLimited(rc, 0, 0)
	}
	c, err := client.New(rc, client.Options{Scheme: kclient.Scheme()})
	if err != nil {
		return nil, fmt.Errorf("kubernetes: %w: %v", errdefs.ErrUnavailable, err)
	}
	if t := cfg.Tenants; t != nil && t.Prefix == "" {
		t2 := *t
		t2.Prefix = cfg.Namespace
		cfg.Tenants = &t2
	}
	r := &Runtime{c: c, cfg: cfg, tenants: tenantState{applied: map[string]appliedQuota{}, placed: map[string]string{}}}
	r.egress = newEgress(r)
	sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if r.cfg.Classes == nil {
		r.cfg.Classes = runtimeClasses(sctx, c)
	}
	if err := r.startClaims(rc); err != nil {
		return nil, err
	}
	if cfg.Tenants != nil {
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { defer close(done); r.resyncQuotas(ctx, cmp.Or(cfg.Tenants.QuotaResync, quotaResync)) }()
		r.stopTenants = func() { cancel(); <-done }
	}
	r.sweepTokens(sctx, orphanTokenAge)
	return r, nil
}

// runtimeClasses lists the cluster's RuntimeClasses by name: each is a
// runtime class a sandbox may ask for (extensions moat.runtime), as the
// native runtime's runc, crun and runsc are. None when they cannot be
// listed (no RBAC for them): only the default class is offered then.
func runtimeClasses(ctx context.Context, c client.Client) []string {
	var list nodev1.RuntimeClassList
	if err := c.List(ctx, &list); err != nil {
		return []string{}
	}
	out := make([]string, 0, len(list.Items))
	for _, rc := range list.Items {
		out = append(out, rc.Name)
	}
	slices.Sort(out)
	return out
}

// orphanTokenAge is how old an agent token Secret without an owner must be
// before New's sweepTokens takes it for a crash's leftover (a Create in flight
// owns its Secret within milliseconds).
const orphanTokenAge = time.Minute

// sweepTokens deletes the agent token Secrets of this scope that a server
// stopped between creating one and creating its BatchSandbox left behind:
// those without an owner, older than minAge, whose sandbox does
// not exist. Best effort: a failure leaves them to the next start.
func (r *Runtime) sweepTokens(ctx context.Context, minAge time.Duration) {
	var list corev1.SecretList
	if r.c.List(ctx, &list, client.InNamespace(r.listNamespace()), client.MatchingLabels{labelScope: r.cfg.Scope, labelToken: "true"}) != nil {
		return
	}
	for i := range list.Items {
		sec := &list.Items[i]
		if len(sec.OwnerReferences) > 0 || time.Since(sec.CreationTimestamp.Time) < minAge {
			continue
		}
		var b sbv1.BatchSandbox
		err := r.c.Get(ctx, types.NamespacedName{Namespace: sec.Namespace, Name: strings.TrimSuffix(sec.Name, tokenSecretSufx)}, &b)
		if apierrors.IsNotFound(err) {
			r.c.Delete(ctx, sec, client.Preconditions{UID: &sec.UID})
		}
	}
}

// Name implements runtime.Runtime.
func (r *Runtime) Name() string { return "kubernetes" }

// Capabilities implements runtime.Runtime.
func (r *Runtime) Capabilities() runtime.Capabilities {
	return runtime.Capabilities{Classes: slices.Clone(r.cfg.Classes)}
}

// Namespace is the namespace holding the sandboxes.
func (r *Runtime) Namespace() string { return r.cfg.Namespace }

// Close stops the informers.
func (r *Runtime) Close() error {
	r.egress.close()
	if r.stopTenants != nil {
		r.stopTenants()
	}
	if r.stop != nil {
		r.stop()
		<-r.done
	}
	return nil
}

func (r *Runtime) validate(spec runtime.Spec) error {
	if err := spec.Validate(); err != nil {
		return err
	}
	if spec.Class != "" && !slices.Contains(r.cfg.Classes, spec.Class) {
		return runtime.Invalid("runtime class %q is not available", spec.Class)
	}
	if err := r.validateEgress(spec); err != nil {
		return err
	}
	for _, m := range spec.Mounts {
		if m.Volume == "" {
			// Host paths of the server mean nothing on a cluster node.
			return runtime.Invalid("host mounts are not supported by the kubernetes runtime")
		}
	}
	return nil
}

// classify maps an API error to an errdefs class.
func classify(what string, err error) error {
	switch {
	case err == nil:
		return nil
	case apierrors.IsNotFound(err):
		return fmt.Errorf("%s: %w", what, errdefs.ErrNotFound)
	case apierrors.IsAlreadyExists(err):
		return fmt.Errorf("%s: %w", what, errdefs.ErrAlreadyExists)
	case apierrors.IsInvalid(err), apierrors.IsBadRequest(err):
		return fmt.Errorf("%s: %w: %v", what, errdefs.ErrInvalidArgument, err)
	case apierrors.IsConflict(err):
		return fmt.Errorf("%s: %w: %v", what, errdefs.ErrConflict, err)
	default:
		return fmt.Errorf("%s: %w: %v", what, errdefs.ErrUnavailable, err)
	}
}

// template renders spec as the pod template of its BatchSandbox (the
// controller adds the agent, which runs the entrypoint as its child).
func (r *Runtime) template(spec runtime.Spec) *corev1.PodTemplateSpec {
	c := corev1.Container{
		Name:       containerName,
		Image:      spec.Image,
		Command:    slices.Clone(spec.Entrypoint),
		WorkingDir: spec.WorkingDir,
	}
	for _, k := range slices.Sorted(maps.Keys(spec.Env)) {
		c.Env = append(c.Env, corev1.EnvVar{Name: k, Value: spec.Env[k]})
	}
	if spec.AgentToken != "" {
		c.Env = append(c.Env, corev1.EnvVar{Name: tokenEnv, ValueFrom: &corev1.EnvVarSource{
			SecretKeyRef: &corev1.SecretKeySelector{
				LocalObjectReference: corev1.LocalObjectReference{Name: spec.ID + tokenSecretSufx},
				Key:                  tokenKey,
			},
		}})
	}
	lim := corev1.ResourceList{}
	if spec.Resources.CPUMillis > 0 {
		lim[corev1.ResourceCPU] = *resource.NewMilliQuantity(spec.Resources.CPUMillis, resource.DecimalSI)
	}
	if spec.Resources.MemoryBytes > 0 {
		lim[corev1.ResourceMemory] = *resource.NewQuantity(spec.Resources.MemoryBytes, resource.BinarySI)
	}
	if spec.Resources.DiskBytes > 0 {
		lim[corev1.ResourceEphemeralStorage] = *resource.NewQuantity(spec.Resources.DiskBytes, resource.BinarySI)
	}
	// PidsLimit is a node (kubelet) setting in Kubernetes; not per pod.
	if len(lim) > 0 {
		req := lim
		if f := r.cfg.RequestFraction; f > 0 && f < 1 {
			req = corev1.ResourceList{}
			for k, q := range lim {
				if k == corev1.ResourceCPU {
					req[k] = *resource.NewMilliQuantity(max(1, int64(float64(q.MilliValue())*f)), resource.DecimalSI)
				} else {
					req[k] = *resource.NewQuantity(max(1, int64(float64(q.Value())*f)), resource.BinarySI)
				}
			}
		}
		c.Resources = corev1.ResourceRequirements{Limits: lim, Requests: req}
	}
	t := &corev1.PodTemplateSpec{
		ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{labelScope: r.cfg.Scope}},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{c}},
	}
	if spec.Class != "" {
		t.Spec.RuntimeClassName = &spec.Class
	}
	t.Annotations = map[string]string{}
	if r.cfg.AgentImage != "" {
		// The controller's agent injection uses its --agent-image; a
		// server-specific image travels as an explicit init container.
		t.Annotations[sbv1.AnnoAgentImage] = r.cfg.AgentImage
	}
	if spec.Egress != nil {
		// The controller adds the egress sidecar (egress.go).
		t.Annotations[sbv1.AnnoEgress] = spec.ID + tokenSecretSufx
	}
	if len(t.Annotations) == 0 {
		t.Annotations = nil
	}
	return t
}

// Create implements runtime.Runtime.
func (r *Runtime) Create(ctx context.Context, spec runtime.Spec) (_ runtime.Status, err error) {
	if err := r.validate(spec); err != nil {
		return runtime.Status{}, err
	}
	ns := r.namespaceOf(spec.Tenant)
	if err := r.prepareNamespace(ctx, spec.Tenant, ns); err != nil {
		return runtime.Status{}, err
	}
	key := types.NamespacedName{Namespace: ns, Name: spec.ID}
	var existing sbv1.BatchSandbox
	switch err := r.c.Get(ctx, key, &existing); {
	case err == nil:
		return runtime.Status{}, fmt.Errorf("sandbox %q: %w", spec.ID, errdefs.ErrAlreadyExists)
	case !apierrors.IsNotFound(err):
		return runtime.Status{}, classify("sandbox "+spec.ID, err)
	}
	labels, err := json.Marshal(spec.Labels)
	if err != nil {
		return runtime.Status{}, runtime.Invalid("labels: %v", err)
	}
	created := time.Now().UTC().Truncate(time.Microsecond)
	tpl := r.template(spec)
	if err := r.addVolumeMounts(ctx, ns, tpl, spec.Mounts); err != nil {
		return runtime.Status{}, err
	}
	one := int32(1)
	b := &sbv1.BatchSandbox{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: ns, Name: spec.ID,
			Labels:      map[string]string{labelScope: r.cfg.Scope},
			Annotations: map[string]string{annoLabels: string(labels), annoCreated: created.Format(time.RFC3339Nano), annoClass: spec.Class},
			// Set here so the controller need not add it.
			Finalizers: []string{sbv1.FinalizerRelease},
		},
		Spec: sbv1.BatchSandboxSpec{Replicas: &one, Template: tpl},
	}
	if r.cfg.Pool != "" && ns == r.cfg.Namespace {
		var pool sbv1.Pool
		err := r.c.Get(ctx, types.NamespacedName{Namespace: r.cfg.Namespace, Name: r.cfg.Pool}, &pool)
		if err == nil && poolServes(pool.Spec.Template, tpl) {
			// Served warm when the pool has a free pod; else created
			// from the template.
			b.Spec.PoolRef = r.cfg.Pool
		}
	}
	// The token Secret exists before the BatchSandbox: a pod started
	// before it would fail with CreateContainerConfigError, which Create
	// takes for a failure (startFailure). It gets its owner reference (for
	// the garbage collector) once the batch exists; sweepTokens removes
	// one a crash left without a batch.
	var sec *corev1.Secret
	if spec.AgentToken != "" || spec.Egress != nil {
		sec = &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: spec.ID + tokenSecretSufx,
				Labels: map[string]string{labelScope: r.cfg.Scope, labelToken: "true"}},
			StringData: map[string]string{tokenKey: spec.AgentToken},
		}
		if err := r.egressSecret(spec, sec.StringData); err != nil {
			return runtime.Status{}, err
		}
		if err := r.c.Create(ctx, sec); err != nil {
			if gone := r.gone(ctx, spec.Tenant, ns, err); gone != nil {
				return runtime.Status{}, gone
			}
			return runtime.Status{}, classify("create agent token secret", err)
		}
	}
	r.place(spec.ID, ns)
	if err := r.c.Create(ctx, b); err != nil {
		r.forget(spec.ID)
		if sec != nil {
			r.c.Delete(context.WithoutCancel(ctx), sec)
		}
		if gone := r.gone(ctx, spec.Tenant, ns, err); gone != nil {
			return runtime.Status{}, gone
		}
		return runtime.Status{}, classify("create sandbox "+spec.ID, err)
	}
	if sec != nil {
		sec.OwnerReferences = []metav1.OwnerReference{*metav1.NewControllerRef(b, sbv1.GroupVersion.WithKind("BatchSandbox"))}
		if err := r.c.Update(ctx, sec); err != nil {
			r.Delete(context.WithoutCancel(ctx), spec.ID)
			return runtime.Status{}, classify("own agent token secret", err)
		}
	}
	// The contract: Create returns once the agent process has started,
	// i.e. once the pod runs (scheduling and image pull included).
	st, err := r.waitRunning(ctx, ns, spec.ID)
	if err != nil {
		r.Delete(context.WithoutCancel(ctx), spec.ID)
		return runtime.Status{}, err
	}
	return st, nil
}

// podCheckInterval is how often waitRunning reads the pod of a sandbox
// that is not running yet from the API server, and how often it asks the
// API server about a sandbox its cache does not show yet.
const podCheckInterval = 250 * time.Millisecond

// waitRunning waits until the sandbox's pod runs, up to CreateTimeout,
// watching the BatchSandbox through the cache (no API request per look);
// it fails early when the kubelet cannot start the pod (startFailure).
func (r *Runtime) waitRunning(ctx context.Context, ns, id string) (runtime.Status, error) {
	ctx, cancel := context.WithTimeout(ctx, r.cfg.CreateTimeout)
	defer cancel()
	key := types.NamespacedName{Namespace: ns, Name: id}
	var last runtime.Status
	var checked time.Time
	for {
		var b sbv1.BatchSandbox
		err := r.cache.Get(ctx, key, &b)
		check := time.Since(checked) >= podCheckInterval
		if check {
			checked = time.Now()
		}
		switch {
		case apierrors.IsNotFound(err):
			// Not in the cache yet, or deleted meanwhile: ask the API.
			if check {
				if _, err := r.get(ctx, id); errdefs.IsNotFound(err) {
					return runtime.Status{}, fmt.Errorf("sandbox %s: %w: deleted while it started", id, errdefs.ErrNotFound)
				}
			}
		case err != nil:
			if ctx.Err() == nil {
				return runtime.Status{}, classify("sandbox "+id, err)
			}
		default:
			last = status(&b)
			switch last.State {
			case runtime.StateRunning:
				return last, nil
			case runtime.StateStopped, runtime.StateUnknown:
				return runtime.Status{}, fmt.Errorf("sandbox %s: %w: pod %s (%s)", id, errdefs.ErrFailedPrecondition, last.State, last.Message)
			}
			if pods := b.AllocatedPods(); check && len(pods) > 0 && pods[0] != "" {
				var p corev1.Pod
				if err := r.c.Get(ctx, types.NamespacedName{Namespace: ns, Name: pods[0]}, &p); err == nil {
					if err := startFailure(&p); err != nil {
						return runtime.Status{}, fmt.Errorf("sandbox %s: %w", id, err)
					}
				}
			}
		}
		select {
		case <-ctx.Done():
			return runtime.Status{}, fmt.Errorf("sandbox %s: %w: not running after %v (%s)", id, errdefs.ErrUnavailable, r.cfg.CreateTimeout, last.Message)
		case <-time.After(5 * time.Millisecond):
		}
	}
}

func (r *Runtime) get(ctx context.Context, id string) (*sbv1.BatchSandbox, error) {
	if !runtime.ValidID(id) {
		return nil, fmt.Errorf("sandbox %q: %w", id, errdefs.ErrNotFound)
	}
	ns, err := r.locate(ctx, id)
	if err != nil {
		return nil, err
	}
	var b sbv1.BatchSandbox
	if err := r.c.Get(ctx, types.NamespacedName{Namespace: ns, Name: id}, &b); err != nil {
		return nil, classify("sandbox "+id, err)
	}
	if b.Labels[labelScope] != r.cfg.Scope {
		return nil, fmt.Errorf("sandbox %q: %w", id, errdefs.ErrNotFound)
	}
	return &b, nil
}

// status maps a BatchSandbox to a runtime status.
func status(b *sbv1.BatchSandbox) runtime.Status {
	st := runtime.Status{ID: b.Name, State: runtime.StateCreating, Class: b.Annotations[annoClass]}
	st.CreatedAt, _ = time.Parse(time.RFC3339Nano, b.Annotations[annoCreated])
	if st.CreatedAt.IsZero() {
		st.CreatedAt = b.CreationTimestamp.UTC()
	}
	if s := b.Annotations[annoLabels]; s != "" && s != "null" {
		json.Unmarshal([]byte(s), &st.Labels)
	}
	pods, ips := b.AllocatedPods(), b.Endpoints()
	podFailed, ended := b.Condition(sbv1.ConditionPodFailed)
	switch {
	case b.DeletionTimestamp != nil:
		st.State = runtime.StateStopped
	case b.GetReplicas() == 0 && b.Status.ObservedGeneration == b.Generation && b.Status.Replicas == 0:
		st.State = runtime.StateStopped
	case b.GetReplicas() == 0:
		st.Message = "stopping"
	case b.Status.Phase == sbv1.PhaseFailed:
		st.State = runtime.StateUnknown
		if c, ok := b.Condition(sbv1.ConditionReady); ok {
			st.Message = c.Message
		}
	case ended:
		// How it ended (an eviction: the kubelet's message) is in the
		// condition.
		st.State, st.Message = runtime.StateStopped, "pod ended"
		if podFailed.Message != "" {
			st.Message = podFailed.Message
		}
	case b.Status.Phase == sbv1.PhasePaused || b.Status.Phase == sbv1.PhaseResuming:
		// Frozen where it runs (pause.go).
		st.State = runtime.StatePaused
		if len(ips) > 0 {
			st.IP = ips[0]
		}
	case len(pods) > 0 && len(ips) > 0 && ips[0] != "" && b.Status.Ready > 0:
		st.State, st.IP = runtime.StateRunning, ips[0]
	default:
		if c, ok := b.Condition(sbv1.ConditionReady); ok {
			st.Message = c.Message
		}
	}
	return st
}

// Status implements runtime.Runtime.
func (r *Runtime) Status(ctx context.Context, id string) (runtime.Status, error) {
	if pool, pod, at, ok, _ := r.claimed(ctx, id, false); ok {
		return r.claimStatus(id, pool, pod, at), nil
	}
	b, err := r.get(ctx, id)
	if errdefs.IsNotFound(err) {
		// Claimed by another replica a moment ago?
		pool, pod, at, ok, cerr := r.claimed(ctx, id, true)
		if cerr != nil {
			return runtime.Status{}, cerr
		}
		if ok {
			return r.claimStatus(id, pool, pod, at), nil
		}
	}
	if err != nil {
		return runtime.Status{}, err
	}
	return status(b), nil
}

// List implements runtime.Runtime.
func (r *Runtime) List(ctx context.Context) ([]runtime.Status, error) {
	var list sbv1.BatchSandboxList
	if err := r.c.List(ctx, &list, client.InNamespace(r.listNamespace()), client.MatchingLabels{labelScope: r.cfg.Scope}); err != nil {
		return nil, classify("list sandboxes", err)
	}
	out := make([]runtime.Status, 0, len(list.Items))
	for i := range list.Items {
		r.place(list.Items[i].Name, list.Items[i].Namespace)
		out = append(out, status(&list.Items[i]))
	}
	// The sandboxes claimed from pools: read the tables afresh, so that a
	// claim another replica just made is listed.
	if err := r.alloc.Refresh(ctx, r.cfg.Namespace); err != nil {
		return nil, err
	}
	return append(out, r.claimedStatuses()...), nil
}

// Stop implements runtime.Runtime: the batch is scaled to 0, so the
// controller deletes the pod (the kubelet gives it its termination grace)
// and keeps the batch; Stop returns when that is done (bounded by grace
// plus DeleteTimeout).
func (r *Runtime) Stop(ctx context.Context, id string, grace time.Duration) error {
	if pool, pod, _, ok, err := r.claimed(ctx, id, true); err != nil {
		return err
	} else if ok {
		// A claimed pod cannot be kept stopped: it is released.
		return r.releaseClaim(ctx, id, pool, pod)
	}
	b, err := r.get(ctx, id)
	if err != nil {
		return err
	}
	if b.DeletionTimestamp != nil {
		return nil
	}
	if b.GetReplicas() != 0 {
		patch := client.RawPatch(types.MergePatchType, []byte(`{"spec":{"replicas":0}}`))
		if err := r.c.Patch(ctx, b, patch); err != nil {
			return classify("stop sandbox "+id, err)
		}
	}
	// Return once the controller has released the pod, like the other
	// backends return once the process is gone.
	ctx, cancel := context.WithTimeout(ctx, grace+r.cfg.DeleteTimeout)
	defer cancel()
	for {
		b, err := r.get(ctx, id)
		if errdefs.IsNotFound(err) {
			return nil
		}
		if err == nil && status(b).State == runtime.StateStopped {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("stop sandbox %s: %w: the controller has not stopped it", id, errdefs.ErrUnavailable)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// Delete implements runtime.Runtime. It waits (up to DeleteTimeout) until
// the controller has released the pod and the BatchSandbox is gone, so the
// ID can be reused at once.
func (r *Runtime) Delete(ctx context.Context, id string) error {
	if !runtime.ValidID(id) {
		return nil
	}
	if pool, pod, _, ok, err := r.claimed(ctx, id, true); err != nil {
		return err
	} else if ok {
		return r.releaseClaim(ctx, id, pool, pod)
	}
	ns, err := r.locate(ctx, id)
	if err != nil {
		return err
	}
	key := types.NamespacedName{Namespace: ns, Name: id}
	sec := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: id + tokenSecretSufx}}
	if err := r.c.Delete(ctx, sec); err != nil && !apierrors.IsNotFound(err) {
		return classify("delete agent token secret", err)
	}
	b, err := r.get(ctx, id)
	if errdefs.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return err
	}
	if err := r.c.Delete(ctx, b, client.Preconditions{UID: &b.UID}); err != nil && !apierrors.IsNotFound(err) {
		return classify("delete sandbox "+id, err)
	}
	if !r.waitGone(ctx, key, b.UID, &sbv1.BatchSandbox{}) {
		return fmt.Errorf("delete sandbox %s: %w: the controller has not released it in %v", id, errdefs.ErrUnavailable, r.cfg.DeleteTimeout)
	}
	r.forget(id)
	return nil
}

// waitGone waits, up to DeleteTimeout, until the object at key whose UID
// is uid is gone: not found, or replaced by one of another UID. cur is an
// object of its kind to read into. It reports whether it went.
func (r *Runtime) waitGone(ctx context.Context, key types.NamespacedName, uid types.UID, cur client.Object) bool {
	ctx, cancel := context.WithTimeout(ctx, r.cfg.DeleteTimeout)
	defer cancel()
	for {
		err := r.c.Get(ctx, key, cur)
		if apierrors.IsNotFound(err) || (err == nil && cur.GetUID() != uid) {
			return true
		}
		select {
		case <-ctx.Done():
			return false
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// Endpoint implements runtime.Runtime: the pod IP (reachable from a server
// running in the cluster network).
func (r *Runtime) Endpoint(ctx context.Context, id string, port int) (string, error) {
	st, err := r.Status(ctx, id)
	if err != nil {
		return "", err
	}
	if st.State != runtime.StateRunning || st.IP == "" {
		return "", fmt.Errorf("sandbox %s is %s: %w", id, st.State, errdefs.ErrFailedPrecondition)
	}
	return st.IP + ":" + strconv.Itoa(port), nil
}

// poolServes reports whether a pool pod made from pt can stand in for a
// sandbox of template t: the same container (image, command, working
// directory, environment, limits, token) and runtime class. The pool's
// pods cannot take another environment: it is set when a pod starts.
func poolServes(pt, t *corev1.PodTemplateSpec) bool {
	if pt == nil || len(pt.Spec.Containers) != 1 || len(t.Spec.Containers) != 1 || len(t.Spec.Volumes) > 0 {
		return false
	}
	if t.Annotations[sbv1.AnnoEgress] != "" {
		// A sandbox with a policy starts with its own sidecar. One
		// without takes a pool pod with or without one (a pool's sidecar
		// starts allowing everything).
		return false
	}
	a, b := pt.Spec.Containers[0], t.Spec.Containers[0]
	return a.Image == b.Image && slices.Equal(slices.Concat(a.Command, a.Args), b.Command) && a.WorkingDir == b.WorkingDir &&
		equality.Semantic.DeepEqual(a.Env, b.Env) && a.Resources.Limits.Cpu().Equal(*b.Resources.Limits.Cpu()) &&
		a.Resources.Limits.Memory().Equal(*b.Resources.Limits.Memory()) &&
		ptrEqual(pt.Spec.RuntimeClassName, t.Spec.RuntimeClassName)
}

func ptrEqual(a, b *string) bool {
	return (a == nil && b == nil) || (a != nil && b != nil && *a == *b)
}

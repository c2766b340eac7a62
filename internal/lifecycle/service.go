// Package lifecycle is the sandbox domain service behind the Lifecycle API:
// the state machine, create/get/list/delete, pause/resume, expiry (the TTL
// reaper), metadata, endpoints, and re-adoption of sandboxes after a server
// restart. It knows nothing about HTTP.
//
// Persistence: the service keeps every sandbox in memory and writes a record
// through to the store when a sandbox becomes Running and on every later
// change. A sandbox that was still being created when the server died has no
// record; Recover finds its leftovers through runtime.List and deletes them.
package lifecycle

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/netip"
	"path/filepath"
	"slices"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/moat-sandbox/moat/internal/agentproto"
	"github.com/moat-sandbox/moat/internal/egress/policy"
	"github.com/moat-sandbox/moat/internal/egress/vault"
	"github.com/moat-sandbox/moat/internal/errdefs"
	"github.com/moat-sandbox/moat/internal/image"
	"github.com/moat-sandbox/moat/internal/runtime"
	"github.com/moat-sandbox/moat/internal/store"
	"github.com/moat-sandbox/moat/internal/volume"
)

// Bucket is the store bucket holding sandbox records.
const Bucket = "sandboxes"

// Images is what the service needs from the image store.
type Images interface {
	// Ensure returns the local image for ref, pulling it if missing.
	Ensure(ctx context.Context, ref string, auth *image.Auth) (image.Image, error)
}

// Egress enforces network policies (internal/egress, adapted by the
// server to locate each sandbox's network namespace).
type Egress interface {
	// Attach starts enforcing p on sandbox id, whose address is ip.
	Attach(ctx context.Context, id string, ip netip.Addr, p policy.NetworkPolicy) error
	// Detach stops enforcing and removes the rules.
	Detach(ctx context.Context, id string) error
	// Get returns the policy in force.
	Get(id string) (policy.NetworkPolicy, error)
	// Modify applies fn to the policy in force, atomically.
	Modify(ctx context.Context, id string, fn func(policy.NetworkPolicy) (policy.NetworkPolicy, error)) (policy.NetworkPolicy, error)
}

// Config tunes the service. Zero values take the documented defaults.
type Config struct {
	// MaxTimeout caps the requested timeout (0 = no cap).
	MaxTimeout time.Duration
	// AgentReadyTimeout bounds the wait for the agent's /ping after the
	// runtime started the sandbox. Default 30s.
	AgentReadyTimeout time.Duration
	// ReapInterval is how often expiry and liveness are checked. Default 1s.
	ReapInterval time.Duration
	// FailedRetention is how long a sandbox that failed to create stays
	// visible (as Failed) before it is forgotten. Default 1h.
	FailedRetention time.Duration
	// StopGrace is the SIGTERM->SIGKILL grace on delete. Default 2s.
	StopGrace time.Duration
	// SecureAccess allows secureAccess sandboxes (an ingress gateway that
	// checks their access tokens is running).
	SecureAccess bool
	// OrphanGrace is how old a runtime sandbox without a record must be
	// before the leader of replicas sharing a store deletes it (a create
	// on another replica records its sandbox only once it runs). Default
	// DefaultOrphanGrace.
	OrphanGrace time.Duration
	// AllowedHostPaths are the host directories host volumes may mount
	// (prefix match after cleaning and symlink resolution). Empty refuses
	// every host volume (VOLUME::HOST_PATH_NOT_ALLOWED).
	AllowedHostPaths []string
}

func (c *Config) setDefaults() {
	if c.AgentReadyTimeout == 0 {
		c.AgentReadyTimeout = 30 * time.Second
	}
	if c.ReapInterval == 0 {
		c.ReapInterval = time.Second
	}
	if c.FailedRetention == 0 {
		c.FailedRetention = time.Hour
	}
	if c.StopGrace == 0 {
		c.StopGrace = 2 * time.Second
	}
	if c.OrphanGrace == 0 {
		c.OrphanGrace = DefaultOrphanGrace
	}
}

// Deps are the service's collaborators.
type Deps struct {
	// Store holds the sandbox records, pools and snapshots. A store that
	// other processes write too (store.Watcher: the replicas of a
	// stateless server on Kubernetes) is followed: their changes update
	// this process's view (follow.go).
	Store store.Store
	// Events holds the sandboxes' event rings (default Store). A
	// stateless server keeps them in memory (store.Memory).
	Events store.Store
	// Leader reports whether this process runs the background duties
	// (expiry, liveness, the clean-up of orphans) for the sandboxes it
	// shares with other replicas; nil: always (a single server).
	Leader  func() bool
	Runtime runtime.Runtime
	Images  Images
	// Egress is optional; without it networkPolicy is refused (501).
	Egress Egress
	// Committer is optional; without it (or a runtime.Snapshotter
	// runtime) snapshots are refused (501).
	Committer Committer
	Log       *slog.Logger
	// HTTP is used to ping agents; default a client with short timeouts.
	HTTP *http.Client
	// Now is the clock; default time.Now.
	Now func() time.Time
	// Metrics is optional; nil records nothing.
	Metrics Metrics
	// Quotas is optional; nil limits no tenant (see tenancy.go).
	Quotas Quotas
	// Sealer encrypts Credential Vault state for the store; without it
	// credentialProxy is refused (501).
	Sealer *vault.Sealer
}

// Metrics receives lifecycle observations (see internal/metrics). Calls
// come from request goroutines concurrently and must not block.
type Metrics interface {
	// ObserveCreate records one successful Create that took d.
	ObserveCreate(d time.Duration)
	// ObservePoolClaim records a pool claim served by hits idle sandboxes
	// and misses cold creates.
	ObservePoolClaim(hits, misses int)
}

// observeCreate reports a Create that started at start, if it succeeded.
func (s *Service) observeCreate(start time.Time, err *error) {
	if s.deps.Metrics != nil && *err == nil {
		s.deps.Metrics.ObserveCreate(time.Since(start))
	}
}

// observeClaim reports a pool claim of hits idle and misses cold sandboxes.
func (s *Service) observeClaim(hits, misses int) {
	if s.deps.Metrics != nil {
		s.deps.Metrics.ObservePoolClaim(hits, misses)
	}
}

// entry is one sandbox with its lock. mu serializes operations on the
// sandbox; Service.mu only guards the map.
type entry struct {
	mu sync.Mutex
	sb Sandbox
	// owner is sb.Tenant, fixed when the entry is made (a sandbox never
	// changes tenant), so that lookups check it without e.mu.
	owner string
	// failedAt is set for sandboxes that failed to create (not persisted).
	failedAt time.Time
	// claims are the names of the named volumes the sandbox mounts. Set
	// before the entry is published and never changed, so the volume code
	// reads it without mu.
	claims []string
	// done is set while the sandbox is Failed or Terminated (its runtime
	// resources are gone): it no longer counts as a user of its volumes.
	// setState keeps it current.
	done atomic.Bool
	// createdClaims are the volumes this sandbox's create made (not
	// persisted); a failed create deletes them again. Guarded by mu.
	createdClaims []string
	// cred is the credential proxy (CA and vault) of a sandbox created
	// with credentialProxy; its persisted form is sb.CredentialProxy.
	cred *credProxy
	// stored is set once the record is in the store: later writes update
	// it and never create it again (another replica may have deleted
	// it). Guarded by mu.
	stored bool
}

// Service is the lifecycle service. It is safe for concurrent use.
type Service struct {
	cfg  Config
	deps Deps
	log  *slog.Logger

	mu        sync.RWMutex
	sandboxes map[string]*entry

	poolsMu sync.Mutex
	pools   map[string]*pool
	poolWG  sync.WaitGroup
	closing chan struct{}
	closed  sync.Once

	// snapMu guards snaps and the snapshots in it. Lock order: an entry's
	// mu before snapMu.
	snapMu sync.Mutex
	snaps  map[string]*Snapshot

	// events is every sandbox's event ring (events.go).
	events *eventLog

	// quota charges live sandboxes to their tenants (tenancy.go).
	quota *ledger
	// volMu serializes the named-volume decisions: a create making sure
	// its claims exist, a volume delete checking that no sandbox uses the
	// volume, and the deletion of a sandbox's volumes on termination. Lock
	// order: an entry's mu before volMu before mu.
	volMu sync.Mutex
}

// New returns a service. Call Recover before serving, and Run to start the
// reaper.
func New(cfg Config, deps Deps) (*Service, error) {
	cfg.setDefaults()
	if deps.Runtime == nil || deps.Store == nil || deps.Images == nil {
		return nil, errors.New("lifecycle: Runtime, Store and Images are required")
	}
	if deps.Log == nil {
		deps.Log = slog.Default()
	}
	if deps.Events == nil {
		deps.Events = deps.Store
	}
	if deps.Now == nil {
		deps.Now = time.Now
	}
	if deps.HTTP == nil {
		deps.HTTP = &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	}
	snaps, err := loadSnapshots(deps.Store, deps.Now().UTC())
	if err != nil {
		return nil, err
	}
	return &Service{cfg: cfg, deps: deps, log: deps.Log, sandboxes: map[string]*entry{},
		pools: map[string]*pool{}, closing: make(chan struct{}), snaps: snaps, events: newEventLog(), quota: newLedger()}, nil
}

// Close stops the pool refill loops (sandboxes keep running).
func (s *Service) Close() {
	s.closed.Do(func() { close(s.closing) })
	s.poolWG.Wait()
	s.flushEvents()
}

// Runtime returns the backend the service drives.
func (s *Service) Runtime() runtime.Runtime { return s.deps.Runtime }

func (s *Service) now() time.Time { return s.deps.Now().UTC() }

// newEntry wraps a sandbox record.
func newEntry(sb Sandbox) *entry {
	e := &entry{sb: sb, owner: sb.Tenant}
	for _, c := range sb.Claims {
		e.claims = append(e.claims, c.Name)
	}
	e.done.Store(isTerminal(sb.Status.State))
	return e
}

// get returns the entry of sandbox id, if ctx's tenant scope sees it. A
// sandbox of another tenant, like an idle pool sandbox, is not found.
func (s *Service) get(ctx context.Context, id string) (*entry, error) {
	s.mu.RLock()
	e := s.sandboxes[id]
	s.mu.RUnlock()
	if e == nil || !visible(ctx, e.owner) {
		return nil, notFound(id)
	}
	e.mu.Lock()
	warm := e.sb.Warm
	e.mu.Unlock()
	if warm {
		return nil, notFound(id)
	}
	return e, nil
}

func notFound(id string) error {
	return errdefs.WithPublic(fmt.Errorf("sandbox %q: %w", id, errdefs.ErrNotFound),
		"SANDBOX::NOT_FOUND", fmt.Sprintf("sandbox %s not found", id))
}

// persist writes e's record; the caller holds e.mu. The first write
// creates it; later ones only update it, so that a record another replica
// deleted meanwhile is not made again (ErrNotFound).
func (s *Service) persist(e *entry) error {
	write := s.deps.Store.Put
	if e.stored {
		write = s.deps.Store.Update
	}
	if err := write(Bucket, e.sb.ID, &e.sb); err != nil {
		return fmt.Errorf("persist sandbox %s: %w", e.sb.ID, err)
	}
	e.stored = true
	return nil
}

// leader reports whether this process runs the background duties.
func (s *Service) leader() bool { return s.deps.Leader == nil || s.deps.Leader() }

// shared reports whether other processes write the store too.
func (s *Service) shared() bool {
	_, ok := s.deps.Store.(store.Watcher)
	return ok
}

// Create provisions a sandbox and returns once it is Running (its agent
// answers /ping), matching OpenSandbox's synchronous create.
func (s *Service) Create(ctx context.Context, req CreateRequest) (_ Sandbox, err error) {
	defer s.observeCreate(time.Now(), &err)
	if name := req.Extensions[ExtPoolRef]; name != "" {
		if len(req.Volumes) > 0 || req.HasVolumes {
			return Sandbox{}, errdefs.Invalid(codeInvalidVolume, "volumes cannot be added to a pooled sandbox")
		}
		sbs, err := s.createFromPool(ctx, req, name, 1)
		if err != nil {
			return Sandbox{}, err
		}
		return sbs[0], nil
	}
	sb, err := s.validate(ctx, req)
	if err != nil {
		return Sandbox{}, err
	}
	own(&sb, ownerOf(ctx))
	if err := s.admitEntry(&sb); err != nil {
		return Sandbox{}, err
	}
	e := newEntry(sb)
	e.mu.Lock()
	s.mu.Lock()
	s.sandboxes[sb.ID] = e
	s.mu.Unlock()
	defer e.mu.Unlock()

	// Provisioning continues even if the client goes away, so that it ends
	// in a definite state instead of a half-made sandbox.
	ctx = context.WithoutCancel(ctx)
	if err := s.provision(ctx, e, req.ImageAuth); err != nil {
		return e.sb.clone(), err
	}
	return e.sb.clone(), nil
}

func (s *Service) validate(ctx context.Context, req CreateRequest) (Sandbox, error) {
	now := s.now()
	switch {
	case req.Image == "" && req.SnapshotID == "":
		return Sandbox{}, errdefs.Invalid(codeInvalid, "one of image or snapshotId is required")
	case req.Image != "" && req.SnapshotID != "":
		return Sandbox{}, errdefs.Invalid(codeInvalid, "image and snapshotId are mutually exclusive")
	}
	entrypoint := req.Entrypoint
	var memory *Snapshot
	if req.SnapshotID != "" {
		sn, err := s.readySnapshot(ctx, req.SnapshotID)
		if err != nil {
			return Sandbox{}, err
		}
		if len(entrypoint) == 0 {
			entrypoint = defaultSnapshotEntrypoint
		}
		if sn.Kind == SnapshotMemory {
			// The restored sandbox continues the source's processes: it
			// runs the source's entrypoint whatever the request says.
			memory = &sn
			entrypoint = sn.Entrypoint
			if len(req.Volumes) > 0 || req.HasVolumes {
				return Sandbox{}, errdefs.Invalid(codeInvalidVolume, "volumes cannot be added to a sandbox restored from a memory snapshot")
			}
			if c, ok := req.Extensions[ExtRuntimeClass]; ok && c != sn.Class {
				return Sandbox{}, errdefs.Invalid(codeInvalid, fmt.Sprintf("extensions[%s]: snapshot %s holds a %s sandbox's memory and restores only with runtime %s", ExtRuntimeClass, sn.ID, sn.Class, sn.Class))
			}
		}
	}
	if req.Image != "" && len(req.Entrypoint) == 0 {
		return Sandbox{}, errdefs.Invalid("SANDBOX::INVALID_ENTRYPOINT", "entrypoint is required when image is set")
	}
	for _, a := range req.Entrypoint {
		if len(a) > 1<<16 {
			return Sandbox{}, errdefs.Invalid("SANDBOX::INVALID_ENTRYPOINT", "entrypoint argument too long")
		}
	}
	if req.Timeout < 0 || (req.Timeout > 0 && req.Timeout < 60*time.Second) {
		return Sandbox{}, errdefs.Invalid(codeInvalid, "timeout must be at least 60 seconds (omit it for manual cleanup)")
	}
	if s.cfg.MaxTimeout > 0 && req.Timeout > s.cfg.MaxTimeout {
		return Sandbox{}, errdefs.Invalid(codeInvalid, fmt.Sprintf("timeout exceeds the server maximum of %d seconds", int(s.cfg.MaxTimeout.Seconds())))
	}
	res, err := ParseResources(req.ResourceLimits)
	if err != nil {
		return Sandbox{}, err
	}
	if err := ValidateMetadata(req.Metadata); err != nil {
		return Sandbox{}, err
	}
	for k := range req.Env {
		if k == "" || containsAny(k, "=\x00") {
			return Sandbox{}, errdefs.Invalid(codeInvalid, fmt.Sprintf("env: invalid variable name %q", k))
		}
	}
	if p := req.Platform; p != nil {
		if (p.OS != "" && p.OS != "linux") || (p.Arch != "" && p.Arch != hostArch()) {
			return Sandbox{}, errdefs.Invalid(codeInvalid, fmt.Sprintf("platform %s/%s is not supported by this server (linux/%s only)", p.OS, p.Arch, hostArch()))
		}
	}
	var np *policy.NetworkPolicy
	if len(req.NetworkPolicy) > 0 {
		if s.deps.Egress == nil {
			return Sandbox{}, errdefs.WithPublic(errdefs.ErrNotImplemented, "SANDBOX::API_NOT_SUPPORTED", "networkPolicy is not supported by this server's runtime")
		}
		p, err := policy.Parse(req.NetworkPolicy)
		if err != nil {
			return Sandbox{}, err
		}
		np = &p
	}
	if err := s.checkCredentialProxy(req, np, memory != nil); err != nil {
		return Sandbox{}, err
	}
	if req.SecureAccess && !s.cfg.SecureAccess {
		return Sandbox{}, errdefs.WithPublic(errdefs.ErrNotImplemented, "SANDBOX::API_NOT_SUPPORTED", "secureAccess needs the ingress gateway (moat serve --ingress-listen)")
	}
	if req.HasVolumes && len(req.Volumes) == 0 {
		return Sandbox{}, errdefs.WithPublic(errdefs.ErrInvalidArgument, codeHostPathNotAllowed, "volumes are not allowed by this server's configuration")
	}
	mounts, claims, err := volumeMounts(req.Volumes, s.cfg.AllowedHostPaths, filepath.EvalSymlinks)
	if err != nil {
		return Sandbox{}, err
	}
	if len(claims) > 0 {
		if _, err := s.volumesRuntime(); err != nil {
			return Sandbox{}, err
		}
	}
	sb := Sandbox{
		ID:             newID(),
		Image:          req.Image,
		SnapshotID:     req.SnapshotID,
		Entrypoint:     append([]string(nil), entrypoint...),
		Env:            cloneMap(req.Env),
		Metadata:       cloneMap(req.Metadata),
		ResourceLimits: cloneMap(req.ResourceLimits),
		Resources:      res,
		Extensions:     cloneMap(req.Extensions),
		Platform:       req.Platform,
		CreatedAt:      now,
		AgentToken:     newToken(),
		NetworkPolicy:  np,
		Mounts:         mounts,
		Claims:         claims,
		Status:         Status{State: StatePending, Reason: ReasonCreating, LastTransitionAt: now},
	}
	if np != nil {
		sb.EgressToken = newToken()
	}
	if req.CredentialProxy {
		// Marks the sandbox; provision makes its CA (newCredProxy).
		sb.CredentialProxy = &CredentialProxyRecord{}
	}
	if req.SecureAccess {
		sb.AccessToken = newToken()
	}
	if sb.Metadata == nil {
		sb.Metadata = map[string]string{}
	}
	for k, v := range req.Extensions {
		switch k {
		case ExtRuntimeClass:
			if !s.classAvailable(v) {
				return Sandbox{}, errdefs.Invalid(codeInvalid, fmt.Sprintf("extensions[%s]: runtime %q is not available (have %v)", k, v, s.deps.Runtime.Capabilities().Classes))
			}
			sb.Class = v
		case ExtRenewOnAccess:
			n, err := parseInt(v)
			if err != nil || n < 300 || n > 86400 {
				return Sandbox{}, errdefs.Invalid(codeInvalid, fmt.Sprintf("extensions[%s]: must be an integer between 300 and 86400", k))
			}
			sb.RenewOnAccess = n
		case ExtPoolRef:
			// Handled by createFromPool before validation.
		}
	}
	if memory != nil {
		if s.checkpointer(memory.Class) == nil {
			return Sandbox{}, errdefs.WithPublic(errdefs.ErrNotImplemented, "SANDBOX::API_NOT_SUPPORTED",
				fmt.Sprintf("snapshot %s holds process memory, which runtime %s of this server cannot restore", memory.ID, memory.Class))
		}
		sb.Class = memory.Class
	}
	if req.Timeout > 0 {
		exp := now.Add(req.Timeout)
		sb.ExpiresAt = &exp
	}
	return sb, nil
}

func (s *Service) classAvailable(c string) bool {
	for _, have := range s.deps.Runtime.Capabilities().Classes {
		if have == c {
			return true
		}
	}
	return false
}

// provision runs the create steps; the caller holds e.mu. On failure every
// runtime resource is released, the volumes the create made are deleted
// again, and the entry is left Failed.
func (s *Service) provision(ctx context.Context, e *entry, auth *image.Auth) error {
	err := s.provisionSteps(ctx, e, auth)
	if err != nil {
		s.dropCreatedClaims(ctx, e)
	}
	return err
}

func (s *Service) provisionSteps(ctx context.Context, e *entry, auth *image.Auth) (err error) {
	sb := &e.sb
	// The phases of a create, at debug level (moat bench --log-level
	// debug): each is the time since the start of provisioning.
	t0 := time.Now()
	var phases []any
	phase := func(name string) { phases = append(phases, name, time.Since(t0)) }
	defer func() {
		if err == nil {
			s.log.Debug("lifecycle: created", append([]any{"id", sb.ID}, phases...)...)
		}
	}()
	s.record(sb.ID, EventCreated, ScopeLifecycle, ReasonCreating, "image "+imageRef(sb))
	if len(sb.Claims) > 0 {
		s.volMu.Lock()
		created, err := s.ensureClaimsLocked(ctx, sb.ID, sb.Claims)
		s.volMu.Unlock()
		e.createdClaims = created
		for i := range sb.Claims {
			sb.Claims[i].Created = slices.Contains(created, sb.Claims[i].Name)
		}
		if err != nil {
			s.fail(e, ReasonProvisionFailed, "volumes unavailable")
			return err
		}
	}
	ref := imageRef(sb)
	img, err := s.deps.Images.Ensure(ctx, ref, auth)
	phase("image")
	if err != nil {
		s.fail(e, ReasonImagePullFailed, "image pull failed")
		if sb.SnapshotID != "" {
			return errdefs.WithPublic(fmt.Errorf("%w: snapshot image %s: %v", errdefs.ErrFailedPrecondition, ref, err), "SNAPSHOT::IMAGE_MISSING", fmt.Sprintf("the image of snapshot %s is missing", sb.SnapshotID))
		}
		if errdefs.IsInvalidArgument(err) || errdefs.IsNotFound(err) || errors.Is(err, errdefs.ErrPermissionDenied) {
			// A reference the registry does not have is the caller's error.
			return errdefs.WithPublic(fmt.Errorf("%w: %v", errdefs.ErrInvalidArgument, err), "SANDBOX::IMAGE_PULL_FAILED", fmt.Sprintf("pull image %q: %v", sb.Image, publicCause(err)))
		}
		return errdefs.WithPublic(err, "SANDBOX::IMAGE_PULL_FAILED", fmt.Sprintf("pull image %q failed", sb.Image))
	}
	env := sb.Env
	if sb.CredentialProxy != nil && e.cred == nil {
		if err := s.newCredProxy(e); err != nil {
			s.fail(e, ReasonProvisionFailed, "could not create the sandbox CA")
			return err
		}
	}
	if e.cred != nil {
		env = cloneMap(sb.Env)
		if env == nil {
			env = map[string]string{}
		}
		env[agentproto.TrustCAEnv] = string(e.cred.ca.CertPEM())
	}
	spec := runtime.Spec{
		ID:         sb.ID,
		Image:      img.Name,
		Entrypoint: sb.Entrypoint,
		Env:        env,
		Resources:  sb.Resources,
		Class:      sb.Class,
		AgentToken: sb.AgentToken,
		Labels:     map[string]string{"moat.dev/sandbox": sb.ID},
		Mounts:     sb.Mounts,
	}
	// A sandbox from a memory snapshot is restored: its agent answers
	// with the source's token until rotateToken gives it its own.
	readyToken := sb.AgentToken
	var memory bool
	if sb.SnapshotID != "" {
		s.snapMu.Lock()
		if sn := s.snaps[sb.SnapshotID]; sn != nil && sn.Kind == SnapshotMemory {
			memory, readyToken, spec.Checkpoint = true, sn.AgentToken, sn.ID
		}
		s.snapMu.Unlock()
	}
	st, err := s.deps.Runtime.Create(ctx, spec)
	phase("runtime")
	if err != nil {
		s.cleanupFailed(ctx, sb.ID)
		s.fail(e, ReasonProvisionFailed, "sandbox start failed")
		if errors.Is(err, volume.ErrSubPath) {
			return errdefs.WithPublic(err, codeInvalidSubPath, "a volume's subPath leads out of the volume (through '..' or a symlink) or through a file")
		}
		if errdefs.IsInvalidArgument(err) || errdefs.IsAlreadyExists(err) || errors.Is(err, errdefs.ErrNotImplemented) {
			// The spec's fault, or something this runtime refuses to do
			// (e.g. a disk quota on docker): the runtime's words say which.
			return err
		}
		return errdefs.WithPublic(err, "SANDBOX::START_FAILED", "sandbox start failed")
	}
	if sb.Class == "" {
		sb.Class = st.Class
	}
	if sb.NetworkPolicy != nil {
		if err := s.attachEgress(ctx, sb.ID, st.IP, *sb.NetworkPolicy); err != nil {
			s.cleanupFailed(ctx, sb.ID)
			s.fail(e, ReasonProvisionFailed, "could not apply the network policy")
			return errdefs.WithPublic(err, "SANDBOX::EGRESS_FAILED", "could not apply the network policy")
		}
		if e.cred != nil {
			if err := s.attachCredProxy(ctx, e); err != nil {
				s.cleanupFailed(ctx, sb.ID)
				s.fail(e, ReasonProvisionFailed, "could not start the credential proxy")
				return errdefs.WithPublic(err, "SANDBOX::EGRESS_FAILED", "could not start the credential proxy")
			}
		}
	}
	if err := s.waitAgent(ctx, sb.ID, readyToken); err != nil {
		s.cleanupFailed(ctx, sb.ID)
		s.fail(e, ReasonAgentTimeout, "the sandbox agent did not become ready")
		return errdefs.WithPublic(err, "SANDBOX::EXECD_START_FAILED", "the sandbox agent did not become ready")
	}
	phase("agent")
	if memory {
		err := s.rotateToken(ctx, sb.ID, readyToken, sb.AgentToken)
		if err == nil && len(sb.Env) > 0 {
			err = s.applyEnv(ctx, []*entry{e}, sb.Env)
		}
		if err != nil {
			s.cleanupFailed(ctx, sb.ID)
			s.fail(e, ReasonProvisionFailed, "the restored sandbox agent could not be configured")
			return errdefs.WithPublic(err, "SANDBOX::EXECD_START_FAILED", "the restored sandbox agent could not be configured")
		}
	}
	s.mustTransition(e, StateRunning, ReasonRunning, "")
	if err := s.persist(e); err != nil {
		s.cleanupFailed(ctx, sb.ID)
		s.fail(e, ReasonProvisionFailed, "could not record the sandbox")
		return err
	}
	phase("persist")
	return nil
}

// publicCause returns the client-safe text of err's Public wrapper, if any.
func publicCause(err error) string {
	if p, ok := errdefs.PublicOf(err); ok {
		return p.Message
	}
	switch {
	case errdefs.IsNotFound(err):
		return "not found"
	case errors.Is(err, errdefs.ErrPermissionDenied):
		return "access denied"
	default:
		return "invalid reference"
	}
}

func (s *Service) attachEgress(ctx context.Context, id, ipStr string, p policy.NetworkPolicy) error {
	ip, err := netip.ParseAddr(ipStr)
	if err != nil {
		return fmt.Errorf("sandbox %s has no usable address %q for egress: %w", id, ipStr, errdefs.ErrFailedPrecondition)
	}
	return s.deps.Egress.Attach(ctx, id, ip, p)
}

func (s *Service) cleanupFailed(ctx context.Context, id string) {
	// Cleanup must run even when the create was cancelled (e.g. a pool
	// deleted mid-fill), or the half-made sandbox would leak.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
	defer cancel()
	if s.deps.Egress != nil {
		s.deps.Egress.Detach(ctx, id) // no-op if never attached
	}
	if err := s.deps.Runtime.Delete(ctx, id); err != nil {
		s.log.Error("cleanup of failed sandbox", "id", id, "err", err)
	}
}

func (s *Service) fail(e *entry, reason, msg string) {
	s.mustTransition(e, StateFailed, reason, msg)
	e.failedAt = s.now()
}

// waitAgent polls the agent's /ping until it answers 200 (within
// AgentReadyTimeout). Agents of every protocol version since
// agentproto.MinVersion are accepted: a sandbox whose agent came from an
// older moat is driven as before.
func (s *Service) waitAgent(ctx context.Context, id, token string) error {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.AgentReadyTimeout)
	defer cancel()
	ep, err := s.deps.Runtime.Endpoint(ctx, id, agentproto.Port)
	if err != nil {
		return err
	}
	if _, err := s.agent().WaitReady(ctx, ep, token); err != nil {
		return fmt.Errorf("agent of %s: %w", id, err)
	}
	return nil
}

// agent is the client of the sandbox agents.
func (s *Service) agent() *agentproto.Client { return &agentproto.Client{HTTP: s.deps.HTTP} }

// Get returns one sandbox.
func (s *Service) Get(ctx context.Context, id string) (Sandbox, error) {
	e, err := s.get(ctx, id)
	if err != nil {
		return Sandbox{}, err
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.sb.clone(), nil
}

// ListFilter selects sandboxes; empty fields match everything.
type ListFilter struct {
	States   []State           // OR
	Metadata map[string]string // AND of exact matches
}

// List returns the matching sandboxes, newest first, and the total count
// before pagination. page is 1-based.
func (s *Service) List(ctx context.Context, f ListFilter, page, pageSize int) ([]Sandbox, int) {
	s.mu.RLock()
	entries := make([]*entry, 0, len(s.sandboxes))
	for _, e := range s.sandboxes {
		entries = append(entries, e)
	}
	s.mu.RUnlock()
	var out []Sandbox
	for _, e := range entries {
		if !visible(ctx, e.owner) {
			continue
		}
		e.mu.Lock()
		sb := e.sb.clone()
		e.mu.Unlock()
		if !sb.Warm && matches(sb, f) {
			out = append(out, sb)
		}
	}
	sort.Slice(out, func(i, j int) bool {
		if !out[i].CreatedAt.Equal(out[j].CreatedAt) {
			return out[i].CreatedAt.After(out[j].CreatedAt)
		}
		return out[i].ID < out[j].ID
	})
	total := len(out)
	start := (page - 1) * pageSize
	if start >= total {
		return nil, total
	}
	end := min(start+pageSize, total)
	return out[start:end], total
}

func matches(sb Sandbox, f ListFilter) bool {
	if len(f.States) > 0 {
		ok := false
		for _, st := range f.States {
			if sb.Status.State == st {
				ok = true
				break
			}
		}
		if !ok {
			return false
		}
	}
	for k, v := range f.Metadata {
		if got, ok := sb.Metadata[k]; !ok || got != v {
			return false
		}
	}
	return true
}

// Delete stops the sandbox and frees everything it holds. It returns once
// the sandbox is gone.
func (s *Service) Delete(ctx context.Context, id string) error {
	e, err := s.get(ctx, id)
	if err != nil {
		return err
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	s.mu.RLock()
	gone := s.sandboxes[id] != e // deleted while we waited for the lock
	s.mu.RUnlock()
	if gone {
		return notFound(id)
	}
	return s.deleteLocked(context.WithoutCancel(ctx), e, "")
}

// deleteLocked removes e; the caller holds e.mu.
func (s *Service) deleteLocked(ctx context.Context, e *entry, reason string) error {
	id := e.sb.ID
	prev := e.sb.Status
	if reason == "" {
		reason = ReasonStopping
	}
	if err := s.transition(e, StateStopping, reason, ""); err != nil {
		return err
	}
	if e.sb.NetworkPolicy != nil && s.deps.Egress != nil {
		if err := s.deps.Egress.Detach(ctx, id); err != nil {
			s.log.Warn("detach egress", "id", id, "err", err)
		}
	}
	if err := s.deps.Runtime.Delete(ctx, id); err != nil {
		s.revert(e, prev)
		return fmt.Errorf("delete sandbox %s: %w", id, err)
	}
	if err := s.deps.Store.Delete(Bucket, id); err != nil {
		// The sandbox is gone; a stale record is reaped by Recover.
		s.log.Error("delete sandbox record", "id", id, "err", err)
	}
	s.mustTransition(e, StateTerminated, reason, "")
	s.mu.Lock()
	delete(s.sandboxes, id)
	s.mu.Unlock()
	s.releaseClaims(ctx, e)
	if !e.sb.Warm {
		s.released(e.sb.Pool, id)
	}
	return nil
}

// Pause freezes a Running sandbox; it returns once it is Paused.
func (s *Service) Pause(ctx context.Context, id string) error {
	return s.freeze(ctx, id, "pause", StatePausing, StatePaused, ReasonPaused, runtime.Pauser.Pause)
}

// Resume thaws a Paused sandbox; it returns once it is Running.
func (s *Service) Resume(ctx context.Context, id string) error {
	return s.freeze(ctx, id, "resume", StateResuming, StateRunning, ReasonRunning, runtime.Pauser.Resume)
}

// freeze is Pause and Resume: the transition into the passing state (which
// the transitions table admits or refuses), the runtime's call, then the
// resting state, or back to the previous status if the runtime failed.
func (s *Service) freeze(ctx context.Context, id, verb string, passing, resting State, reason string,
	call func(runtime.Pauser, context.Context, string) error) error {
	p, ok := s.deps.Runtime.(runtime.Pauser)
	if !ok {
		return errdefs.WithPublic(errdefs.ErrNotImplemented, "SANDBOX::API_NOT_SUPPORTED", "this runtime cannot "+verb+" sandboxes")
	}
	e, err := s.get(ctx, id)
	if err != nil {
		return err
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	prev := e.sb.Status
	if err := s.transition(e, passing, "", ""); err != nil {
		return err
	}
	if err := call(p, context.WithoutCancel(ctx), id); err != nil {
		s.revert(e, prev)
		return fmt.Errorf("%s %s: %w", verb, id, err)
	}
	s.mustTransition(e, resting, reason, "")
	return s.persist(e)
}

// Renew moves the expiry of a sandbox to at, which must be in the future
// and within the server maximum. An earlier time than the current expiry is
// allowed, as upstream's server and spec allow it: a client-side pool makes
// idle sandboxes with a long timeout and renews the borrowed one to now plus
// the borrower's timeout.
func (s *Service) Renew(ctx context.Context, id string, at time.Time) (time.Time, error) {
	e, err := s.get(ctx, id)
	if err != nil {
		return time.Time{}, err
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	return s.renewLocked(e, at)
}

func (s *Service) renewLocked(e *entry, at time.Time) (time.Time, error) {
	at = at.UTC()
	now := s.now()
	if err := admit(e.sb.ID, e.sb.Status.State, opRenew); err != nil {
		return time.Time{}, err
	}
	if e.sb.ExpiresAt == nil {
		return time.Time{}, errdefs.WithPublic(errdefs.ErrFailedPrecondition, "SANDBOX::INVALID_EXPIRATION", "sandbox has no expiration (manual cleanup); it cannot be renewed")
	}
	if !at.After(now) {
		return time.Time{}, errdefs.Invalid("SANDBOX::INVALID_EXPIRATION", "expiresAt must be in the future")
	}
	if s.cfg.MaxTimeout > 0 && at.Sub(now) > s.cfg.MaxTimeout {
		return time.Time{}, errdefs.Invalid("SANDBOX::INVALID_EXPIRATION", fmt.Sprintf("expiresAt exceeds the server maximum of %d seconds from now", int(s.cfg.MaxTimeout.Seconds())))
	}
	prev := e.sb.ExpiresAt
	e.sb.ExpiresAt = &at
	if err := s.persist(e); err != nil {
		e.sb.ExpiresAt = prev
		return time.Time{}, err
	}
	s.record(e.sb.ID, EventRenewed, ScopeLifecycle, "", "expires at "+at.Format(time.RFC3339))
	return at, nil
}

// Touch extends the expiry of a sandbox that opted into renew-on-access
// (extension access.renew.extend.seconds); it is called by proxies on each
// access and is cheap when nothing changes.
func (s *Service) Touch(ctx context.Context, id string) {
	e, err := s.get(ctx, id)
	if err != nil {
		return
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.sb.RenewOnAccess == 0 || e.sb.ExpiresAt == nil {
		return
	}
	want := s.now().Add(time.Duration(e.sb.RenewOnAccess) * time.Second)
	// Write at most once a minute per sandbox.
	if want.Sub(*e.sb.ExpiresAt) < time.Minute {
		return
	}
	if _, err := s.renewLocked(e, want); err != nil {
		s.log.Debug("renew on access", "id", id, "err", err)
	}
}

// PatchMetadata applies a JSON merge patch (nil value = delete key).
func (s *Service) PatchMetadata(ctx context.Context, id string, patch map[string]*string) (Sandbox, error) {
	add := map[string]string{}
	for k, v := range patch {
		if v != nil {
			add[k] = *v
		} else if err := validateLabelKey(k); err != nil {
			return Sandbox{}, err
		}
	}
	if err := ValidateMetadata(add); err != nil {
		return Sandbox{}, err
	}
	e, err := s.get(ctx, id)
	if err != nil {
		return Sandbox{}, err
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if err := admit(id, e.sb.Status.State, opMetadata); err != nil {
		return Sandbox{}, err
	}
	prev := cloneMap(e.sb.Metadata)
	for k, v := range patch {
		if v == nil {
			delete(e.sb.Metadata, k)
		} else {
			e.sb.Metadata[k] = *v
		}
	}
	if len(patch) > 0 {
		if err := s.persist(e); err != nil {
			e.sb.Metadata = prev
			return Sandbox{}, err
		}
	}
	return e.sb.clone(), nil
}

// Endpoint is where a sandbox port can be reached from the server host.
type Endpoint struct {
	// Address is "host:port".
	Address string
	// Headers must be sent with every request (the agent token for the
	// agent port, the secure-access token through the ingress).
	Headers map[string]string
	// AccessToken is the secureAccess token the ingress requires ("" = none).
	AccessToken string
}

// Endpoint resolves a sandbox port.
func (s *Service) Endpoint(ctx context.Context, id string, port int) (Endpoint, error) {
	if port < 1 || port > 65535 {
		return Endpoint{}, errdefs.Invalid("SANDBOX::INVALID_PORT", fmt.Sprintf("port %d is out of range 1-65535", port))
	}
	e, err := s.get(ctx, id)
	if err != nil {
		return Endpoint{}, err
	}
	e.mu.Lock()
	st, token, access := e.sb.Status.State, e.sb.AgentToken, e.sb.AccessToken
	e.mu.Unlock()
	if err := admit(id, st, opEndpoint); err != nil {
		return Endpoint{}, err
	}
	addr, err := s.deps.Runtime.Endpoint(ctx, id, port)
	if err != nil {
		return Endpoint{}, err
	}
	ep := Endpoint{Address: addr, AccessToken: access}
	if port == agentproto.Port && token != "" {
		ep.Headers = map[string]string{agentproto.TokenHeader: token}
	}
	if access != "" {
		if ep.Headers == nil {
			ep.Headers = map[string]string{}
		}
		ep.Headers["OpenSandbox-Secure-Access"] = access
	}
	return ep, nil
}

// AgentToken returns the agent token of a sandbox (for the server proxy).
func (s *Service) AgentToken(ctx context.Context, id string) (string, error) {
	e, err := s.get(ctx, id)
	if err != nil {
		return "", err
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.sb.AgentToken, nil
}

func isTerminal(st State) bool { return st == StateTerminated || st == StateFailed }

// EgressPolicies is the per-sandbox policy service behind the egress API:
// changes are enforced live and saved in the sandbox record, so they
// survive a restart. It serves one request: ctx's tenant scope applies to
// Get (Modify takes its own context).
func (s *Service) EgressPolicies(ctx context.Context) EgressPolicies {
	return EgressPolicies{s: s, ctx: ctx}
}

// EgressPolicies implements egress.PolicyService over the lifecycle.
type EgressPolicies struct {
	s   *Service
	ctx context.Context
}

// Get returns the policy in force on sandbox id.
func (p EgressPolicies) Get(id string) (policy.NetworkPolicy, error) {
	if _, err := p.s.get(p.ctx, id); err != nil {
		return policy.NetworkPolicy{}, err
	}
	if p.s.deps.Egress == nil {
		return policy.NetworkPolicy{}, errdefs.ErrNotFound
	}
	return p.s.deps.Egress.Get(id)
}

// Modify changes the policy of sandbox id and records it.
func (p EgressPolicies) Modify(ctx context.Context, id string, fn func(policy.NetworkPolicy) (policy.NetworkPolicy, error)) (policy.NetworkPolicy, error) {
	e, err := p.s.get(ctx, id)
	if err != nil {
		return policy.NetworkPolicy{}, err
	}
	if p.s.deps.Egress == nil {
		return policy.NetworkPolicy{}, errdefs.ErrNotFound
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	np, err := p.s.deps.Egress.Modify(ctx, id, fn)
	if err != nil {
		return np, err
	}
	e.sb.NetworkPolicy = &np
	return np, p.s.persist(e)
}

// EgressToken returns the egress API token of a sandbox ("" if it has no policy).
func (s *Service) EgressToken(ctx context.Context, id string) (string, error) {
	e, err := s.get(ctx, id)
	if err != nil {
		return "", err
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.sb.NetworkPolicy == nil {
		return "", nil
	}
	return e.sb.EgressToken, nil
}

// Package lifecycle is the sandbox core behind the Lifecycle API: the
// sandbox table, the state machine, create/get/list/delete, pause/resume,
// expiry (the TTL reaper), metadata, endpoints, events, the quota ledger
// and re-adoption of sandboxes after a server restart. It knows nothing
// about HTTP. Pools, snapshots, named volumes and the Credential Vault are
// feature packages beneath it that plug in through Features (feature.go);
// internal/sandbox wires them.
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
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/moat-sandbox/moat/internal/agentproto"
	"github.com/moat-sandbox/moat/internal/egress/policy"
	"github.com/moat-sandbox/moat/internal/errdefs"
	"github.com/moat-sandbox/moat/internal/image"
	"github.com/moat-sandbox/moat/internal/runtime"
	"github.com/moat-sandbox/moat/internal/store"
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
	Log    *slog.Logger
	// HTTP is used to ping agents; default a client with short timeouts.
	HTTP *http.Client
	// Now is the clock; default time.Now.
	Now func() time.Time
	// Metrics is optional; nil records nothing.
	Metrics Metrics
	// Quotas is optional; nil limits no tenant (see tenancy.go).
	Quotas Quotas
	// Guardrails is optional; nil: no tenant egress guardrails.
	Guardrails Guardrails
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

// Entry is one sandbox of the table with its lock. The lock serializes
// operations on the sandbox; Service.mu only guards the map. Features get
// entries from the core (hooks, WithLock, Each, Insert) and call the
// methods that need the lock only while they hold it.
type Entry struct {
	svc *Service
	mu  sync.Mutex
	sb  Sandbox
	// owner is sb.Tenant, fixed when the entry is made (a sandbox never
	// changes tenant), so that lookups check it without e.mu.
	owner string
	// failedAt is set for sandboxes that failed to create (not persisted).
	failedAt time.Time
	// claims are the names of the named volumes the sandbox mounts. Set
	// before the entry is published and never changed, so ClaimUsers
	// reads it without mu.
	claims []string
	// done is set while the sandbox is Failed or Terminated (its runtime
	// resources are gone): it no longer counts as a user of its volumes.
	// applyState keeps it current.
	done atomic.Bool
	// values are the features' state of this sandbox (not persisted),
	// keyed like context values. Guarded by mu.
	values map[any]any
	// stored is set once the record is in the store: later writes update
	// it and never create it again (another replica may have deleted
	// it). Guarded by mu.
	stored bool
	// ended is closed once the sandbox has ended (exit.go); made on
	// first use. Guarded by mu. endedWith is the status it ended with,
	// set before the close.
	ended     chan struct{}
	endedWith Status
}

// Service is the lifecycle service. It is safe for concurrent use.
type Service struct {
	cfg  Config
	deps Deps
	log  *slog.Logger

	// mu guards the table (sandboxes); each entry has its own lock, taken
	// before mu (see Entry and the lock order in feature.go).
	mu        sync.RWMutex
	sandboxes map[string]*Entry

	// features are the feature packages plugged in by Use.
	features Features

	// wg counts the background loops (follow); closing stops them.
	wg      sync.WaitGroup
	closing chan struct{}
	closed  sync.Once

	// events is every sandbox's event ring (events.go).
	events *eventLog

	// quota charges live sandboxes to their tenants (tenancy.go).
	quota *Ledger

	// wakeHooks are called after a wake from hibernation (hibernate.go);
	// guarded by mu.
	wakeHooks []func(id string)
}

// New returns a service. Plug in its features (Use), call Recover before
// serving, and Run to start the reaper.
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
	s := &Service{cfg: cfg, deps: deps, log: deps.Log, sandboxes: map[string]*Entry{},
		closing: make(chan struct{}), quota: newLedger(deps.Quotas)}
	s.events = newEventLog(deps.Events, s.Now, deps.Log)
	return s, nil
}

// Close stops the background loops (sandboxes keep running). Close the
// features first.
func (s *Service) Close() {
	s.closed.Do(func() { close(s.closing) })
	s.wg.Wait()
	s.events.flush()
}

// newEntry wraps a sandbox record.
func newEntry(s *Service, sb Sandbox) *Entry {
	e := &Entry{svc: s, sb: sb, owner: sb.Tenant}
	for _, c := range sb.Claims {
		e.claims = append(e.claims, c.Name)
	}
	e.done.Store(isTerminal(sb.Status.State))
	return e
}

// get returns the entry of sandbox id, if ctx's tenant scope sees it. A
// sandbox of another tenant, like an idle pool sandbox, is not found.
func (s *Service) get(ctx context.Context, id string) (*Entry, error) {
	s.mu.RLock()
	e := s.sandboxes[id]
	s.mu.RUnlock()
	if e == nil || !Visible(ctx, e.owner) {
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
func (e *Entry) persist() error {
	s := e.svc
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
	defer func(start time.Time) {
		if s.deps.Metrics != nil && err == nil {
			s.deps.Metrics.ObserveCreate(time.Since(start))
		}
	}(time.Now())
	if name := req.Extensions[ExtPoolRef]; name != "" {
		if len(req.Volumes) > 0 || req.HasVolumes {
			return Sandbox{}, errdefs.Invalid(CodeInvalidVolume, "volumes cannot be added to a pooled sandbox")
		}
		sbs, err := s.fromPool(ctx, req, name, 1)
		if err != nil {
			return Sandbox{}, err
		}
		return sbs[0], nil
	}
	sb, err := s.Validate(ctx, req)
	if err != nil {
		return Sandbox{}, err
	}
	Own(&sb, OwnerOf(ctx))
	if err := s.quota.Admit(sb.Tenant, []string{sb.ID}, sb.Resources.CPUMillis, sb.Resources.MemoryBytes); err != nil {
		return Sandbox{}, err
	}
	e := s.Insert(sb)
	defer e.mu.Unlock()

	// Provisioning continues even if the client goes away, so that it ends
	// in a definite state instead of a half-made sandbox.
	ctx = context.WithoutCancel(ctx)
	if err := e.provision(ctx, req.ImageAuth); err != nil {
		return e.sb.clone(), err
	}
	return e.sb.clone(), nil
}

// PublicCause returns the client-safe text of err's Public wrapper, if any.
func PublicCause(err error) string {
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

// attachEgress starts enforcing p on sandbox id, whose address is ipStr.
func attachEgress(ctx context.Context, eg Egress, id, ipStr string, p policy.NetworkPolicy) error {
	ip, err := netip.ParseAddr(ipStr)
	if err != nil {
		return fmt.Errorf("sandbox %s has no usable address %q for egress: %w", id, ipStr, errdefs.ErrFailedPrecondition)
	}
	return eg.Attach(ctx, id, ip, p)
}

func (e *Entry) cleanupFailed(ctx context.Context) {
	s, id := e.svc, e.sb.ID
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

func (e *Entry) fail(reason, msg string) {
	e.mustTransition(StateFailed, reason, msg)
	e.failedAt = e.svc.Now()
}

// waitAgent polls the agent's /ping until it answers 200 (within
// AgentReadyTimeout). Agents of every protocol version since
// agentproto.MinVersion are accepted: a sandbox whose agent came from an
// older moat is driven as before.
func (e *Entry) waitAgent(ctx context.Context, token string) error {
	s, id := e.svc, e.sb.ID
	ctx, cancel := context.WithTimeout(ctx, s.cfg.AgentReadyTimeout)
	defer cancel()
	ep, err := s.deps.Runtime.Endpoint(ctx, id, agentproto.Port)
	if err != nil {
		return err
	}
	if _, err := agentClient(s.deps).WaitReady(ctx, ep, token); err != nil {
		return fmt.Errorf("agent of %s: %w", id, err)
	}
	return nil
}

// agentClient is the client of the sandbox agents.
func agentClient(d Deps) *agentproto.Client { return &agentproto.Client{HTTP: d.HTTP} }

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
	entries := make([]*Entry, 0, len(s.sandboxes))
	for _, e := range s.sandboxes {
		entries = append(entries, e)
	}
	s.mu.RUnlock()
	var out []Sandbox
	for _, e := range entries {
		if !Visible(ctx, e.owner) {
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
	return e.delete(context.WithoutCancel(ctx), "")
}

// delete removes e; the caller holds e.mu.
func (e *Entry) delete(ctx context.Context, reason string) error {
	s := e.svc
	id := e.sb.ID
	prev := e.sb.Status
	if reason == "" {
		reason = ReasonStopping
	}
	if err := e.transition(StateStopping, reason, ""); err != nil {
		return err
	}
	if e.sb.EgressToken != "" && s.deps.Egress != nil {
		if err := s.deps.Egress.Detach(ctx, id); err != nil {
			s.log.Warn("detach egress", "id", id, "err", err)
		}
	}
	if err := s.deps.Runtime.Delete(ctx, id); err != nil {
		e.revert(prev)
		return fmt.Errorf("delete sandbox %s: %w", id, err)
	}
	if err := s.deps.Store.Delete(Bucket, id); err != nil {
		// The sandbox is gone; a stale record is reaped by Recover.
		s.log.Error("delete sandbox record", "id", id, "err", err)
	}
	e.mustTransition(StateTerminated, reason, "")
	s.mu.Lock()
	delete(s.sandboxes, id)
	s.mu.Unlock()
	if s.features.Volumes != nil {
		s.features.Volumes.Release(ctx, e)
	}
	if !e.sb.Warm {
		s.released(e.sb.Pool, id)
	}
	return nil
}

// Pause freezes a Running sandbox; it returns once it is Paused.
func (s *Service) Pause(ctx context.Context, id string) error {
	return s.freeze(ctx, id, "pause", func(e *Entry) error { return e.pause(ctx, ReasonPaused, "") })
}

// Resume thaws a Paused sandbox; it returns once it is Running.
func (s *Service) Resume(ctx context.Context, id string) error {
	return s.freeze(ctx, id, "resume", func(e *Entry) error { return e.resume(ctx, "", "") })
}

// freeze is Pause and Resume of sandbox id: fn with its lock held, if the
// runtime can freeze sandboxes at all.
func (s *Service) freeze(ctx context.Context, id, verb string, fn func(e *Entry) error) error {
	if _, err := s.pauser(verb); err != nil {
		return err
	}
	e, err := s.get(ctx, id)
	if err != nil {
		return err
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	return fn(e)
}

// pauser is the runtime's Pauser; ErrNotImplemented (it cannot verb) if
// it has none.
func (s *Service) pauser(verb string) (runtime.Pauser, error) {
	p, ok := s.deps.Runtime.(runtime.Pauser)
	if !ok {
		return nil, errdefs.WithPublic(errdefs.ErrNotImplemented, "SANDBOX::API_NOT_SUPPORTED", "this runtime cannot "+verb+" sandboxes")
	}
	return p, nil
}

// pause freezes e; the Paused status carries reason and msg (why). The
// caller holds e.mu.
func (e *Entry) pause(ctx context.Context, reason, msg string) error {
	return e.freeze(ctx, "pause", StatePausing, "", "", StatePaused, reason, msg, runtime.Pauser.Pause)
}

// resume thaws e; the Resuming status carries reason and msg (why: a
// wake, ReasonWaking, records Woken instead of Resumed). The caller holds
// e.mu.
func (e *Entry) resume(ctx context.Context, reason, msg string) error {
	from := e.sb.Status.Reason
	if err := e.freeze(ctx, "resume", StateResuming, reason, msg, StateRunning, ReasonRunning, "", runtime.Pauser.Resume); err != nil {
		return err
	}
	if from == ReasonHibernated || from == ReasonIdleHibernated {
		e.svc.wokeFromHibernation(e.sb.ID)
	}
	return nil
}

// freeze is pause and resume: the transition into the passing state (which
// the transitions table admits or refuses), the runtime's call, then the
// resting state, or back to the previous status if the runtime failed.
func (e *Entry) freeze(ctx context.Context, verb string, passing State, preason, pmsg string, resting State, reason, msg string,
	call func(runtime.Pauser, context.Context, string) error) error {
	p, err := e.svc.pauser(verb)
	if err != nil {
		return err
	}
	prev := e.sb.Status
	if err := e.transition(passing, preason, pmsg); err != nil {
		return err
	}
	if err := call(p, context.WithoutCancel(ctx), e.sb.ID); err != nil {
		e.revert(prev)
		return fmt.Errorf("%s %s: %w", verb, e.sb.ID, err)
	}
	e.mustTransition(resting, reason, msg)
	return e.persist()
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
	return e.renew(at)
}

func (e *Entry) renew(at time.Time) (time.Time, error) {
	s := e.svc
	at = at.UTC()
	now := s.Now()
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
	if err := e.persist(); err != nil {
		e.sb.ExpiresAt = prev
		return time.Time{}, err
	}
	s.events.record(e.sb.ID, EventRenewed, ScopeLifecycle, "", "expires at "+at.Format(time.RFC3339))
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
	want := s.Now().Add(time.Duration(e.sb.RenewOnAccess) * time.Second)
	// Write at most once a minute per sandbox.
	if want.Sub(*e.sb.ExpiresAt) < time.Minute {
		return
	}
	if _, err := e.renew(want); err != nil {
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
		if err := e.persist(); err != nil {
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
	// Ended is closed once the sandbox has ended (Failed or Terminated):
	// connections to Address are dead from then on, even those the dead
	// sandbox can no longer reset (a gVisor sandbox's network stack dies
	// with it), so a proxy ends them.
	Ended <-chan struct{}
	// EndStatus is the status the sandbox ended with (why it ended); call
	// it only once Ended is closed.
	EndStatus func() Status
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
	status, token, access, ended := e.sb.Status, e.sb.AgentToken, e.sb.AccessToken, e.endedLocked()
	e.mu.Unlock()
	if err := admit(id, status.State, opEndpoint); err != nil {
		return Endpoint{}, endedError(id, status, err)
	}
	addr, err := s.deps.Runtime.Endpoint(ctx, id, port)
	if err != nil {
		return Endpoint{}, err
	}
	ep := Endpoint{Address: addr, AccessToken: access, Ended: ended, EndStatus: e.endStatus}
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

// Get returns sandbox id's own policy (allow-all when it has none: it is
// filtered by its tenant's guardrail only).
func (p EgressPolicies) Get(id string) (policy.NetworkPolicy, error) {
	l, err := p.Layers(id)
	return l.Own, err
}

// Layers returns sandbox id's own policy, its tenant's guardrail and the
// effective policy in force.
func (p EgressPolicies) Layers(id string) (policy.Layers, error) {
	e, err := p.s.get(p.ctx, id)
	if err != nil {
		return policy.Layers{}, err
	}
	if p.s.deps.Egress == nil {
		return policy.Layers{}, errdefs.ErrNotFound
	}
	eff, err := p.s.deps.Egress.Get(id)
	if err != nil {
		return policy.Layers{}, err
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	l := policy.Layers{Own: policy.AllowAll(), Effective: eff}
	if e.sb.NetworkPolicy != nil {
		l.Own = e.sb.NetworkPolicy.Clone()
	}
	l.Tenant = p.s.EgressGuardrail(e.owner)
	return l, nil
}

// Modify changes the own policy of sandbox id (fn gets the current one),
// enforces it under the tenant's guardrail and records it.
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
	own := policy.AllowAll()
	if e.sb.NetworkPolicy != nil {
		own = e.sb.NetworkPolicy.Clone()
	}
	next, err := fn(own)
	if err != nil {
		return next, err
	}
	if next, err = policy.Normalize(next); err != nil {
		return next, err
	}
	eff, err := p.s.effective(e.owner, &next)
	if err != nil {
		return next, err
	}
	if _, err := p.s.deps.Egress.Modify(ctx, id, func(policy.NetworkPolicy) (policy.NetworkPolicy, error) { return *eff, nil }); err != nil {
		return next, err
	}
	e.sb.NetworkPolicy = &next
	return next, e.persist()
}

// EgressToken returns the egress API token of a sandbox ("" if it is not
// filtered).
func (s *Service) EgressToken(ctx context.Context, id string) (string, error) {
	e, err := s.get(ctx, id)
	if err != nil {
		return "", err
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.sb.EgressToken, nil // "" unless filtered (its own policy or its tenant's guardrail)
}

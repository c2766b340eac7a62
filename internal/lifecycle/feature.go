package lifecycle

import (
	"context"
	"slices"
	"sort"
	"time"

	"github.com/moat-sandbox/moat/internal/egress/policy"
	"github.com/moat-sandbox/moat/internal/image"
	"github.com/moat-sandbox/moat/internal/runtime"
)

// Features. Pools, snapshots, named volumes and the Credential Vault are
// packages of their own (internal/lifecycle/...) that own their state and
// their lock; the core drives them through the interfaces below, which
// Use registers, and they reach the sandboxes through the core's exported
// operations (WithLock, Each, Insert, Entry's methods). A feature left out
// (nil) refuses what needs it.
//
// Lock order: a sandbox's lock (Entry) before a feature's lock before
// Service.mu. A feature never waits for a sandbox's lock while it holds
// its own (it may TryLock), and the core calls a hook with at most the
// lock of the sandbox the hook is about.

// Features are the feature packages plugged into the core.
type Features struct {
	Pools     Pools
	Snapshots Snapshots
	Volumes   Volumes
	Vault     CredentialProxies
	Idle      IdlePolicies
}

// Pools is the warm-pool feature as the core drives it.
type Pools interface {
	// CreateFromPool serves a create (n = 1) or a batch of n whose
	// extensions name pool name (ExtPoolRef).
	CreateFromPool(ctx context.Context, req CreateRequest, name string, n int) ([]Sandbox, error)
	// Released tells pool key (Sandbox.Pool) that its claimed sandbox id
	// is gone. Called without any sandbox's lock held.
	Released(key, id string)
	// Recover hands the recovered sandboxes back to their pools; Recover
	// calls it once every record is in the table.
	Recover(ctx context.Context) error
}

// SnapshotSource is a snapshot a new sandbox is created from.
type SnapshotSource struct {
	ID string
	// Image is the snapshot's image (empty in old records: the image
	// store's SnapshotImagePrefix + ID).
	Image string
	// Memory is set when the snapshot holds the processes (a runtime
	// checkpoint named ID) of a Class sandbox running Entrypoint, whose
	// agent answers to AgentToken until the core rotates it.
	Memory     bool
	Class      string
	Entrypoint []string
	AgentToken string
}

// Snapshots is the snapshot feature as the core's create sees it.
type Snapshots interface {
	// Source returns snapshot id for a create in ctx's tenant scope, if
	// it is Ready.
	Source(ctx context.Context, id string) (SnapshotSource, error)
	// Restore returns snapshot id whatever its state and tenant, for the
	// provisioning of a validated create; ok is false if it is gone.
	Restore(id string) (src SnapshotSource, ok bool)
}

// Volumes is the named-volume feature as the core drives it.
type Volumes interface {
	// Mounts validates the volumes of a create request and returns the
	// sandbox's mounts and the named volumes (claims) they use.
	Mounts(req CreateRequest) ([]runtime.Mount, []Claim, error)
	// Ensure makes the claims of sandbox e exist, first in a create.
	// The caller holds e's lock.
	Ensure(ctx context.Context, e *Entry) error
	// Abort undoes Ensure after a failed create (e is Failed). The caller
	// holds e's lock.
	Abort(ctx context.Context, e *Entry)
	// Release removes the volumes of sandbox e once it is deleted (out of
	// the table, Terminated). The caller holds e's lock.
	Release(ctx context.Context, e *Entry)
}

// CredentialProxies is the Credential Vault feature as the core drives it.
type CredentialProxies interface {
	// Check validates credentialProxy of a create request; np is its
	// parsed network policy, memory whether it restores a memory snapshot.
	Check(req CreateRequest, np *policy.NetworkPolicy, memory bool) error
	// Prepare makes sandbox e's CA (if it has a credential proxy) and
	// returns env with what its processes need to trust it. The caller
	// holds e's lock.
	Prepare(e *Entry, env map[string]string) (map[string]string, error)
	// Attach starts sandbox e's proxy once its egress policy is attached;
	// a no-op without a credential proxy. The caller holds e's lock.
	Attach(ctx context.Context, e *Entry) error
	// Recover restarts the proxy of a recovered sandbox. The caller
	// holds e's lock.
	Recover(ctx context.Context, e *Entry) error
}

// IdlePolicies is the idle-policy feature as the core's create sees it.
type IdlePolicies interface {
	// CheckPolicy validates the idle policy in the extensions of sb, a
	// new sandbox's record (its class chosen).
	CheckPolicy(sb *Sandbox) error
}

// Use plugs features into the service. Call it once, before Recover.
func (s *Service) Use(f Features) { s.features = f }

// WithLock runs fn with sandbox id locked, if ctx's tenant scope sees it
// (an idle pool sandbox is not found).
func (s *Service) WithLock(ctx context.Context, id string, fn func(e *Entry) error) error {
	e, err := s.get(ctx, id)
	if err != nil {
		return err
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	return fn(e)
}

// Each runs fn on every sandbox of the table (idle pool sandboxes too),
// each with its lock held, one at a time.
func (s *Service) Each(fn func(e *Entry)) {
	s.mu.RLock()
	entries := make([]*Entry, 0, len(s.sandboxes))
	for _, e := range s.sandboxes {
		entries = append(entries, e)
	}
	s.mu.RUnlock()
	for _, e := range entries {
		e.mu.Lock()
		fn(e)
		e.mu.Unlock()
	}
}

// TryEach runs fn on every sandbox of the table (idle pool sandboxes too)
// whose lock is free, with its lock held, one at a time: a busy sandbox
// is skipped (a background pass looks again on its next round).
func (s *Service) TryEach(fn func(e *Entry)) {
	s.mu.RLock()
	entries := make([]*Entry, 0, len(s.sandboxes))
	for _, e := range s.sandboxes {
		entries = append(entries, e)
	}
	s.mu.RUnlock()
	for _, e := range entries {
		if !e.mu.TryLock() {
			continue
		}
		fn(e)
		e.mu.Unlock()
	}
}

// ClaimUsers returns the IDs of the live sandboxes (not Failed or
// Terminated) that mount named volume name, sorted. It takes no
// sandbox's lock, so a caller may hold one.
func (s *Service) ClaimUsers(name string) []string {
	s.mu.RLock()
	defer s.mu.RUnlock()
	var out []string
	for id, e := range s.sandboxes {
		if !e.done.Load() && slices.Contains(e.claims, name) {
			out = append(out, id)
		}
	}
	sort.Strings(out)
	return out
}

// Insert puts a new sandbox record (validated and owned) in the table and
// returns its entry, locked: the caller provisions it (Entry.Provision)
// and unlocks it.
func (s *Service) Insert(sb Sandbox) *Entry {
	e := newEntry(s, sb)
	e.mu.Lock()
	s.put(e)
	return e
}

// Quota is the tenants' quota ledger.
func (s *Service) Quota() *Ledger { return s.quota }

// Now is the service's clock, in UTC.
func (s *Service) Now() time.Time { return s.deps.Now().UTC() }

// Lock takes e's lock.
func (e *Entry) Lock() { e.mu.Lock() }

// TryLock takes e's lock if it is free.
func (e *Entry) TryLock() bool { return e.mu.TryLock() }

// Unlock releases e's lock.
func (e *Entry) Unlock() { e.mu.Unlock() }

// ID is the sandbox's id (fixed: it needs no lock).
func (e *Entry) ID() string { return e.sb.ID }

// Owner is the sandbox's tenant (fixed: it needs no lock).
func (e *Entry) Owner() string { return e.owner }

// Sandbox is the record; changes stay in memory until Persist. The
// caller holds e's lock.
func (e *Entry) Sandbox() *Sandbox { return &e.sb }

// Value returns the state feature key keeps for the sandbox (nil: none).
// The caller holds e's lock.
func (e *Entry) Value(key any) any { return e.values[key] }

// SetValue sets the state feature key keeps for the sandbox (not
// persisted; it lives as long as the entry). The caller holds e's lock.
func (e *Entry) SetValue(key, v any) {
	if e.values == nil {
		e.values = map[any]any{}
	}
	e.values[key] = v
}

// Provision runs the create steps of a new entry (Insert). On failure
// every runtime resource is released and e is left Failed. The caller
// holds e's lock.
func (e *Entry) Provision(ctx context.Context, auth *image.Auth) error {
	return e.provision(ctx, auth)
}

// Forget removes e from the table without touching the runtime (a warm
// create that failed). The caller holds e's lock.
func (e *Entry) Forget() {
	s := e.svc
	s.mu.Lock()
	if s.sandboxes[e.sb.ID] == e {
		delete(s.sandboxes, e.sb.ID)
	}
	s.mu.Unlock()
}

// Delete stops the sandbox and frees everything it holds (reason "":
// a delete request). The caller holds e's lock.
func (e *Entry) Delete(ctx context.Context, reason string) error {
	return e.delete(ctx, reason)
}

// Pause freezes Running sandbox e; its Paused status carries reason and
// msg (why). The caller holds e's lock.
func (e *Entry) Pause(ctx context.Context, reason, msg string) error {
	return e.pause(ctx, reason, msg)
}

// Resume thaws Paused sandbox e; its Resuming status carries reason and
// msg (ReasonWaking: a wake, recorded as EventWoken). The caller holds e's
// lock.
func (e *Entry) Resume(ctx context.Context, reason, msg string) error {
	return e.resume(ctx, reason, msg)
}

// Persist writes e's record to the store. The caller holds e's lock.
func (e *Entry) Persist() error { return e.persist() }

// Deps are the service's collaborators, with their defaults (for the
// features, which share them).
func (s *Service) Deps() Deps { return s.deps }

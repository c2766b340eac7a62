// Package pool is the warm pools of sandboxes: pool definitions, the idle
// sandboxes each keeps (refilled in the background within its capacity),
// the claims that turn idle sandboxes into ordinary ones, and the pools a
// runtime keeps itself (runtime.Pools, the kubernetes runtime). It plugs
// into the lifecycle core as lifecycle.Pools.
package pool

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"regexp"
	"sort"
	"sync"
	"time"

	"github.com/moat-sandbox/moat/internal/errdefs"
	"github.com/moat-sandbox/moat/internal/lifecycle"
	"github.com/moat-sandbox/moat/internal/store"
	"github.com/moat-sandbox/moat/internal/tenant"
)

// PoolBucket is the store bucket holding pool definitions.
const PoolBucket = "pools"

// PoolTemplate is what every sandbox of a pool is created from.
type PoolTemplate struct {
	Image string `json:"image,omitempty"`
	// SnapshotID makes a fork pool: its sandboxes start from the snapshot
	// (exclusive with Image), so forking N from it is a warm claim.
	SnapshotID     string            `json:"snapshotId,omitempty"`
	Entrypoint     []string          `json:"entrypoint"`
	Env            map[string]string `json:"env,omitempty"`
	ResourceLimits map[string]string `json:"resourceLimits,omitempty"`
	Extensions     map[string]string `json:"extensions,omitempty"`
	// Volumes are mounted by every sandbox of the pool: a pvc claim is
	// shared by all of them (and counts as in use while the pool holds
	// warm sandboxes).
	Volumes []lifecycle.Volume `json:"volumes,omitempty"`
}

// request is the create request of one pool sandbox.
func (t PoolTemplate) request() lifecycle.CreateRequest {
	return lifecycle.CreateRequest{Image: t.Image, SnapshotID: t.SnapshotID, Entrypoint: t.Entrypoint, Env: t.Env,
		ResourceLimits: t.ResourceLimits, Extensions: t.Extensions, Volumes: t.Volumes, HasVolumes: len(t.Volumes) > 0}
}

// Capacity bounds a pool, with OpenSandbox's capacitySpec names: the idle
// (warm) buffer is refilled to BufferMax whenever it falls below
// BufferMin, the pool never holds more than PoolMax sandboxes in all
// (idle + claimed), and at least PoolMin exist.
type Capacity struct {
	BufferMin int `json:"bufferMin"`
	BufferMax int `json:"bufferMax"`
	PoolMin   int `json:"poolMin"`
	PoolMax   int `json:"poolMax"`
}

// Pool is a named warm pool definition.
type Pool struct {
	Name      string       `json:"name"`
	Template  PoolTemplate `json:"template"`
	Capacity  Capacity     `json:"capacitySpec"`
	CreatedAt time.Time    `json:"createdAt"`
	// Revision changes whenever the template changes; idle sandboxes of an
	// older revision are replaced.
	Revision int `json:"revision"`
	// Tenant owns the pool and its sandboxes ("" in records from before
	// tenants: the default tenant). Pool names are per tenant.
	Tenant string `json:"tenant,omitempty"`
	// Refilling is the server's own state, not part of the definition: a
	// refill toward BufferMax is under way (it started when the buffer fell
	// below BufferMin). It is persisted whenever it changes, so a server
	// restarted in the middle of a refill finishes it instead of stopping
	// anywhere between BufferMin and BufferMax.
	Refilling bool `json:"refilling,omitempty"`
}

// key is the pool's key in Pools.pools, in the store and in its
// sandboxes' Sandbox.Pool: the name for the default tenant (as before
// tenants), "<tenant>/<name>" for others (names are DNS labels, so the
// two forms cannot collide).
func (p Pool) key() string { return poolKey(p.Tenant, p.Name) }

func poolKey(owner, name string) string {
	if owner = tenant.Normalize(owner); owner == tenant.Default {
		return name
	}
	return owner + "/" + name
}

// PoolStatus counts a pool's sandboxes.
type PoolStatus struct {
	Total     int `json:"total"`
	Allocated int `json:"allocated"`
	Available int `json:"available"`
	Revision  int `json:"revision"`
}

// Pools is the pools feature. It is safe for concurrent use.
//
// Lock order: a sandbox's lock before a pool's mu before Pools.mu
// (pools); a pool's mu is held across no call into the core but TryLock
// (refill). The refill loops run until the pool is deleted or Close.
type Pools struct {
	core *lifecycle.Service
	deps lifecycle.Deps
	log  *slog.Logger

	mu    sync.Mutex
	pools map[string]*pool

	wg      sync.WaitGroup
	closing chan struct{}
	closed  sync.Once
}

// New returns the pools feature of core; Recover (through the core's)
// loads the pools.
func New(core *lifecycle.Service) *Pools {
	deps := core.Deps()
	return &Pools{core: core, deps: deps, log: deps.Log, pools: map[string]*pool{}, closing: make(chan struct{})}
}

// Close stops the refill loops (the sandboxes stay).
func (s *Pools) Close() {
	s.closed.Do(func() { close(s.closing) })
	s.wg.Wait()
}

// pool is the in-memory state of one pool. idle holds warm, unclaimed
// sandboxes (hidden from the Lifecycle API); allocated counts claimed ones
// still alive; creating counts warm creates in flight.
type pool struct {
	mu        sync.Mutex
	owner     string // def.Tenant, fixed
	def       Pool
	idle      []*lifecycle.Entry
	allocated map[string]bool
	creating  int
	reserved  int            // cold creates a claim has room for, until they join
	inflight  sync.WaitGroup // warm creates in progress
	wake      chan struct{}
	stop      chan struct{}
	deleted   bool
	settle    *time.Timer // the refill after claims (pokeAfterClaimLocked)
	settling  bool        // settle is pending: no refill starts before it fires
}

var poolNameRe = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$`)

const maxPoolSize = 10000

func (s *Pools) validatePool(ctx context.Context, p *Pool) error {
	if !poolNameRe.MatchString(p.Name) {
		return errdefs.Invalid("POOL::INVALID_NAME", "pool name must be a DNS label (lowercase alphanumerics and '-', at most 63)")
	}
	c := p.Capacity
	if c.BufferMin < 0 || c.BufferMax < 0 || c.PoolMin < 0 || c.PoolMax < 0 {
		return errdefs.Invalid("POOL::INVALID_CAPACITY", "capacitySpec values must not be negative")
	}
	if c.BufferMin > c.BufferMax {
		return errdefs.Invalid("POOL::INVALID_CAPACITY", "capacitySpec.bufferMin must not exceed bufferMax")
	}
	if c.PoolMax == 0 || c.PoolMax > maxPoolSize || c.PoolMin > c.PoolMax || c.BufferMax > c.PoolMax {
		return errdefs.Invalid("POOL::INVALID_CAPACITY", fmt.Sprintf("capacitySpec needs poolMin <= poolMax, bufferMax <= poolMax and 1 <= poolMax <= %d", maxPoolSize))
	}
	// The template must be a valid create request on its own.
	sb, err := s.core.Validate(ctx, p.Template.request())
	if err != nil {
		return err
	}
	return s.poolWithinQuota(ctx, p, sb)
}

// poolWithinQuota refuses a pool whose idle sandboxes alone could exceed
// its tenant's quota: idle sandboxes are not charged until claimed, so
// without this bound a pool would hold resources beyond the quota.
func (s *Pools) poolWithinQuota(ctx context.Context, p *Pool, sb lifecycle.Sandbox) error {
	if s.deps.Quotas == nil {
		return nil
	}
	owner := lifecycle.OwnerOf(ctx)
	idle := max(p.Capacity.BufferMax, p.Capacity.PoolMin)
	if err := s.deps.Quotas.Quota(owner).Admit(owner, tenant.Usage{}, idle, sb.Resources.CPUMillis, sb.Resources.MemoryBytes); err != nil {
		if pub, ok := errdefs.PublicOf(err); ok && pub.Code == tenant.CodeQuotaExceeded {
			return errdefs.WithPublic(err, tenant.CodeQuotaExceeded, fmt.Sprintf("pool %s may keep %d idle sandboxes (max of bufferMax and poolMin), more than the quota allows: %s", p.Name, idle, pub.Message))
		}
		return err
	}
	return nil
}

// CreatePool defines a pool and starts filling it.
func (s *Pools) CreatePool(ctx context.Context, p Pool) (Pool, error) {
	if err := s.validatePool(ctx, &p); err != nil {
		return Pool{}, err
	}
	if rp := s.runtimePools(); rp != nil {
		return s.createRuntimePool(ctx, rp, p)
	}
	p.Tenant = lifecycle.OwnerOf(ctx)
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.pools[p.key()]; ok {
		return Pool{}, errdefs.WithPublic(fmt.Errorf("pool %q: %w", p.Name, errdefs.ErrAlreadyExists), "POOL::ALREADY_EXISTS", fmt.Sprintf("pool %s already exists", p.Name))
	}
	p.CreatedAt = s.core.Now()
	p.Revision = 1
	if err := s.deps.Store.Put(PoolBucket, p.key(), &p); err != nil {
		return Pool{}, err
	}
	s.startPool(p, nil, nil)
	return p, nil
}

// UpdatePool replaces a pool's template and capacity. Idle sandboxes of the
// old template are replaced in the background; claimed ones are untouched.
func (s *Pools) UpdatePool(ctx context.Context, p Pool) (Pool, error) {
	if err := s.validatePool(ctx, &p); err != nil {
		return Pool{}, err
	}
	if rp := s.runtimePools(); rp != nil {
		return s.updateRuntimePool(ctx, rp, p)
	}
	pl, err := s.getPool(ctx, p.Name)
	if err != nil {
		return Pool{}, err
	}
	pl.mu.Lock()
	p.Tenant = pl.def.Tenant
	p.CreatedAt = pl.def.CreatedAt
	p.Revision = pl.def.Revision
	p.Refilling = pl.def.Refilling
	if !templateEqual(p.Template, pl.def.Template) {
		p.Revision++
	}
	if err := s.deps.Store.Put(PoolBucket, p.key(), &p); err != nil {
		pl.mu.Unlock()
		return Pool{}, err
	}
	pl.def = p
	pl.mu.Unlock()
	pl.poke()
	return p, nil
}

func templateEqual(a, b PoolTemplate) bool {
	return a.Image == b.Image && fmt.Sprint(a.Entrypoint) == fmt.Sprint(b.Entrypoint) &&
		fmt.Sprint(a.Env) == fmt.Sprint(b.Env) && fmt.Sprint(a.ResourceLimits) == fmt.Sprint(b.ResourceLimits) &&
		fmt.Sprint(a.Extensions) == fmt.Sprint(b.Extensions) && a.SnapshotID == b.SnapshotID && volumesEqual(a.Volumes, b.Volumes)
}

func volumesEqual(a, b []lifecycle.Volume) bool {
	ja, _ := json.Marshal(a)
	jb, _ := json.Marshal(b)
	return string(ja) == string(jb)
}

// GetPool returns a pool and its counts.
func (s *Pools) GetPool(ctx context.Context, name string) (Pool, PoolStatus, error) {
	if rp := s.runtimePools(); rp != nil {
		return s.getRuntimePool(ctx, rp, name)
	}
	pl, err := s.getPool(ctx, name)
	if err != nil {
		return Pool{}, PoolStatus{}, err
	}
	pl.mu.Lock()
	defer pl.mu.Unlock()
	return pl.def, pl.statusLocked(), nil
}

// ListPools returns every pool ctx's tenant scope sees, by tenant and name.
func (s *Pools) ListPools(ctx context.Context) ([]Pool, []PoolStatus) {
	if rp := s.runtimePools(); rp != nil {
		return s.listRuntimePools(ctx, rp)
	}
	s.mu.Lock()
	pls := make([]*pool, 0, len(s.pools))
	for _, pl := range s.pools {
		if lifecycle.Visible(ctx, pl.owner) {
			pls = append(pls, pl)
		}
	}
	s.mu.Unlock()
	defs := make([]Pool, len(pls))
	sts := make([]PoolStatus, len(pls))
	for i, pl := range pls {
		pl.mu.Lock()
		defs[i], sts[i] = pl.def, pl.statusLocked()
		pl.mu.Unlock()
	}
	idx := make([]int, len(pls))
	for i := range idx {
		idx[i] = i
	}
	sort.Slice(idx, func(a, b int) bool { return defs[idx[a]].key() < defs[idx[b]].key() })
	outD, outS := make([]Pool, len(idx)), make([]PoolStatus, len(idx))
	for i, j := range idx {
		outD[i], outS[i] = defs[j], sts[j]
	}
	return outD, outS
}

// DeletePool removes a pool and its idle sandboxes. Claimed sandboxes live
// on as ordinary sandboxes.
func (s *Pools) DeletePool(ctx context.Context, name string) error {
	if rp := s.runtimePools(); rp != nil {
		return s.deleteRuntimePool(ctx, rp, name)
	}
	key := poolKey(lifecycle.OwnerOf(ctx), name)
	s.mu.Lock()
	pl, ok := s.pools[key]
	if ok {
		delete(s.pools, key)
	}
	s.mu.Unlock()
	if !ok {
		return poolNotFound(name)
	}
	pl.mu.Lock()
	pl.deleted = true
	idle := pl.idle
	pl.idle = nil
	pl.mu.Unlock()
	close(pl.stop)
	// Warm creates in flight (and a refill's removal of stale sandboxes)
	// are cancelled by stop and clean up after themselves; wait for them
	// so nothing of the pool outlives the call.
	pl.inflight.Wait()
	ctx = context.WithoutCancel(ctx)
	for _, e := range idle {
		e.Lock()
		if err := e.Delete(ctx, lifecycle.ReasonStopping); err != nil {
			s.log.Error("delete idle pool sandbox", "pool", name, "id", e.ID(), "err", err)
		}
		e.Unlock()
	}
	// Claimed sandboxes forget their pool.
	s.core.Each(func(e *lifecycle.Entry) {
		if sb := e.Sandbox(); sb.Pool == key && !sb.Warm {
			sb.Pool = ""
			e.Persist()
		}
	})
	return s.deps.Store.Delete(PoolBucket, key)
}

func poolNotFound(name string) error {
	return errdefs.WithPublic(fmt.Errorf("pool %q: %w", name, errdefs.ErrNotFound), "POOL::NOT_FOUND", fmt.Sprintf("pool %s not found", name))
}

// getPool returns pool name of ctx's tenant (names resolve in the acting
// tenant: an admin names another tenant's pools with X-Moat-Tenant).
func (s *Pools) getPool(ctx context.Context, name string) (*pool, error) {
	return s.poolByKey(poolKey(lifecycle.OwnerOf(ctx), name), name)
}

// poolByKey returns the pool of key (see Pool.key); name is for errors.
func (s *Pools) poolByKey(key, name string) (*pool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	pl, ok := s.pools[key]
	if !ok {
		return nil, poolNotFound(name)
	}
	return pl, nil
}

func (pl *pool) statusLocked() PoolStatus {
	return PoolStatus{Total: len(pl.idle) + len(pl.allocated) + pl.creating + pl.reserved, Allocated: len(pl.allocated),
		Available: len(pl.idle), Revision: pl.def.Revision}
}

func (pl *pool) poke() {
	select {
	case pl.wake <- struct{}{}:
	default:
	}
}

// claimSettle is how long the refill after a claim waits for the next
// claim. A refill is a cold create, which on a small host takes the CPU
// the claimant needs for its next calls (E2B's SDK connects and runs its
// first command as soon as the create answers): claims that come in
// quick succession are served first, and refilled together once they
// pause.
const claimSettle = 150 * time.Millisecond

// pokeAfterClaimLocked starts the refill after a claim: at once when the
// claim left at most half of BufferMin idle (the buffer runs low), else
// once no claim has come for claimSettle. The caller holds pl.mu.
func (pl *pool) pokeAfterClaimLocked() {
	if len(pl.idle) <= pl.def.Capacity.BufferMin/2 {
		if pl.settle != nil {
			pl.settle.Stop()
		}
		pl.settling = false
		pl.poke()
		return
	}
	pl.settling = true
	if pl.settle == nil {
		pl.settle = time.AfterFunc(claimSettle, func() {
			pl.mu.Lock()
			pl.settling = false
			pl.mu.Unlock()
			pl.poke()
		})
		return
	}
	pl.settle.Reset(claimSettle)
}

// startPool registers a pool (with already-warm entries and the ids of
// claimed ones after a restart) and starts its refill loop. The caller
// holds s.mu.
func (s *Pools) startPool(def Pool, idle []*lifecycle.Entry, allocated []string) *pool {
	pl := &pool{owner: def.Tenant, def: def, idle: idle, allocated: map[string]bool{}, wake: make(chan struct{}, 1), stop: make(chan struct{})}
	for _, id := range allocated {
		pl.allocated[id] = true
	}
	s.pools[def.key()] = pl
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		s.refillLoop(pl)
	}()
	pl.poke()
	return pl
}

// refillLoop keeps pl's idle buffer within capacity until the pool is
// deleted or the service is closed.
func (s *Pools) refillLoop(pl *pool) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		select {
		case <-pl.stop:
		case <-s.closing:
		}
		cancel()
	}()
	tick := time.NewTicker(5 * time.Second)
	defer tick.Stop()
	for {
		s.refill(ctx, pl)
		select {
		case <-ctx.Done():
			return
		case <-pl.wake:
		case <-tick.C:
		}
	}
}

// warmConcurrency bounds warm creates in flight per pool.
const warmConcurrency = 4

func (s *Pools) refill(ctx context.Context, pl *pool) {
	pl.mu.Lock()
	if pl.deleted {
		pl.mu.Unlock()
		return
	}
	stale := pl.takeStaleLocked()
	need := s.planLocked(pl)
	def := pl.def
	pl.creating += need
	// Counted under pl.mu, where DeletePool sets deleted before it waits:
	// the work started here is either seen by its Wait or not started.
	pl.inflight.Add(need + 1)
	pl.mu.Unlock()

	for _, e := range stale {
		e.Lock()
		if err := e.Delete(ctx, lifecycle.ReasonStopping); err != nil {
			s.log.Error("delete stale pool sandbox", "pool", def.Name, "id", e.ID(), "err", err)
		}
		e.Unlock()
	}
	pl.inflight.Done()
	for i := 0; i < need; i++ {
		go s.warm(ctx, pl, def)
	}
}

// takeStaleLocked takes out of pl's idle buffer the sandboxes to replace:
// those of an old template revision (or no longer Running), and those
// above BufferMax (after a capacity update). The caller holds pl.mu.
func (pl *pool) takeStaleLocked() []*lifecycle.Entry {
	def := pl.def
	var stale []*lifecycle.Entry
	keep := pl.idle[:0]
	for _, e := range pl.idle {
		// TryLock: the lock order elsewhere is e.mu before pl.mu.
		if !e.TryLock() {
			keep = append(keep, e)
			continue
		}
		bad := e.Sandbox().PoolRevision != def.Revision || e.Sandbox().Status.State != lifecycle.StateRunning
		e.Unlock()
		if bad {
			stale = append(stale, e)
		} else {
			keep = append(keep, e)
		}
	}
	pl.idle = keep
	for len(pl.idle) > def.Capacity.BufferMax {
		stale = append(stale, pl.idle[len(pl.idle)-1])
		pl.idle = pl.idle[:len(pl.idle)-1]
	}
	return stale
}

// planLocked decides whether a refill of pl is under way (recorded) and
// returns how many warm creates to start now. The caller holds pl.mu.
func (s *Pools) planLocked(pl *pool) int {
	def := pl.def
	st := pl.statusLocked()
	if pl.settling && len(pl.idle) > def.Capacity.BufferMin/2 && st.Total >= def.Capacity.PoolMin {
		// Claims are coming in quick succession: the refill waits for
		// them to pause, whatever else pokes the pool meanwhile.
		return 0
	}
	avail := st.Available + pl.creating
	// Hysteresis: a refill starts when the buffer drops below BufferMin
	// (or the pool below PoolMin) and runs until BufferMax is reached.
	// Reached means by sandboxes that exist: creates in flight count
	// against what to start, not as done, since one may still fail (or
	// die with the server), and the refill must then go on.
	filling := def.Refilling || avail < def.Capacity.BufferMin || st.Total < def.Capacity.PoolMin
	need := 0
	if filling {
		need = max(0, def.Capacity.BufferMax-avail, def.Capacity.PoolMin-st.Total)
		if pl.refilledLocked() {
			filling = false
		}
	}
	s.setRefillingLocked(pl, filling)
	def = pl.def
	return max(0, min(need, def.Capacity.PoolMax-st.Total, warmConcurrency-pl.creating))
}

// warm creates one idle sandbox of pl (counted in pl.creating and
// pl.inflight by refill) and hands it to the pool, or removes it if the
// pool went away meanwhile.
func (s *Pools) warm(ctx context.Context, pl *pool, def Pool) {
	defer pl.inflight.Done()
	e, err := s.createWarm(ctx, def)
	pl.mu.Lock()
	pl.creating--
	if err == nil {
		if pl.deleted || ctx.Err() != nil {
			err = errPoolGone
		} else {
			pl.idle = append(pl.idle, e)
			// The refill ends when its last sandbox lands, not at the
			// next pass: a claim in between must not restart a finished
			// refill.
			if pl.def.Refilling && pl.refilledLocked() {
				s.setRefillingLocked(pl, false)
			}
		}
	}
	pl.mu.Unlock()
	if err != nil {
		if e != nil {
			e.Lock()
			e.Delete(context.Background(), lifecycle.ReasonStopping)
			e.Unlock()
		}
		if err != errPoolGone {
			s.log.Warn("warm pool create failed", "pool", def.Name, "err", err)
			select { // back off before retrying
			case <-ctx.Done():
			case <-time.After(time.Second):
			}
		}
	}
	pl.poke()
}

// refilledLocked tells whether a refill of pl is complete: BufferMax
// idle sandboxes and PoolMin in all exist (creates in flight do not count:
// one may still fail, or die with the server).
func (pl *pool) refilledLocked() bool {
	st := pl.statusLocked()
	return st.Available >= pl.def.Capacity.BufferMax && st.Total-pl.creating >= pl.def.Capacity.PoolMin
}

// setRefillingLocked records whether a refill of pl is under way, in
// memory and in the store (so a restarted server finishes it). Written
// under pl.mu, like UpdatePool's writes, so the record never goes back to
// an older definition.
func (s *Pools) setRefillingLocked(pl *pool, filling bool) {
	if pl.def.Refilling == filling {
		return
	}
	pl.def.Refilling = filling
	def := pl.def
	if err := s.deps.Store.Put(PoolBucket, def.key(), &def); err != nil {
		s.log.Warn("persist pool refill state", "pool", def.Name, "refilling", filling, "err", err)
	}
}

var errPoolGone = fmt.Errorf("pool gone: %w", errdefs.ErrNotFound)

// createWarm provisions one idle sandbox of def. Warm sandboxes have no
// expiry; their record is persisted so the pool survives a restart.
func (s *Pools) createWarm(ctx context.Context, def Pool) (*lifecycle.Entry, error) {
	t := def.Template
	sb, err := s.core.Validate(ctx, t.request())
	if err != nil {
		return nil, err
	}
	sb.Pool, sb.PoolRevision, sb.Warm = def.key(), def.Revision, true
	lifecycle.Own(&sb, def.Tenant)
	e := s.core.Insert(sb)
	defer e.Unlock()
	if err := e.Provision(ctx, nil); err != nil {
		e.Forget()
		return nil, err
	}
	return e, nil
}

// claim takes up to n idle sandboxes of pool name of ctx's tenant. The
// caller owns them (their locks are not held) and must finish or release
// them.
func (s *Pools) claim(ctx context.Context, name string, n int) ([]*lifecycle.Entry, *reservation, error) {
	pl, err := s.getPool(ctx, name)
	if err != nil {
		return nil, nil, errdefs.WithPublic(fmt.Errorf("%w: %v", errdefs.ErrInvalidArgument, err), "SANDBOX::INVALID_POOL_REF", fmt.Sprintf("pool %s not found", name))
	}
	pl.mu.Lock()
	defer pl.mu.Unlock()
	st := pl.statusLocked()
	if err := checkCapacity(name, st.Total, st.Available, n, pl.def.Capacity.PoolMax); err != nil {
		return nil, nil, err
	}
	k := min(n, len(pl.idle))
	res := &reservation{pl: pl, left: n - k}
	pl.reserved += res.left
	got := append([]*lifecycle.Entry(nil), pl.idle[len(pl.idle)-k:]...)
	pl.idle = pl.idle[:len(pl.idle)-k]
	for _, e := range got {
		pl.allocated[e.ID()] = true
	}
	pl.pokeAfterClaimLocked()
	return got, res, nil
}

// poolTemplateFor returns pool name of ctx's tenant, for cold creates.
func (s *Pools) poolTemplateFor(ctx context.Context, name string) (Pool, error) {
	pl, err := s.getPool(ctx, name)
	if err != nil {
		return Pool{}, errdefs.WithPublic(fmt.Errorf("%w: %v", errdefs.ErrInvalidArgument, err), "SANDBOX::INVALID_POOL_REF", fmt.Sprintf("pool %s not found", name))
	}
	pl.mu.Lock()
	defer pl.mu.Unlock()
	return pl.def, nil
}

// Released tells a pool (by key) that one of its claimed sandboxes is gone.
func (s *Pools) Released(poolKey, id string) {
	if poolKey == "" {
		return
	}
	pl, err := s.poolByKey(poolKey, poolKey)
	if err != nil {
		return
	}
	pl.mu.Lock()
	delete(pl.allocated, id)
	pl.mu.Unlock()
	pl.poke()
}

// Recover loads pool definitions and hands recovered warm sandboxes back
// to their pools. The core's Recover calls it once sandboxes are loaded.
func (s *Pools) Recover(ctx context.Context) error {
	if s.runtimePools() != nil {
		// The runtime keeps the pools (and fills them).
		return nil
	}
	defs, err := store.List[Pool](s.deps.Store, PoolBucket)
	if err != nil {
		return fmt.Errorf("load pools: %w", err)
	}
	idle := map[string][]*lifecycle.Entry{}
	allocated := map[string][]string{}
	s.core.Each(func(e *lifecycle.Entry) {
		sb := e.Sandbox()
		if sb.Pool == "" {
			return
		}
		terminal := sb.Status.State == lifecycle.StateTerminated || sb.Status.State == lifecycle.StateFailed
		if sb.Warm && sb.Status.State == lifecycle.StateRunning {
			idle[sb.Pool] = append(idle[sb.Pool], e)
		} else if !sb.Warm && !terminal {
			allocated[sb.Pool] = append(allocated[sb.Pool], sb.ID)
		}
	})
	s.mu.Lock()
	defer s.mu.Unlock()
	known := map[string]bool{}
	for _, d := range defs {
		known[d.key()] = true
		s.startPool(d, idle[d.key()], allocated[d.key()])
	}
	// Warm sandboxes of a pool that no longer exists are removed.
	for name, es := range idle {
		if known[name] {
			continue
		}
		for _, e := range es {
			e.Lock()
			e.Delete(context.Background(), lifecycle.ReasonStopping)
			e.Unlock()
		}
	}
	return nil
}

// SnapshotPools returns the names of pools whose template is snapshot
// id, those ctx does not see as "(another tenant's)".
func (s *Pools) SnapshotPools(ctx context.Context, id string) []string {
	s.mu.Lock()
	pls := make([]*pool, 0, len(s.pools))
	for _, pl := range s.pools {
		pls = append(pls, pl)
	}
	s.mu.Unlock()
	var names []string
	for _, pl := range pls {
		pl.mu.Lock()
		if pl.def.Template.SnapshotID == id && !pl.deleted {
			if lifecycle.Visible(ctx, pl.owner) {
				names = append(names, pl.def.Name)
			} else {
				names = append(names, "(another tenant's)")
			}
		}
		pl.mu.Unlock()
	}
	sort.Strings(names)
	return names
}

// TenantPools counts the pools tenant name owns (in this process).
func (s *Pools) TenantPools(name string) int {
	name = tenant.Normalize(name)
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, pl := range s.pools {
		if tenant.Normalize(pl.owner) == name {
			n++
		}
	}
	return n
}

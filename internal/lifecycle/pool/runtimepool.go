package pool

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/moat-sandbox/moat/internal/errdefs"
	"github.com/moat-sandbox/moat/internal/lifecycle"
	"github.com/moat-sandbox/moat/internal/runtime"
	"github.com/moat-sandbox/moat/internal/tenant"
)

// Pools kept by the runtime. A runtime that implements runtime.Pools (the
// kubernetes runtime: Pool resources that `moat controller` fills) keeps
// the pools of the Lifecycle API itself: the service stores its Pool
// record with the runtime's pool (PoolSpec.Definition) and fills nothing;
// a claim is the runtime's Claim (one durable step for the whole batch),
// then one store write for the sandbox records and the claim's env
// through each agent. Nothing of these pools lives in this process, so
// every server on the runtime (the replicas of a stateless server) serves
// the same pools.

// runtimePools returns the runtime's pools, nil if it keeps none.
func (s *Pools) runtimePools() runtime.Pools {
	rp, _ := s.deps.Runtime.(runtime.Pools)
	return rp
}

// runtimePoolName is the runtime's name of the pool with key (see
// Pool.key): the name itself for the default tenant; for other tenants
// "t<hash of the tenant>-<name>", cut with a hash to a DNS label.
func runtimePoolName(key string) string {
	owner, name, ok := strings.Cut(key, "/")
	if !ok {
		return key
	}
	h := sha256.Sum256([]byte(owner))
	n := "t" + hex.EncodeToString(h[:4]) + "-" + name
	if len(n) > 63 {
		h := sha256.Sum256([]byte(n))
		n = n[:54] + "-" + hex.EncodeToString(h[:4])
	}
	return n
}

// runtimePoolSpec renders pool p for the runtime.
func (s *Pools) runtimePoolSpec(ctx context.Context, p Pool) (runtime.PoolSpec, error) {
	sb, err := s.core.Validate(ctx, p.Template.request())
	if err != nil {
		return runtime.PoolSpec{}, err
	}
	if len(sb.Mounts) > 0 {
		return runtime.PoolSpec{}, errdefs.Invalid(lifecycle.CodeInvalidVolume, "pools of this runtime cannot mount volumes")
	}
	def, err := json.Marshal(p)
	if err != nil {
		return runtime.PoolSpec{}, err
	}
	c := p.Capacity
	return runtime.PoolSpec{
		Name: runtimePoolName(p.key()),
		Template: runtime.Spec{Image: sb.Image, Entrypoint: sb.Entrypoint, Env: sb.Env, Resources: sb.Resources, Class: sb.Class,
			Tenant: tenant.Normalize(p.Tenant)},
		BufferMin: c.BufferMin, BufferMax: c.BufferMax, PoolMin: c.PoolMin, PoolMax: c.PoolMax,
		Definition: def,
	}, nil
}

// poolOf reads the lifecycle's record of a runtime pool. A pool made
// without one (by hand, e.g. with kubectl) belongs to the default tenant
// and is described from its template.
func poolOf(spec runtime.PoolSpec, st runtime.PoolStatus) (Pool, PoolStatus) {
	var p Pool
	if len(spec.Definition) == 0 || json.Unmarshal(spec.Definition, &p) != nil {
		t := spec.Template
		p = Pool{Name: spec.Name, Revision: 1, Template: PoolTemplate{Image: t.Image, Entrypoint: t.Entrypoint, Env: t.Env}}
		lim := map[string]string{}
		if t.Resources.CPUMillis > 0 {
			lim["cpu"] = strconv.FormatInt(t.Resources.CPUMillis, 10) + "m"
		}
		if t.Resources.MemoryBytes > 0 {
			lim["memory"] = strconv.FormatInt(t.Resources.MemoryBytes, 10)
		}
		if len(lim) > 0 {
			p.Template.ResourceLimits = lim
		}
		if t.Class != "" {
			p.Template.Extensions = map[string]string{lifecycle.ExtRuntimeClass: t.Class}
		}
	}
	p.Capacity = Capacity{BufferMin: spec.BufferMin, BufferMax: spec.BufferMax, PoolMin: spec.PoolMin, PoolMax: spec.PoolMax}
	return p, PoolStatus{Total: st.Total, Allocated: st.Allocated, Available: st.Available, Revision: p.Revision}
}

// getRuntimePool returns pool name of ctx's tenant.
func (s *Pools) getRuntimePool(ctx context.Context, rp runtime.Pools, name string) (Pool, PoolStatus, error) {
	p, ps, _, err := s.lookupRuntimePool(ctx, rp, name)
	return p, ps, err
}

// lookupRuntimePool is getRuntimePool with the runtime's spec of the pool.
func (s *Pools) lookupRuntimePool(ctx context.Context, rp runtime.Pools, name string) (Pool, PoolStatus, runtime.PoolSpec, error) {
	key := poolKey(lifecycle.OwnerOf(ctx), name)
	spec, st, err := rp.GetPool(ctx, runtimePoolName(key))
	if errdefs.IsNotFound(err) {
		return Pool{}, PoolStatus{}, spec, poolNotFound(name)
	}
	if err != nil {
		return Pool{}, PoolStatus{}, spec, err
	}
	p, ps := poolOf(spec, st)
	if p.key() != key {
		// A name of this form made for another tenant, or by hand.
		return Pool{}, PoolStatus{}, spec, poolNotFound(name)
	}
	return p, ps, spec, nil
}

func (s *Pools) createRuntimePool(ctx context.Context, rp runtime.Pools, p Pool) (Pool, error) {
	p.Tenant = lifecycle.OwnerOf(ctx)
	p.CreatedAt = s.core.Now()
	p.Revision = 1
	spec, err := s.runtimePoolSpec(ctx, p)
	if err != nil {
		return Pool{}, err
	}
	if err := rp.PutPool(ctx, spec, true); err != nil {
		if errdefs.IsAlreadyExists(err) {
			return Pool{}, errdefs.WithPublic(fmt.Errorf("pool %q: %w", p.Name, errdefs.ErrAlreadyExists), "POOL::ALREADY_EXISTS", fmt.Sprintf("pool %s already exists", p.Name))
		}
		return Pool{}, err
	}
	return p, nil
}

func (s *Pools) updateRuntimePool(ctx context.Context, rp runtime.Pools, p Pool) (Pool, error) {
	cur, _, err := s.getRuntimePool(ctx, rp, p.Name)
	if err != nil {
		return Pool{}, err
	}
	p.Tenant, p.CreatedAt, p.Revision = cur.Tenant, cur.CreatedAt, cur.Revision
	if !templateEqual(p.Template, cur.Template) {
		p.Revision++
	}
	spec, err := s.runtimePoolSpec(ctx, p)
	if err != nil {
		return Pool{}, err
	}
	if err := rp.PutPool(ctx, spec, false); err != nil {
		if errdefs.IsNotFound(err) {
			return Pool{}, poolNotFound(p.Name)
		}
		return Pool{}, err
	}
	return p, nil
}

func (s *Pools) listRuntimePools(ctx context.Context, rp runtime.Pools) ([]Pool, []PoolStatus) {
	specs, sts, err := rp.ListPools(ctx)
	if err != nil {
		s.log.Error("list the runtime's pools", "err", err)
		return nil, nil
	}
	var defs []Pool
	var out []PoolStatus
	for i := range specs {
		p, st := poolOf(specs[i], sts[i])
		if runtimePoolName(p.key()) != specs[i].Name || !lifecycle.Visible(ctx, tenant.Normalize(p.Tenant)) {
			continue
		}
		defs, out = append(defs, p), append(out, st)
	}
	return defs, out
}

func (s *Pools) deleteRuntimePool(ctx context.Context, rp runtime.Pools, name string) error {
	if _, _, err := s.getRuntimePool(ctx, rp, name); err != nil {
		return err
	}
	err := rp.DeletePool(ctx, runtimePoolName(poolKey(lifecycle.OwnerOf(ctx), name)))
	if errdefs.IsNotFound(err) {
		return poolNotFound(name)
	}
	return err
}

// claimRuntimePool claims n sandboxes of runtime pool name: as many as
// the pool has idle in one step of the runtime, the rest created cold
// from its template.
func (s *Pools) claimRuntimePool(ctx context.Context, rp runtime.Pools, req lifecycle.CreateRequest, name string, n int) ([]lifecycle.Sandbox, error) {
	def, st, rspec, err := s.lookupRuntimePool(ctx, rp, name)
	if err != nil {
		return nil, errdefs.WithPublic(fmt.Errorf("%w: %v", errdefs.ErrInvalidArgument, err), "SANDBOX::INVALID_POOL_REF", fmt.Sprintf("pool %s not found", name))
	}
	merged, err := claimRequest(req, def)
	if err != nil {
		return nil, err
	}
	proto, err := s.core.Validate(ctx, merged)
	if err != nil {
		return nil, err
	}
	owner := lifecycle.OwnerOf(ctx)
	filtered := proto.NetworkPolicy != nil || s.core.EgressGuardrail(owner) != nil
	if filtered && !rspec.Egress {
		return nil, errdefs.WithPublic(errdefs.ErrNotImplemented, "SANDBOX::API_NOT_SUPPORTED",
			fmt.Sprintf("networkPolicy (or a tenant egress guardrail) is not supported on sandboxes claimed from pool %s: its pods have no egress sidecar (a pool of a sandbox runtime class, or one made by hand)", name))
	}
	if err := s.core.Quota().Check(owner, n, proto.Resources.CPUMillis, proto.Resources.MemoryBytes); err != nil {
		return nil, err
	}
	// The runtime's pool counts its own pods (cold creates of a claim are
	// pods outside it).
	if err := checkCapacity(name, st.Total, st.Available, n, def.Capacity.PoolMax); err != nil {
		return nil, err
	}
	ids := make([]string, n)
	for i := range ids {
		ids[i] = lifecycle.NewID()
	}
	// Past this point the claim finishes even if the client goes away.
	ctx = context.WithoutCancel(ctx)
	key := poolKey(owner, name)
	build := claimedRecord(proto, key, def.Revision, owner, s.core.Now(), filtered)
	record := func(c runtime.Claimed) []byte {
		sb := build(c)
		raw, _ := json.Marshal(&sb) // as the store encodes it
		return raw
	}
	claimed, err := rp.Claim(ctx, runtimePoolName(key), ids, record)
	if err != nil {
		if errdefs.IsFailedPrecondition(err) {
			return nil, errdefs.WithPublic(err, "SANDBOX::CLAIM_FAILED", lifecycle.PublicCause(err))
		}
		return nil, err
	}
	recs := make([]lifecycle.Sandbox, len(claimed))
	stored := make([]bool, len(claimed))
	for i, c := range claimed {
		recs[i], stored[i] = build(c), c.Recorded
	}
	out, err := s.core.AdoptClaimed(ctx, owner, recs, stored, req.Env, req.IDEnv)
	if err != nil {
		return nil, err
	}
	// Other servers claim from the same pool: what this claim got is
	// what was idle.
	if err := checkCapacity(name, st.Total, len(out), n, def.Capacity.PoolMax); err != nil {
		for _, sb := range out {
			s.core.Delete(ctx, sb.ID)
		}
		return nil, err
	}
	s.observeClaim(len(claimed), n-len(claimed))
	if rest := n - len(out); rest > 0 {
		cold, err := s.core.ColdBatch(ctx, merged, rest, s.join(ctx, name, nil))
		if err != nil {
			for _, sb := range out {
				s.core.Delete(ctx, sb.ID)
			}
			return nil, err
		}
		out = append(out, cold...)
	}
	return out, nil
}

// claimedRecord returns the record of a sandbox claimed from runtime pool
// key (of owner, at revision) with the settings of proto, as of now: a
// pure function of the claim, so that the runtime can store it with the
// claim (one write) and this process holds the same record.
func claimedRecord(proto lifecycle.Sandbox, key string, revision int, owner string, now time.Time, filtered bool) func(runtime.Claimed) lifecycle.Sandbox {
	return func(c runtime.Claimed) lifecycle.Sandbox {
		sb := proto.Clone()
		sb.ID, sb.AgentToken, sb.Pool, sb.PoolRevision = c.Status.ID, c.AgentToken, key, revision
		if filtered {
			// Its policy is set once it is adopted (AdoptClaimed).
			sb.EgressToken = lifecycle.NewToken()
		}
		if sb.Class == "" {
			sb.Class = c.Status.Class
		}
		sb.CreatedAt = now
		sb.ExpiresAt = nil
		if proto.ExpiresAt != nil {
			exp := now.Add(proto.ExpiresAt.Sub(proto.CreatedAt))
			sb.ExpiresAt = &exp
		}
		lifecycle.Own(&sb, owner)
		lifecycle.ClaimRunning(&sb, now)
		return sb
	}
}

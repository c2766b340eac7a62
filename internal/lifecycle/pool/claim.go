package pool

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/moat-sandbox/moat/internal/errdefs"
	"github.com/moat-sandbox/moat/internal/lifecycle"
)

const codeInvalid = "SANDBOX::INVALID_PARAMETER"

// claimRequest merges a claim with its pool's template and validates it.
// A claim may set env, metadata, timeout and extensions; image, entrypoint
// and resources come from the template and may only repeat it.
func claimRequest(req lifecycle.CreateRequest, def Pool) (lifecycle.CreateRequest, error) {
	t := def.Template
	if req.CredentialProxy {
		return req, errdefs.Invalid(codeInvalid, fmt.Sprintf("credentialProxy cannot be enabled on a sandbox claimed from pool %s: the sandbox CA is installed when a sandbox starts", def.Name))
	}
	if req.SnapshotID != "" && req.SnapshotID != t.SnapshotID {
		return req, errdefs.Invalid(codeInvalid, fmt.Sprintf("snapshotId %q differs from pool %s's snapshot %q", req.SnapshotID, def.Name, t.SnapshotID))
	}
	if req.Image != "" && req.Image != t.Image {
		return req, errdefs.Invalid(codeInvalid, fmt.Sprintf("image %q differs from pool %s's image %q", req.Image, def.Name, t.Image))
	}
	if len(req.Entrypoint) > 0 && !slices.Equal(req.Entrypoint, t.Entrypoint) {
		return req, errdefs.Invalid("SANDBOX::INVALID_ENTRYPOINT", fmt.Sprintf("entrypoint differs from pool %s's entrypoint", def.Name))
	}
	for k, v := range req.ResourceLimits {
		if t.ResourceLimits[k] != v {
			return req, errdefs.Invalid(codeInvalid, fmt.Sprintf("resourceLimits.%s differs from pool %s's template", k, def.Name))
		}
	}
	if c, ok := req.Extensions[lifecycle.ExtRuntimeClass]; ok && c != t.Extensions[lifecycle.ExtRuntimeClass] {
		return req, errdefs.Invalid(codeInvalid, fmt.Sprintf("extensions[%s] differs from pool %s's template", lifecycle.ExtRuntimeClass, def.Name))
	}
	m := req
	m.Image, m.SnapshotID, m.Entrypoint, m.ResourceLimits = t.Image, t.SnapshotID, t.Entrypoint, t.ResourceLimits
	m.Env = maps.Clone(t.Env)
	if m.Env == nil && len(req.Env) > 0 {
		m.Env = map[string]string{}
	}
	for k, v := range req.Env {
		m.Env[k] = v
	}
	m.Extensions = maps.Clone(t.Extensions)
	for k, v := range req.Extensions {
		if k == lifecycle.ExtPoolRef {
			continue
		}
		if m.Extensions == nil {
			m.Extensions = map[string]string{}
		}
		m.Extensions[k] = v
	}
	return m, nil
}

// CreateFromPool claims up to n idle sandboxes of pool name and cold-creates
// the rest from its template.
func (s *Pools) CreateFromPool(ctx context.Context, req lifecycle.CreateRequest, name string, n int) ([]lifecycle.Sandbox, error) {
	if rp := s.runtimePools(); rp != nil {
		return s.claimRuntimePool(ctx, rp, req, name, n)
	}
	def, err := s.poolTemplateFor(ctx, name)
	if err != nil {
		return nil, err
	}
	merged, err := claimRequest(req, def)
	if err != nil {
		return nil, err
	}
	proto, err := s.core.Validate(ctx, merged) // checks metadata, timeout, env, extensions
	if err != nil {
		return nil, err
	}
	// Claimed or cold, each of the n sandboxes is new to the tenant's quota.
	owner, cpu, mem := lifecycle.OwnerOf(ctx), proto.Resources.CPUMillis, proto.Resources.MemoryBytes
	if err := s.core.Quota().Check(owner, n, cpu, mem); err != nil {
		return nil, err
	}
	claimed, res, err := s.claim(ctx, name, n)
	if err != nil {
		return nil, err
	}
	defer res.release()
	ids := make([]string, len(claimed))
	for i, e := range claimed {
		ids[i] = e.ID()
	}
	if err := s.core.Quota().Admit(owner, ids, cpu, mem); err != nil {
		// A concurrent create took the room since the check: the
		// claimed sandboxes go (the pool refills).
		for _, e := range claimed {
			e.Lock()
			e.Sandbox().Warm = false // so that the pool forgets the claim
			e.Delete(context.WithoutCancel(ctx), lifecycle.ReasonStopping)
			e.Unlock()
		}
		return nil, err
	}
	s.observeClaim(len(claimed), n-len(claimed))
	ctx = context.WithoutCancel(ctx)
	out, err := s.core.Activate(ctx, claimed, proto, req.Env, req.IDEnv)
	if err != nil {
		return nil, err
	}
	if rest := n - len(out); rest > 0 {
		cold, err := s.core.ColdBatch(ctx, merged, rest, s.join(ctx, name, res))
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

// claimRetryAfter is the Retry-After of a claim refused for capacity.
const claimRetryAfter = 2 * time.Second

// CodeCapacityExhausted is the code of a claim from a pool at its poolMax
// without enough idle sandboxes. It is upstream's Kubernetes code,
// answered by every runtime's pools, so that clients matching on it work
// against any moat.
const CodeCapacityExhausted = "KUBERNETES::POOL_CAPACITY_EXHAUSTED"

// checkCapacity is the one back-pressure rule of every pool: a claim of n
// from a pool of total sandboxes (idle, claimed and being made), free of
// them idle, must make n-free new ones, and may not take the pool past
// poolMax. Refused, it is a 429 with Retry-After: nothing was claimed.
func checkCapacity(name string, total, free, n, poolMax int) error {
	if n <= free || total+(n-free) <= poolMax {
		return nil
	}
	return errdefs.WithRetryAfter(errdefs.WithPublic(
		fmt.Errorf("pool %s: %d idle, %d of %d in use: %w", name, free, total, poolMax, errdefs.ErrCapacity),
		CodeCapacityExhausted,
		fmt.Sprintf("pool %s is at its poolMax (%d) with %d idle sandboxes, fewer than the %d asked for; retry later", name, poolMax, free, n)),
		claimRetryAfter)
}

// reservation is the room a claim holds in its pool for the cold creates
// it still makes (pool.reserved), so that concurrent claims cannot take
// the pool past poolMax between the claim and the joins.
type reservation struct {
	pl   *pool
	left int
}

// takeLocked turns one reserved place into a claimed sandbox. The caller
// holds pl.mu.
func (r *reservation) takeLocked() {
	if r != nil && r.left > 0 {
		r.left--
		r.pl.reserved--
	}
}

// release gives back what the claim did not use.
func (r *reservation) release() {
	if r == nil || r.left == 0 {
		return
	}
	r.pl.mu.Lock()
	r.pl.reserved -= r.left
	r.left = 0
	r.pl.mu.Unlock()
	r.pl.poke()
}

// join returns the attachment of a claim's cold sandboxes to pool name
// of ctx's tenant (lifecycle.Service.ColdBatch): they count as claimed.
func (s *Pools) join(ctx context.Context, name string, res *reservation) func(sb *lifecycle.Sandbox) error {
	return func(sb *lifecycle.Sandbox) error {
		key := poolKey(sb.Tenant, name)
		if s.runtimePools() != nil {
			// A cold sandbox of a runtime's pool: nothing to count here.
			sb.Pool = key
			return nil
		}
		pl, err := s.getPool(ctx, name)
		if err != nil {
			return err
		}
		sb.Pool = key
		pl.mu.Lock()
		pl.allocated[sb.ID] = true
		res.takeLocked()
		pl.mu.Unlock()
		return nil
	}
}

// observeClaim reports a pool claim of hits idle and misses cold sandboxes.
func (s *Pools) observeClaim(hits, misses int) {
	if s.deps.Metrics != nil {
		s.deps.Metrics.ObservePoolClaim(hits, misses)
	}
}

package lifecycle

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"

	"github.com/moat-sandbox/moat/internal/agentproto"
	"github.com/moat-sandbox/moat/internal/errdefs"
)

// MaxBatch is the largest batch create.
const MaxBatch = 1000

// coldConcurrency bounds cold creates in flight for one batch.
const coldConcurrency = 8

// CreateBatch creates n sandboxes in one call. With extensions.poolRef,
// idle sandboxes are claimed from the pool in one step (one store write for
// the whole claim) and the rest are created cold from the pool template;
// otherwise all are created cold from req. It is all or nothing: if any
// sandbox fails, every sandbox of the batch is deleted.
func (s *Service) CreateBatch(ctx context.Context, req CreateRequest, n int) ([]Sandbox, error) {
	if n < 1 || n > MaxBatch {
		return nil, errdefs.Invalid(codeInvalid, fmt.Sprintf("count must be between 1 and %d", MaxBatch))
	}
	if name := req.Extensions[ExtPoolRef]; name != "" {
		return s.createFromPool(ctx, req, name, n)
	}
	sb, err := s.validate(ctx, req)
	if err != nil {
		return nil, err
	}
	// The whole batch must fit the quota; each create is still charged
	// on its own (createOne), so concurrent calls cannot overrun it.
	if err := s.quota.check(s.deps.Quotas, ownerOf(ctx), n, sb.Resources.CPUMillis, sb.Resources.MemoryBytes); err != nil {
		return nil, err
	}
	return s.coldBatch(ctx, req, n, "")
}

// coldBatch creates n sandboxes concurrently from req; poolName, if set,
// attaches them to a pool as claimed.
func (s *Service) coldBatch(ctx context.Context, req CreateRequest, n int, poolName string) ([]Sandbox, error) {
	out := make([]Sandbox, n)
	errs := make([]error, n)
	sem := make(chan struct{}, coldConcurrency)
	var wg sync.WaitGroup
	for i := 0; i < n; i++ {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			out[i], errs[i] = s.createOne(ctx, req, poolName)
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		for i, sb := range out {
			if sb.ID != "" && errs[i] == nil {
				s.Delete(context.WithoutCancel(ctx), sb.ID)
			}
		}
		return nil, firstErr(errs)
	}
	return out, nil
}

func firstErr(errs []error) error {
	for _, e := range errs {
		if e != nil {
			return e
		}
	}
	return nil
}

// createOne is Create without the pool dispatch, optionally attached to
// pool poolName of ctx's tenant.
func (s *Service) createOne(ctx context.Context, req CreateRequest, poolName string) (Sandbox, error) {
	sb, err := s.validate(ctx, req)
	if err != nil {
		return Sandbox{}, err
	}
	own(&sb, ownerOf(ctx))
	var pl *pool
	if poolName != "" && s.runtimePools() != nil {
		// A cold sandbox of a runtime's pool: nothing to count here.
		sb.Pool = poolKey(sb.Tenant, poolName)
	} else if poolName != "" {
		if pl, err = s.getPool(ctx, poolName); err != nil {
			return Sandbox{}, err
		}
	}
	if err := s.admitEntry(&sb); err != nil {
		return Sandbox{}, err
	}
	if pl != nil {
		sb.Pool = poolKey(sb.Tenant, poolName)
		pl.mu.Lock()
		pl.allocated[sb.ID] = true
		pl.mu.Unlock()
	}
	e := newEntry(sb)
	e.mu.Lock()
	s.put(e)
	defer e.mu.Unlock()
	if err := s.provision(context.WithoutCancel(ctx), e, req.ImageAuth); err != nil {
		s.released(sb.Pool, sb.ID)
		return e.sb.clone(), err
	}
	return e.sb.clone(), nil
}

// claimRequest merges a claim with its pool's template and validates it.
// A claim may set env, metadata, timeout and extensions; image, entrypoint
// and resources come from the template and may only repeat it.
func claimRequest(req CreateRequest, def Pool) (CreateRequest, error) {
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
	if c, ok := req.Extensions[ExtRuntimeClass]; ok && c != t.Extensions[ExtRuntimeClass] {
		return req, errdefs.Invalid(codeInvalid, fmt.Sprintf("extensions[%s] differs from pool %s's template", ExtRuntimeClass, def.Name))
	}
	m := req
	m.Image, m.SnapshotID, m.Entrypoint, m.ResourceLimits = t.Image, t.SnapshotID, t.Entrypoint, t.ResourceLimits
	m.Env = cloneMap(t.Env)
	if m.Env == nil && len(req.Env) > 0 {
		m.Env = map[string]string{}
	}
	for k, v := range req.Env {
		m.Env[k] = v
	}
	m.Extensions = cloneMap(t.Extensions)
	for k, v := range req.Extensions {
		if k == ExtPoolRef {
			continue
		}
		if m.Extensions == nil {
			m.Extensions = map[string]string{}
		}
		m.Extensions[k] = v
	}
	return m, nil
}

// createFromPool claims up to n idle sandboxes of pool name and cold-creates
// the rest from its template.
func (s *Service) createFromPool(ctx context.Context, req CreateRequest, name string, n int) ([]Sandbox, error) {
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
	proto, err := s.validate(ctx, merged) // checks metadata, timeout, env, extensions
	if err != nil {
		return nil, err
	}
	// Claimed or cold, each of the n sandboxes is new to the tenant's quota.
	owner, cpu, mem := ownerOf(ctx), proto.Resources.CPUMillis, proto.Resources.MemoryBytes
	if err := s.quota.check(s.deps.Quotas, owner, n, cpu, mem); err != nil {
		return nil, err
	}
	claimed, err := s.claim(ctx, name, n)
	if err != nil {
		return nil, err
	}
	ids := make([]string, len(claimed))
	for i, e := range claimed {
		ids[i] = e.sb.ID
	}
	if err := s.quota.admit(s.deps.Quotas, owner, ids, cpu, mem); err != nil {
		// A concurrent create took the room since the check: the
		// claimed sandboxes go (the pool refills).
		for _, e := range claimed {
			e.mu.Lock()
			e.sb.Warm = false // so that the pool forgets the claim
			s.deleteLocked(context.WithoutCancel(ctx), e, ReasonStopping)
			e.mu.Unlock()
		}
		return nil, err
	}
	s.observeClaim(len(claimed), n-len(claimed))
	ctx = context.WithoutCancel(ctx)
	out, err := s.finishClaims(ctx, claimed, proto, req.Env)
	if err != nil {
		return nil, err
	}
	if rest := n - len(out); rest > 0 {
		cold, err := s.coldBatch(ctx, merged, rest, name)
		if err != nil {
			for _, sb := range out {
				s.Delete(ctx, sb.ID)
			}
			return nil, err
		}
		out = append(out, cold...)
	}
	return out, nil
}

// finishClaims turns claimed warm sandboxes into ordinary ones with the
// claim's settings, persisted in one store write.
func (s *Service) finishClaims(ctx context.Context, claimed []*entry, proto Sandbox, env map[string]string) ([]Sandbox, error) {
	if len(claimed) == 0 {
		return nil, nil
	}
	for _, e := range claimed {
		e.mu.Lock()
	}
	defer func() {
		for _, e := range claimed {
			e.mu.Unlock()
		}
	}()
	now := s.now()
	if len(env) > 0 {
		if err := s.applyEnv(ctx, claimed, env); err != nil {
			for _, e := range claimed {
				s.deleteLocked(ctx, e, ReasonStopping) // the pool refills
			}
			return nil, errdefs.WithPublic(err, "SANDBOX::CLAIM_FAILED", "could not apply env to the claimed sandbox")
		}
	}
	if proto.NetworkPolicy != nil {
		for _, e := range claimed {
			st, err := s.deps.Runtime.Status(ctx, e.sb.ID)
			if err == nil {
				err = s.attachEgress(ctx, e.sb.ID, st.IP, *proto.NetworkPolicy)
			}
			if err != nil {
				for _, e := range claimed {
					s.deleteLocked(ctx, e, ReasonStopping) // detaches too
				}
				return nil, errdefs.WithPublic(err, "SANDBOX::EGRESS_FAILED", "could not apply the network policy")
			}
			np := *proto.NetworkPolicy
			e.sb.NetworkPolicy, e.sb.EgressToken = &np, newToken()
		}
	}
	kv := make(map[string]any, len(claimed))
	prev := make([]Sandbox, len(claimed))
	for i, e := range claimed {
		prev[i] = e.sb
		sb := &e.sb
		sb.Warm = false
		sb.Metadata = cloneMap(proto.Metadata)
		sb.Env = cloneMap(proto.Env)
		sb.Extensions = cloneMap(proto.Extensions)
		sb.RenewOnAccess = proto.RenewOnAccess
		sb.Platform = proto.Platform
		sb.CreatedAt = now
		sb.ExpiresAt = nil
		if proto.ExpiresAt != nil {
			exp := now.Add(proto.ExpiresAt.Sub(proto.CreatedAt))
			sb.ExpiresAt = &exp
		}
		s.mustTransition(e, StateRunning, ReasonRunning, "")
		kv[sb.ID] = sb
	}
	if err := s.deps.Store.PutMany(Bucket, kv); err != nil {
		for i, e := range claimed {
			e.sb = prev[i]
			s.deleteLocked(ctx, e, ReasonStopping)
		}
		return nil, err
	}
	out := make([]Sandbox, len(claimed))
	for i, e := range claimed {
		out[i] = e.sb.clone()
	}
	return out, nil
}

// applyEnv adds env to the agents of claimed sandboxes (the moat
// extension agentproto.EnvPath), concurrently. Callers hold the entries.
func (s *Service) applyEnv(ctx context.Context, claimed []*entry, env map[string]string) error {
	errs := make([]error, len(claimed))
	var wg sync.WaitGroup
	for i, e := range claimed {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ep, err := s.deps.Runtime.Endpoint(ctx, e.sb.ID, agentproto.Port)
			if err == nil {
				err = s.agent().SetEnv(ctx, ep, e.sb.AgentToken, env)
			}
			if err != nil {
				errs[i] = fmt.Errorf("set env on %s: %w", e.sb.ID, err)
			}
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

// rotateToken gives the agent of a sandbox restored from a memory
// snapshot its own access token (the moat extension agentproto.TokenPath,
// authorized by the token the agent was checkpointed with). Until then
// the restored agent accepts only the source's token, which the server
// never shows to clients of the restored sandbox.
func (s *Service) rotateToken(ctx context.Context, id, old, token string) error {
	ep, err := s.deps.Runtime.Endpoint(ctx, id, agentproto.Port)
	if err == nil {
		err = s.agent().RotateToken(ctx, ep, old, token)
	}
	if err != nil {
		return fmt.Errorf("rotate token of %s: %w", id, err)
	}
	return nil
}

package lifecycle

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/moat-sandbox/moat/internal/agentproto"
	"github.com/moat-sandbox/moat/internal/egress/policy"
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
		return s.fromPool(ctx, req, name, n)
	}
	sb, err := s.Validate(ctx, req)
	if err != nil {
		return nil, err
	}
	// The whole batch must fit the quota; each create is still charged
	// on its own (createOne), so concurrent calls cannot overrun it.
	if err := s.quota.Check(OwnerOf(ctx), n, sb.Resources.CPUMillis, sb.Resources.MemoryBytes); err != nil {
		return nil, err
	}
	return s.ColdBatch(ctx, req, n, nil)
}

// fromPool hands a create from pool name to the pools feature.
func (s *Service) fromPool(ctx context.Context, req CreateRequest, name string, n int) ([]Sandbox, error) {
	if s.features.Pools == nil {
		return nil, errdefs.WithPublic(fmt.Errorf("pool %q: %w", name, errdefs.ErrInvalidArgument), "SANDBOX::INVALID_POOL_REF", fmt.Sprintf("pool %s not found", name))
	}
	return s.features.Pools.CreateFromPool(ctx, req, name, n)
}

// released tells the pool of key (Sandbox.Pool) that sandbox id is gone.
func (s *Service) released(key, id string) {
	if key != "" && s.features.Pools != nil {
		s.features.Pools.Released(key, id)
	}
}

// ColdBatch creates n sandboxes concurrently from req, all or nothing.
// join, if set, attaches each new record to a pool (it sets Sandbox.Pool)
// before it is charged and provisioned; a sandbox of the batch that
// fails is then Released to its pool.
func (s *Service) ColdBatch(ctx context.Context, req CreateRequest, n int, join func(sb *Sandbox) error) ([]Sandbox, error) {
	reqs := make([]CreateRequest, n)
	for i := range reqs {
		reqs[i] = req
	}
	return s.coldEach(ctx, reqs, join)
}

// CreateEach creates one sandbox per request concurrently, all or
// nothing: a batch whose sandboxes differ (a fork's children, each with
// its own env, metadata or timeout). Requests naming a memory snapshot
// (SnapshotID) restore its processes from the snapshot's one checkpoint:
// every child reads the same image files, nothing is copied per child on
// disk, and a child answers before its memory is all loaded (runtime
// restore in the background, on gVisor). The whole set must fit the
// caller's quota.
func (s *Service) CreateEach(ctx context.Context, reqs []CreateRequest) ([]Sandbox, error) {
	if len(reqs) < 1 || len(reqs) > MaxBatch {
		return nil, errdefs.Invalid(codeInvalid, fmt.Sprintf("count must be between 1 and %d", MaxBatch))
	}
	var cpu, mem int64
	for _, req := range reqs {
		sb, err := s.Validate(ctx, req)
		if err != nil {
			return nil, err
		}
		cpu, mem = max(cpu, sb.Resources.CPUMillis), max(mem, sb.Resources.MemoryBytes)
	}
	if err := s.quota.Check(OwnerOf(ctx), len(reqs), cpu, mem); err != nil {
		return nil, err
	}
	return s.coldEach(ctx, reqs, nil)
}

// coldEach is ColdBatch and CreateEach: one create per request, at most
// coldConcurrency at once.
func (s *Service) coldEach(ctx context.Context, reqs []CreateRequest, join func(sb *Sandbox) error) ([]Sandbox, error) {
	n := len(reqs)
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
			out[i], errs[i] = s.createOne(ctx, reqs[i], join)
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

// createOne is Create without the pool dispatch, attached by join.
func (s *Service) createOne(ctx context.Context, req CreateRequest, join func(sb *Sandbox) error) (Sandbox, error) {
	sb, err := s.Validate(ctx, req)
	if err != nil {
		return Sandbox{}, err
	}
	Own(&sb, OwnerOf(ctx))
	if join != nil {
		if err := join(&sb); err != nil {
			return Sandbox{}, err
		}
	}
	if err := s.quota.Admit(sb.Tenant, []string{sb.ID}, sb.Resources.CPUMillis, sb.Resources.MemoryBytes); err != nil {
		s.released(sb.Pool, sb.ID)
		return Sandbox{}, err
	}
	e := s.Insert(sb)
	defer e.mu.Unlock()
	if err := e.provision(context.WithoutCancel(ctx), req.ImageAuth); err != nil {
		s.released(sb.Pool, sb.ID)
		return e.sb.clone(), err
	}
	return e.sb.clone(), nil
}

// enforceEgress sets the network policy of sandbox e (its lock held,
// at address ip, looked up from the runtime when ip is ""): own under
// its tenant's guardrail. When neither filters it, it does nothing
// (attached false) unless always is set (a sandbox recorded with an
// egress token), which gets a policy allowing everything. Creates,
// claims and adoptions all pass through here; each handles a failure
// its own way.
func (e *Entry) enforceEgress(ctx context.Context, own *policy.NetworkPolicy, always bool, ip string) (bool, error) {
	s := e.svc
	eff, err := s.effective(e.owner, own)
	if err != nil {
		return false, err
	}
	if eff == nil {
		if !always {
			return false, nil
		}
		a := policy.AllowAll()
		eff = &a
	}
	if s.deps.Egress == nil {
		return false, fmt.Errorf("tenant %s has an egress guardrail, but this server enforces no egress: %w", e.owner, errdefs.ErrNotImplemented)
	}
	if ip == "" {
		st, err := s.deps.Runtime.Status(ctx, e.sb.ID)
		if err != nil {
			return false, err
		}
		ip = st.IP
	}
	return true, attachEgress(ctx, s.deps.Egress, e.sb.ID, ip, *eff)
}

// Activate turns claimed warm sandboxes (their locks not held) into
// ordinary ones with the settings of proto (a validated claim) and env
// (with idEnv, if set, naming each sandbox's own id: CreateRequest.IDEnv),
// persisted in one store write. On failure they are deleted.
func (s *Service) Activate(ctx context.Context, claimed []*Entry, proto Sandbox, env map[string]string, idEnv string) ([]Sandbox, error) {
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
	now := s.Now()
	if len(env) > 0 || idEnv != "" {
		if err := applyEnv(ctx, s.deps, claimed, env, idEnv); err != nil {
			for _, e := range claimed {
				e.delete(ctx, ReasonStopping) // the pool refills
			}
			return nil, errdefs.WithPublic(err, "SANDBOX::CLAIM_FAILED", "could not apply env to the claimed sandbox")
		}
	}
	for _, e := range claimed {
		attached, err := e.enforceEgress(ctx, proto.NetworkPolicy, false, "")
		if err != nil {
			for _, e := range claimed {
				e.delete(ctx, ReasonStopping) // detaches too
			}
			return nil, errdefs.WithPublic(err, "SANDBOX::EGRESS_FAILED", "could not apply the network policy")
		}
		if !attached {
			continue
		}
		if proto.NetworkPolicy != nil {
			np := proto.NetworkPolicy.Clone()
			e.sb.NetworkPolicy = &np
		}
		e.sb.EgressToken = NewToken()
	}
	kv := make(map[string]any, len(claimed))
	prev := make([]Sandbox, len(claimed))
	for i, e := range claimed {
		prev[i] = e.sb
		sb := &e.sb
		sb.Warm = false
		sb.Metadata = cloneMap(proto.Metadata)
		sb.Env = cloneMap(proto.Env)
		if idEnv != "" {
			sb.Env = withIDEnv(proto.Env, idEnv, sb.ID)
		}
		sb.Extensions = cloneMap(proto.Extensions)
		sb.RenewOnAccess = proto.RenewOnAccess
		sb.Platform = proto.Platform
		sb.CreatedAt = now
		sb.ExpiresAt = nil
		if proto.ExpiresAt != nil {
			exp := now.Add(proto.ExpiresAt.Sub(proto.CreatedAt))
			sb.ExpiresAt = &exp
		}
		e.mustTransition(StateRunning, ReasonRunning, "")
		kv[sb.ID] = sb
	}
	if err := s.deps.Store.PutMany(Bucket, kv); err != nil {
		for i, e := range claimed {
			e.sb = prev[i]
			e.delete(ctx, ReasonStopping)
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
func applyEnv(ctx context.Context, d Deps, claimed []*Entry, env map[string]string, idEnv string) error {
	errs := make([]error, len(claimed))
	var wg sync.WaitGroup
	for i, e := range claimed {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ep, err := d.Runtime.Endpoint(ctx, e.sb.ID, agentproto.Port)
			if err == nil {
				err = agentClient(d).SetEnv(ctx, ep, e.sb.AgentToken, withIDEnv(env, idEnv, e.sb.ID))
			}
			if err != nil {
				errs[i] = fmt.Errorf("set env on %s: %w", e.sb.ID, err)
			}
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

// AdoptClaimed takes in the sandboxes a runtime's pool handed to a claim
// (recs, Running records of owner; stored[i] when the runtime stored the
// record with its claim): it charges them, writes the records the
// runtime did not store in one write, and applies env (and idEnv, as
// Activate) through their agents. On failure they are deleted.
func (s *Service) AdoptClaimed(ctx context.Context, owner string, recs []Sandbox, stored []bool, env map[string]string, idEnv string) ([]Sandbox, error) {
	release := func(es []*Entry) {
		for _, e := range es {
			if err := s.deps.Runtime.Delete(ctx, e.sb.ID); err != nil {
				s.log.Error("release a claimed sandbox", "id", e.sb.ID, "err", err)
			}
		}
	}
	entries := make([]*Entry, len(recs))
	kv := make(map[string]any, len(recs))
	ids := make([]string, len(recs))
	var cpu, mem int64
	for i, sb := range recs {
		if idEnv != "" {
			sb.Env = withIDEnv(sb.Env, idEnv, sb.ID)
		}
		e := newEntry(s, sb)
		s.events.recordTransition(e, Status{State: StatePending})
		entries[i], ids[i] = e, e.sb.ID
		cpu, mem = sb.Resources.CPUMillis, sb.Resources.MemoryBytes
		if !stored[i] {
			kv[e.sb.ID] = &e.sb // stored below
		}
	}
	if err := s.quota.Admit(owner, ids, cpu, mem); err != nil {
		release(entries)
		return nil, err
	}
	if len(kv) > 0 {
		if err := s.deps.Store.PutMany(Bucket, kv); err != nil {
			for _, id := range ids {
				s.quota.release(id)
			}
			release(entries)
			return nil, err
		}
	}
	for _, e := range entries {
		e.mu.Lock()
		e.stored = true
		s.put(e)
	}
	defer func() {
		for _, e := range entries {
			e.mu.Unlock()
		}
	}()
	// Their policies hold before they are handed out.
	errs := make([]error, len(entries))
	var wg sync.WaitGroup
	for i, e := range entries {
		if e.sb.EgressToken != "" {
			wg.Go(func() { _, errs[i] = e.enforceEgress(ctx, e.sb.NetworkPolicy, true, "") })
		}
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		for _, e := range entries {
			e.delete(ctx, ReasonStopping)
		}
		return nil, errdefs.WithPublic(err, "SANDBOX::EGRESS_FAILED", "could not apply the network policy")
	}
	if (len(env) > 0 || idEnv != "") && len(entries) > 0 {
		if err := applyEnv(ctx, s.deps, entries, env, idEnv); err != nil {
			for _, e := range entries {
				e.delete(ctx, ReasonStopping)
			}
			return nil, errdefs.WithPublic(err, "SANDBOX::CLAIM_FAILED", "could not apply env to the claimed sandbox")
		}
	}
	out := make([]Sandbox, 0, len(entries))
	for _, e := range entries {
		out = append(out, e.sb.clone())
	}
	return out, nil
}

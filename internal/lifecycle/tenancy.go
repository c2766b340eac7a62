package lifecycle

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/moat-sandbox/moat/internal/egress/policy"
	"github.com/moat-sandbox/moat/internal/runtime"
	"github.com/moat-sandbox/moat/internal/tenant"
)

// Tenancy. Every sandbox, pool and snapshot records the tenant that owns
// it (Sandbox.Tenant, Pool.Tenant, Snapshot.Tenant; "" in records from
// before tenants = tenant.Default). The owner is the scope tenant of the
// context that created it (tenant.ScopeOf: the caller's key). Every lookup
// by id or name goes through visible, so a resource outside the caller's
// scope is not found, exactly like one that does not exist; lists filter
// with it too. A context without a principal (the server's own work) sees
// every tenant.

// Visible reports whether ctx may see a resource owned by owner.
func Visible(ctx context.Context, owner string) bool {
	return tenant.ScopeOf(ctx).Sees(owner)
}

// OwnerOf is the tenant that owns what ctx creates.
func OwnerOf(ctx context.Context) string {
	return tenant.Normalize(tenant.ScopeOf(ctx).Tenant)
}

// Own makes owner the tenant of a new sandbox record, and puts the named
// volumes it mounts in owner's namespace (VolumeKey), so that two tenants'
// claims of the same name are two volumes. Call it before newEntry.
func Own(sb *Sandbox, owner string) {
	sb.Tenant = owner
	for i := range sb.Claims {
		sb.Claims[i].Name = VolumeKey(owner, sb.Claims[i].Name)
	}
	for i := range sb.Mounts {
		if sb.Mounts[i].Volume != "" {
			sb.Mounts[i].Volume = VolumeKey(owner, sb.Mounts[i].Volume)
		}
	}
}

// VolumeKey is the runtime name of tenant owner's claim: the claim name
// for the default tenant (as before tenants), "<owner>.<claim>" for others
// (claim names have no dots, so the forms cannot collide).
func VolumeKey(owner, claim string) string {
	if owner = tenant.Normalize(owner); owner == tenant.Default {
		return claim
	}
	return owner + "." + claim
}

// Quotas gives each tenant's limits (tenant.Registry). Deps.Quotas nil:
// no tenant is limited.
type Quotas interface {
	// Quota returns the limits of tenant (zero: unlimited).
	Quota(tenant string) tenant.Quota
}

// Ledger counts what each tenant's live sandboxes hold, for quotas. A
// sandbox is charged when it is admitted (before it is provisioned, so
// that concurrent creates cannot together overrun a quota) or claimed from
// a pool, and released when it reaches a terminal state (setState) or is
// forgotten. Idle warm-pool sandboxes are not charged: a claim is. The
// ledger is keyed by sandbox id, so a release is idempotent and a double
// charge impossible.
type Ledger struct {
	q       Quotas // nil: no limits
	mu      sync.Mutex
	charges map[string]charge
	used    map[string]tenant.Usage
}

type charge struct {
	tenant   string
	cpu, mem int64
}

func newLedger(q Quotas) *Ledger {
	return &Ledger{q: q, charges: map[string]charge{}, used: map[string]tenant.Usage{}}
}

// Admit charges ids (new sandboxes of owner, cpu millicores and mem bytes
// each) if the quota allows them all; otherwise it charges none.
func (l *Ledger) Admit(owner string, ids []string, cpu, mem int64) error {
	return l.admit(l.q, owner, ids, cpu, mem)
}

// Check reports whether the quota would admit n more sandboxes of owner
// now, without charging anything (a batch's early answer; Admit decides).
func (l *Ledger) Check(owner string, n int, cpu, mem int64) error {
	return l.check(l.q, owner, n, cpu, mem)
}

// Release uncharges sandbox id (no-op if it is not charged).
func (l *Ledger) Release(id string) { l.release(id) }

// admit charges ids (new sandboxes of owner, cpu millicores and mem bytes
// each) if q allows them all; otherwise it charges none. q nil admits.
func (l *Ledger) admit(q Quotas, owner string, ids []string, cpu, mem int64) error {
	owner = tenant.Normalize(owner)
	l.mu.Lock()
	defer l.mu.Unlock()
	var fresh []string
	for _, id := range ids {
		if _, ok := l.charges[id]; !ok {
			fresh = append(fresh, id)
		}
	}
	if q != nil {
		if err := q.Quota(owner).Admit(owner, l.used[owner], len(fresh), cpu, mem); err != nil {
			return err
		}
	}
	for _, id := range fresh {
		l.charges[id] = charge{tenant: owner, cpu: cpu, mem: mem}
		l.used[owner] = l.used[owner].Add(1, cpu, mem)
	}
	return nil
}

// check reports whether q would admit n more sandboxes of owner now,
// without charging anything (a batch's early answer; admit still decides).
func (l *Ledger) check(q Quotas, owner string, n int, cpu, mem int64) error {
	if q == nil {
		return nil
	}
	owner = tenant.Normalize(owner)
	l.mu.Lock()
	defer l.mu.Unlock()
	return q.Quota(owner).Admit(owner, l.used[owner], n, cpu, mem)
}

// release uncharges sandbox id (no-op if it is not charged).
func (l *Ledger) release(id string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	c, ok := l.charges[id]
	if !ok {
		return
	}
	delete(l.charges, id)
	u := l.used[c.tenant].Add(-1, c.cpu, c.mem)
	if u == (tenant.Usage{}) {
		delete(l.used, c.tenant)
	} else {
		l.used[c.tenant] = u
	}
}

// usage returns what owner's live sandboxes hold.
func (l *Ledger) usage(owner string) tenant.Usage {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.used[tenant.Normalize(owner)]
}

// TenantUsage returns what a tenant's live sandboxes hold (quota usage).
func (s *Service) TenantUsage(name string) tenant.Usage { return s.quota.usage(name) }

// TenantSandboxes counts the sandboxes (of any state) tenant name owns.
func (s *Service) TenantSandboxes(name string) int {
	name = tenant.Normalize(name)
	s.mu.RLock()
	defer s.mu.RUnlock()
	n := 0
	for _, e := range s.sandboxes {
		if tenant.Normalize(e.owner) == name {
			n++
		}
	}
	return n
}

// Guardrails gives each tenant's egress guardrail (tenant.Registry).
// Deps.Guardrails nil: no tenant has one.
type Guardrails interface {
	// EgressGuardrail returns the guardrail of tenant (nil: none).
	EgressGuardrail(tenant string) *policy.NetworkPolicy
}

// effective is the policy enforced on a sandbox of owner whose own policy
// is own (nil: none): policy.Effective under owner's guardrail. Nil: the
// sandbox is not filtered.
func (s *Service) effective(owner string, own *policy.NetworkPolicy) (*policy.NetworkPolicy, error) {
	return policy.Effective(s.EgressGuardrail(owner), own)
}

// EgressGuardrail returns the egress guardrail of tenant owner (nil: none).
func (s *Service) EgressGuardrail(owner string) *policy.NetworkPolicy {
	if s.deps.Guardrails == nil {
		return nil
	}
	return s.deps.Guardrails.EgressGuardrail(owner)
}

// EnforcesEgress reports whether this server enforces network policies
// (tenant guardrails need it).
func (s *Service) EnforcesEgress() bool { return s.deps.Egress != nil }

// ApplyGuardrail enforces tenant name's current guardrail on its sandboxes
// at once: each filtered sandbox gets its new effective policy through the
// same live update as the egress API's PATCH /policy, and a running one
// that was not filtered (no policy of its own) is attached. It returns how
// many sandboxes it changed. Idle warm-pool sandboxes get theirs when
// claimed. A sandbox that cannot be updated is logged and counted out.
func (s *Service) ApplyGuardrail(ctx context.Context, name string) (int, error) {
	if s.deps.Egress == nil {
		return 0, nil
	}
	name = tenant.Normalize(name)
	n := 0
	var errs []error
	s.Each(func(e *Entry) {
		sb := &e.sb
		if tenant.Normalize(e.owner) != name || sb.Warm || isTerminal(sb.Status.State) {
			return
		}
		eff, err := s.effective(e.owner, sb.NetworkPolicy)
		if err != nil {
			errs = append(errs, fmt.Errorf("sandbox %s: %w", sb.ID, err))
			return
		}
		switch {
		case sb.EgressToken != "":
			next := policy.AllowAll() // own policy nil and guardrail removed: nothing to filter
			if eff != nil {
				next = *eff
			}
			_, err = s.deps.Egress.Modify(ctx, sb.ID, func(policy.NetworkPolicy) (policy.NetworkPolicy, error) { return next, nil })
		case eff != nil && sb.Status.State == StateRunning:
			var st runtime.Status
			if st, err = s.deps.Runtime.Status(ctx, sb.ID); err == nil {
				if err = attachEgress(ctx, s.deps.Egress, sb.ID, st.IP, *eff); err == nil {
					sb.EgressToken = NewToken()
					err = e.persist()
				}
			}
		default:
			return
		}
		if err != nil {
			s.log.Error("apply tenant egress guardrail", "tenant", name, "id", sb.ID, "err", err)
			errs = append(errs, fmt.Errorf("sandbox %s: %w", sb.ID, err))
			return
		}
		n++
	})
	return n, errors.Join(errs...)
}

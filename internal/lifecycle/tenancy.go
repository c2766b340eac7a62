package lifecycle

import (
	"context"
	"fmt"
	"strings"
	"sync"

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

// visible reports whether ctx may see a resource owned by owner.
func visible(ctx context.Context, owner string) bool {
	return tenant.ScopeOf(ctx).Sees(owner)
}

// ownerOf is the tenant that owns what ctx creates.
func ownerOf(ctx context.Context) string {
	return tenant.Normalize(tenant.ScopeOf(ctx).Tenant)
}

// own makes owner the tenant of a new sandbox record, and puts the named
// volumes it mounts in owner's namespace (volumeKey), so that two tenants'
// claims of the same name are two volumes. Call it before newEntry.
func own(sb *Sandbox, owner string) {
	sb.Tenant = owner
	for i := range sb.Claims {
		sb.Claims[i].Name = volumeKey(owner, sb.Claims[i].Name)
	}
	for i := range sb.Mounts {
		if sb.Mounts[i].Volume != "" {
			sb.Mounts[i].Volume = volumeKey(owner, sb.Mounts[i].Volume)
		}
	}
}

// volumeKey is the runtime name of tenant owner's claim: the claim name
// for the default tenant (as before tenants), "<owner>.<claim>" for others
// (claim names have no dots, so the forms cannot collide).
func volumeKey(owner, claim string) string {
	if owner = tenant.Normalize(owner); owner == tenant.Default {
		return claim
	}
	return owner + "." + claim
}

// volumeOwner is the tenant of a runtime volume name.
func volumeOwner(key string) string {
	if owner, _, ok := strings.Cut(key, "."); ok {
		return owner
	}
	return tenant.Default
}

// volumeLookup maps a volume name of the API to its runtime name in ctx's
// scope: a plain name is the acting tenant's claim; a qualified one
// ("<tenant>.<claim>", as an admin's list shows other tenants' volumes)
// only resolves for a scope that sees that tenant. ok is false for a name
// that cannot be a volume of the scope.
func volumeLookup(ctx context.Context, name string) (key string, ok bool) {
	if !runtime.ValidVolumeName(name) {
		return "", false
	}
	if strings.Contains(name, ".") {
		owner, claim, _ := strings.Cut(name, ".")
		if strings.Contains(claim, ".") || tenant.Normalize(owner) == tenant.Default || !visible(ctx, owner) {
			return "", false
		}
		return name, true
	}
	return volumeKey(ownerOf(ctx), name), true
}

// volumeDisplay is the API name of runtime volume key for ctx: the plain
// claim name in the acting tenant, the qualified name otherwise (an
// admin's view of other tenants).
func volumeDisplay(ctx context.Context, key string) string {
	owner, claim, ok := strings.Cut(key, ".")
	if ok && owner == ownerOf(ctx) {
		return claim
	}
	return key
}

// Quotas gives each tenant's limits (tenant.Registry). Deps.Quotas nil:
// no tenant is limited.
type Quotas interface {
	// Quota returns the limits of tenant (zero: unlimited).
	Quota(tenant string) tenant.Quota
}

// ledger counts what each tenant's live sandboxes hold, for quotas. A
// sandbox is charged when it is admitted (before it is provisioned, so
// that concurrent creates cannot together overrun a quota) or claimed from
// a pool, and released when it reaches a terminal state (setState) or is
// forgotten. Idle warm-pool sandboxes are not charged: a claim is. The
// ledger is keyed by sandbox id, so a release is idempotent and a double
// charge impossible.
type ledger struct {
	mu      sync.Mutex
	charges map[string]charge
	used    map[string]tenant.Usage
}

type charge struct {
	tenant   string
	cpu, mem int64
}

func newLedger() *ledger {
	return &ledger{charges: map[string]charge{}, used: map[string]tenant.Usage{}}
}

// admit charges ids (new sandboxes of owner, cpu millicores and mem bytes
// each) if q allows them all; otherwise it charges none. q nil admits.
func (l *ledger) admit(q Quotas, owner string, ids []string, cpu, mem int64) error {
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
func (l *ledger) check(q Quotas, owner string, n int, cpu, mem int64) error {
	if q == nil {
		return nil
	}
	owner = tenant.Normalize(owner)
	l.mu.Lock()
	defer l.mu.Unlock()
	return q.Quota(owner).Admit(owner, l.used[owner], n, cpu, mem)
}

// release uncharges sandbox id (no-op if it is not charged).
func (l *ledger) release(id string) {
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
func (l *ledger) usage(owner string) tenant.Usage {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.used[tenant.Normalize(owner)]
}

// admitEntry charges one new sandbox record against its owner's quota.
func (s *Service) admitEntry(sb *Sandbox) error {
	return s.quota.admit(s.deps.Quotas, sb.Tenant, []string{sb.ID}, sb.Resources.CPUMillis, sb.Resources.MemoryBytes)
}

// TenantUsage returns what a tenant's live sandboxes hold (quota usage).
func (s *Service) TenantUsage(name string) tenant.Usage { return s.quota.usage(name) }

// TenantInUse describes what tenant name still owns ("" if nothing): its
// sandboxes (of any state), pools and snapshots. A tenant is deleted only
// when it owns nothing, so that nothing is left without an owner.
func (s *Service) TenantInUse(name string) string {
	name = tenant.Normalize(name)
	var sbs, pools, snaps int
	s.mu.RLock()
	for _, e := range s.sandboxes {
		if tenant.Normalize(e.owner) == name {
			sbs++
		}
	}
	s.mu.RUnlock()
	s.poolsMu.Lock()
	for _, pl := range s.pools {
		if tenant.Normalize(pl.owner) == name {
			pools++
		}
	}
	s.poolsMu.Unlock()
	s.snapMu.Lock()
	for _, sn := range s.snaps {
		if tenant.Normalize(sn.Tenant) == name {
			snaps++
		}
	}
	s.snapMu.Unlock()
	if sbs+pools+snaps == 0 {
		return ""
	}
	return fmt.Sprintf("%d sandboxes, %d pools and %d snapshots", sbs, pools, snaps)
}

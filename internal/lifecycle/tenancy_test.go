package lifecycle

import (
	"context"
	"testing"
	"time"

	"github.com/moat-sandbox/moat/internal/errdefs"
	"github.com/moat-sandbox/moat/internal/runtime"
	"github.com/moat-sandbox/moat/internal/tenant"
)

func as(tn string, role tenant.Role) context.Context {
	return tenant.WithPrincipal(context.Background(), tenant.Principal{KeyID: tn + "-key", Tenant: tn, Role: role})
}

type quotas map[string]tenant.Quota

func (q quotas) Quota(t string) tenant.Quota { return q[t] }

// The quota ledger charges at admission, releases on every way out
// (delete, failed create), and is rebuilt by Recover.
func TestQuotaLedger(t *testing.T) {
	h := newHarness(t)
	h.svc.deps.Quotas = quotas{"acme": {Sandboxes: 2}}
	h.svc.quota.q = h.svc.deps.Quotas
	acme := as("acme", tenant.RoleOperator)
	a, err := h.svc.Create(acme, req(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := h.svc.Create(acme, req(time.Hour)); err != nil {
		t.Fatal(err)
	}
	if _, err := h.svc.Create(acme, req(time.Hour)); !errdefs.IsFailedPrecondition(err) && !isQuota(err) {
		t.Fatalf("third create: %v", err)
	}
	// Another tenant is not limited by acme's quota.
	if _, err := h.svc.Create(as("beta", tenant.RoleOperator), req(time.Hour)); err != nil {
		t.Fatal(err)
	}
	if err := h.svc.Delete(acme, a.ID); err != nil {
		t.Fatal(err)
	}
	if u := h.svc.TenantUsage("acme"); u.Sandboxes != 1 {
		t.Fatalf("usage after delete = %+v", u)
	}
	// A create that fails releases its charge.
	h.hooks.Create = func(spec runtime.Spec) error { return errdefs.ErrUnavailable }
	if _, err := h.svc.Create(acme, req(time.Hour)); err == nil {
		t.Fatal("create did not fail")
	}
	h.hooks.Create = nil
	if u := h.svc.TenantUsage("acme"); u.Sandboxes != 1 {
		t.Fatalf("usage after a failed create = %+v", u)
	}
	// A restarted service counts the same.
	svc := h.newService(t)
	t.Cleanup(svc.Close)
	if err := svc.Recover(context.Background()); err != nil {
		t.Fatal(err)
	}
	if u := svc.TenantUsage("acme"); u.Sandboxes != 1 {
		t.Errorf("usage after recovery = %+v", u)
	}
	if u := svc.TenantUsage("beta"); u.Sandboxes != 1 {
		t.Errorf("beta usage after recovery = %+v", u)
	}
}

func isQuota(err error) bool {
	p, ok := errdefs.PublicOf(err)
	return ok && p.Code == tenant.CodeQuotaExceeded
}

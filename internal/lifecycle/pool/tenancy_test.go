package pool

import (
	"context"
	"testing"
	"time"

	"github.com/moat-sandbox/moat/internal/errdefs"
	"github.com/moat-sandbox/moat/internal/lifecycle"
	"github.com/moat-sandbox/moat/internal/tenant"
)

func as(tn string, role tenant.Role) context.Context {
	return tenant.WithPrincipal(context.Background(), tenant.Principal{KeyID: tn + "-key", Tenant: tn, Role: role})
}

// Records written before tenants existed have no owner: after a restart
// they belong to the default tenant, and only it (and admins) see them.
func TestPreTenantRecordsBelongToDefault(t *testing.T) {
	h := newHarness(t)
	ctx := context.Background()
	sb, err := h.svc.Create(ctx, req(time.Hour)) // no principal: the server itself
	if err != nil {
		t.Fatal(err)
	}
	// Rewrite the record as an old server wrote it: no tenant field.
	var rec map[string]any
	if err := h.db.Get(lifecycle.Bucket, sb.ID, &rec); err != nil {
		t.Fatal(err)
	}
	if rec["tenant"] != "default" {
		t.Fatalf("a server-created record's tenant = %v", rec["tenant"])
	}
	delete(rec, "tenant")
	if err := h.db.Put(lifecycle.Bucket, sb.ID, rec); err != nil {
		t.Fatal(err)
	}
	if err := h.db.Put(PoolBucket, "old", map[string]any{"name": "old", "template": map[string]any{"image": "busybox", "entrypoint": []string{"sh"}},
		"capacitySpec": map[string]int{"poolMax": 1}, "revision": 1}); err != nil {
		t.Fatal(err)
	}
	svc := h.newService(t)
	t.Cleanup(svc.Close)
	if err := svc.Recover(ctx); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		ctx  context.Context
		want bool
	}{
		{as(tenant.Default, tenant.RoleViewer), true},
		{as("acme", tenant.RoleOperator), false},
		{tenant.WithPrincipal(ctx, tenant.Principal{Tenant: "acme", Role: tenant.RolePlatform, AllTenants: true}), true},
	} {
		_, err := svc.Get(tc.ctx, sb.ID)
		if (err == nil) != tc.want {
			t.Errorf("%+v sees the old sandbox: %v, want %v", tenant.ScopeOf(tc.ctx), err, tc.want)
		}
		_, _, perr := svc.GetPool(tc.ctx, "old")
		if tc.want && tenant.ScopeOf(tc.ctx).Tenant == tenant.Default && perr != nil {
			t.Errorf("default tenant does not see the old pool: %v", perr)
		}
		if tenant.ScopeOf(tc.ctx).Tenant == "acme" && !errdefs.IsNotFound(perr) {
			t.Errorf("acme sees the default tenant's pool by name: %v", perr)
		}
	}
	// The recovered live sandbox counts against the default tenant's quota.
	if u := svc.TenantUsage(tenant.Default); u.Sandboxes != 1 {
		t.Errorf("usage after recovery = %+v", u)
	}
}

package client

import (
	"context"
	"errors"
	"net/url"
	"testing"
)

func TestAccessAPI(t *testing.T) {
	const key = `{"id":"k1","name":"ci","tenant":"acme","role":"operator","active":true,"createdAt":"2026-12-03T10:00:00Z","createdBy":"root"}`
	f := newFake(t)
	f.handle("GET /v1/whoami", raw(200, `{"keyId":"k1","tenant":"acme","role":"operator","allTenants":false}`))
	f.handle("POST /v1/keys", raw(201, `{"id":"k1","name":"ci","tenant":"acme","role":"operator","active":true,"key":"moat_k1_secret"}`))
	f.handle("GET /v1/keys", raw(200, `{"items":[`+key+`]}`))
	f.handle("GET /v1/keys/{id}", raw(200, key))
	f.handle("DELETE /v1/keys/{id}", raw(204, ``))
	f.handle("GET /v1/tenants", raw(200, `{"items":[{"name":"acme","quota":{"sandboxes":2},"usage":{"sandboxes":1,"cpu":"1","memory":"512Mi"}}]}`))
	f.handle("PUT /v1/tenants/{name}", raw(201, `{"name":"acme","quota":{"sandboxes":2,"cpu":"4"},"usage":{"sandboxes":0,"cpu":"0","memory":"0"}}`))
	f.handle("GET /v1/tenants/{name}", raw(404, `{"code":"TENANT::NOT_FOUND","message":"tenant beta not found"}`))
	f.handle("DELETE /v1/tenants/{name}", raw(409, `{"code":"TENANT::IN_USE","message":"in use"}`))
	c := mustClient(t, f.srv.URL, WithAPIKey("k"), WithTenant("acme"))
	ctx := context.Background()
	p, err := c.Whoami(ctx)
	if err != nil || p.Tenant != "acme" || p.Role != RoleOperator || p.AllTenants {
		t.Fatalf("whoami %+v %v", p, err)
	}
	if h := f.last("/v1/whoami").Header; h.Get(TenantHeader) != "acme" || h.Get(APIKeyHeader) != "k" {
		t.Errorf("headers %v", h)
	}
	k, err := c.CreateKey(ctx, KeySpec{Tenant: "acme", Role: RoleOperator, Name: "ci"})
	if err != nil || k.Key != "moat_k1_secret" || k.ID != "k1" || !k.Active {
		t.Fatalf("create %+v %v", k, err)
	}
	if b := decodeBody(t, f.last("/v1/keys").Body); b["tenant"] != "acme" || b["role"] != "operator" || b["name"] != "ci" || len(b) != 3 {
		t.Errorf("create body %v", b)
	}
	ks, err := c.ListKeys(ctx, "acme")
	if err != nil || len(ks) != 1 || ks[0].CreatedBy != "root" {
		t.Fatalf("list %+v %v", ks, err)
	}
	if q, _ := url.ParseQuery(f.last("/v1/keys").RawQuery); q.Get("tenant") != "acme" {
		t.Errorf("list query %v", q)
	}
	if g, err := c.GetKey(ctx, "k1"); err != nil || g.Name != "ci" {
		t.Fatalf("get %+v %v", g, err)
	}
	if err := c.RevokeKey(ctx, "k1"); err != nil || f.last("/v1/keys/k1").Method != "DELETE" {
		t.Fatalf("revoke %v", err)
	}
	ts, err := c.ListTenants(ctx)
	if err != nil || len(ts) != 1 || ts[0].Quota.Sandboxes != 2 || ts[0].Usage.Memory != "512Mi" {
		t.Fatalf("tenants %+v %v", ts, err)
	}
	tn, err := c.PutTenant(ctx, "acme", TenantQuota{Sandboxes: 2, CPU: "4"})
	if err != nil || tn.Quota.CPU != "4" {
		t.Fatalf("put %+v %v", tn, err)
	}
	if b := string(f.last("/v1/tenants/acme").Body); b != `{"quota":{"sandboxes":2,"cpu":"4"}}` {
		t.Errorf("put body %s", b)
	}
	if _, err := c.GetTenant(ctx, "beta"); !IsNotFound(err) {
		t.Errorf("get other tenant: %v", err)
	}
	if err := c.DeleteTenant(ctx, "acme"); !IsConflict(err) {
		t.Errorf("delete in use: %v", err)
	}
}

func TestQuotaErrorClass(t *testing.T) {
	quota := &APIError{StatusCode: 403, Code: "TENANT::QUOTA_EXCEEDED"}
	role := &APIError{StatusCode: 403, Code: "PERMISSION_DENIED"}
	if !errors.Is(quota, ErrQuotaExceeded) || errors.Is(quota, ErrUnauthorized) {
		t.Errorf("quota refusal classes wrong")
	}
	if errors.Is(role, ErrQuotaExceeded) || !errors.Is(role, ErrUnauthorized) {
		t.Errorf("role refusal classes wrong")
	}
}

package httpapi_test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/moat-sandbox/moat/internal/egress/policy"
	"github.com/moat-sandbox/moat/internal/lifecycle"
	"github.com/moat-sandbox/moat/internal/sandbox"
)

// TestTenantAdminManagesItsTenant: a tenant admin manages its own tenant's
// keys (up to admin) and nothing else; only the server's own key grants
// platform; whoami says what a key sees.
func TestTenantAdminManagesItsTenant(t *testing.T) {
	ta := newTenantAPI(t, sandbox.Config{}, sandbox.Deps{})
	code, body := ta.do(t, "acme-admin", "POST", "/v1/keys", `{"tenant":"acme","role":"admin","name":"deputy"}`)
	if code != 201 || body["tenant"] != "acme" || body["role"] != "admin" {
		t.Fatalf("acme admin creates an acme admin: %d %v", code, body)
	}
	deputy := body["id"].(string)
	for i, tc := range []struct{ body, code string }{
		{`{"tenant":"beta","role":"viewer"}`, "TENANT::NOT_FOUND"},    // another tenant: as if absent
		{`{"tenant":"default","role":"viewer"}`, "TENANT::NOT_FOUND"}, // the server's tenant too
		{`{"tenant":"acme","role":"platform"}`, "PERMISSION_DENIED"},  // only the server key grants it
		{`{"tenant":"acme","role":"superuser"}`, "KEY::INVALID_ROLE"}, // no such role
		{`{"tenant":"newco","role":"operator"}`, "TENANT::NOT_FOUND"}, // no new tenants either
	} {
		code, body := ta.do(t, "acme-admin", "POST", "/v1/keys", tc.body)
		if body["code"] != tc.code || body["message"] == nil || len(body) != 2 {
			t.Errorf("%d: %s: %d %v, want %s", i, tc.body, code, body, tc.code)
		}
	}
	if _, err := ta.reg.Tenant("newco"); err == nil {
		t.Error("a tenant admin created a tenant")
	}
	// A platform key (not the server's own) cannot grant platform either.
	if code, body := ta.do(t, "acme-platform", "POST", "/v1/keys", `{"tenant":"default","role":"platform"}`); code != 403 || body["code"] != "PERMISSION_DENIED" {
		t.Errorf("platform key granting platform: %d %v", code, body)
	}
	code, body = ta.do(t, "root", "POST", "/v1/keys", `{"tenant":"default","role":"platform","name":"ops"}`)
	if code != 201 || body["role"] != "platform" {
		t.Fatalf("server key grants platform: %d %v", code, body)
	}
	ops := body["id"].(string)
	// Listing: acme's keys only, never a platform key; the platform key
	// lists everything.
	_, list := ta.do(t, "acme-admin", "GET", "/v1/keys", "")
	s := fmt.Sprint(list["items"])
	if !strings.Contains(s, deputy) || strings.Contains(s, ta.ids["beta-viewer"]) || strings.Contains(s, "root") || strings.Contains(s, ops) || strings.Contains(s, "platform") {
		t.Errorf("acme admin lists %v", s)
	}
	if code, body := ta.do(t, "acme-admin", "GET", "/v1/keys/"+ta.ids["acme-platform"], ""); code != 404 || body["code"] != "KEY::NOT_FOUND" {
		t.Errorf("acme admin gets its tenant's platform key: %d %v", code, body)
	}
	if code, _ := ta.do(t, "acme-admin", "DELETE", "/v1/keys/"+ta.ids["beta-viewer"], ""); code != 404 {
		t.Errorf("acme admin revokes beta's key: %d", code)
	}
	if code, _ := ta.do(t, "acme-admin", "DELETE", "/v1/keys/"+deputy, ""); code != 204 {
		t.Errorf("acme admin revokes its deputy: %d", code)
	}
	// Quotas are the platform's: a tenant admin cannot raise its own.
	if code, body := ta.do(t, "acme-admin", "PUT", "/v1/tenants/acme", `{"quota":{"sandboxes":1000}}`); code != 403 || body["code"] != "PERMISSION_DENIED" {
		t.Errorf("acme admin sets its quota: %d %v", code, body)
	}
	if code, body := ta.do(t, "acme-admin", "GET", "/v1/tenants/acme", ""); code != 200 || body["name"] != "acme" {
		t.Errorf("acme admin reads its tenant: %d %v", code, body)
	}
	if _, body := ta.do(t, "acme-admin", "GET", "/v1/tenants", ""); fmt.Sprint(body["items"]) != fmt.Sprint([]any{body["items"].([]any)[0]}) || !strings.Contains(fmt.Sprint(body), "acme") {
		t.Errorf("acme admin lists tenants %v", body)
	}
	for who, want := range map[string]string{"acme-admin": "tenant acme only (its resources and its keys)", "root": "all tenants", "acme-viewer": "tenant acme only"} {
		if code, body := ta.do(t, who, "GET", "/v1/whoami", ""); code != 200 || body["sees"] != want {
			t.Errorf("whoami %s: %d %v, want sees %q", who, code, body, want)
		}
	}
	if _, body := ta.do(t, "root", "GET", "/v1/whoami", "", "X-Moat-Tenant", "acme"); !strings.Contains(fmt.Sprint(body["sees"]), "tenant acme") || body["allTenants"] != false {
		t.Errorf("narrowed platform whoami: %v", body)
	}
}

// TestTenantEgressGuardrail: the platform sets a tenant's guardrail; the
// tenant's sandboxes are enforced with the intersection at create and at
// once when it changes; the egress API shows own, tenant and effective;
// a sandbox cannot widen it; bad policies are a clear 400.
func TestTenantEgressGuardrail(t *testing.T) {
	eg := &memEgress{}
	ta := newTenantAPI(t, sandbox.Config{}, sandbox.Deps{Deps: lifecycle.Deps{Egress: eg}, Committer: committer{}})
	// One sandbox with its own policy, one without, before the guardrail.
	code, body := ta.do(t, "acme-operator", "POST", "/v1/sandboxes", `{"image":{"uri":"busybox"},"entrypoint":["sh"],"networkPolicy":`+
		`{"defaultAction":"allow","egress":[{"action":"deny","target":"ads.test"}]}}`)
	if code != 202 {
		t.Fatalf("create: %d %v", code, body)
	}
	own := body["id"].(string)
	code, body = ta.do(t, "acme-operator", "POST", "/v1/sandboxes", createBody)
	if code != 202 {
		t.Fatalf("create: %d %v", code, body)
	}
	bare := body["id"].(string)
	code, body = ta.do(t, "beta-operator", "POST", "/v1/sandboxes", `{"image":{"uri":"busybox"},"entrypoint":["sh"],"networkPolicy":{"defaultAction":"allow"}}`)
	if code != 202 {
		t.Fatalf("beta create: %d %v", code, body)
	}
	beta := body["id"].(string)

	guard := `{"defaultAction":"deny","egress":[{"action":"allow","target":"*.corp.test"},{"action":"allow","target":"ads.test"}]}`
	for i, tc := range []struct {
		who, body string
		code      int
		errCode   string
	}{
		{"acme-admin", guard, 403, "PERMISSION_DENIED"},
		{"root", `{"defaultAction":"sometimes"}`, 400, "TENANT::INVALID_EGRESS_POLICY"},
		{"root", `{"egress":[{"action":"allow","target":"*"}]}`, 400, "TENANT::INVALID_EGRESS_POLICY"},
		{"root", `{"egress":`, 400, "TENANT::INVALID_EGRESS_POLICY"},
		{"root", ``, 400, "TENANT::INVALID_EGRESS_POLICY"},
	} {
		code, body := ta.do(t, tc.who, "PUT", "/v1/tenants/acme/egress", tc.body)
		if code != tc.code || body["code"] != tc.errCode || body["message"] == nil {
			t.Errorf("%d: %d %v, want %d %s", i, code, body, tc.code, tc.errCode)
		}
	}
	if code, body := ta.do(t, "root", "PUT", "/v1/tenants/nope/egress", guard); code != 404 || body["code"] != "TENANT::NOT_FOUND" {
		t.Errorf("unknown tenant: %d %v", code, body)
	}
	code, body = ta.do(t, "root", "PUT", "/v1/tenants/acme/egress", guard)
	if code != 200 || body["applied"] != float64(2) || body["policy"] == nil {
		t.Fatalf("set guardrail: %d %v", code, body)
	}
	// Both acme sandboxes now run under it; beta's is untouched.
	eff := func(id string) policy.NetworkPolicy {
		p, err := eg.Get(id)
		if err != nil {
			t.Fatalf("%s not attached: %v", id, err)
		}
		return p
	}
	m := func(p policy.NetworkPolicy) *policy.Matcher { mm, _ := policy.Compile(p); return mm }
	if p := m(eff(own)); p.Evaluate("ads.test") != policy.Deny || p.Evaluate("a.corp.test") != policy.Allow || p.Evaluate("evil.test") != policy.Deny {
		t.Errorf("own sandbox's effective policy: %+v", eff(own))
	}
	if p := m(eff(bare)); p.Evaluate("ads.test") != policy.Allow || p.Evaluate("evil.test") != policy.Deny {
		t.Errorf("bare sandbox's effective policy: %+v", eff(bare))
	}
	if eff(beta).Mode() != policy.ModeAllowAll {
		t.Errorf("beta's sandbox changed: %+v", eff(beta))
	}
	// Readable by the tenant: the guardrail, and each layer of a sandbox.
	if code, body := ta.do(t, "acme-viewer", "GET", "/v1/tenants/acme/egress", ""); code != 200 || body["policy"] == nil {
		t.Errorf("viewer reads its guardrail: %d %v", code, body)
	}
	if code, body := ta.do(t, "beta-admin", "GET", "/v1/tenants/acme/egress", ""); code != 404 {
		t.Errorf("beta reads acme's guardrail: %d %v", code, body)
	}
	code, body = ta.do(t, "acme-operator", "GET", "/v1/sandboxes/"+own+"/egress/policy", "")
	if code != 200 || body["tenantPolicy"] == nil || body["effectivePolicy"] == nil || body["mode"] != "enforcing" ||
		body["policy"].(map[string]any)["defaultAction"] != "allow" {
		t.Errorf("egress GET: %d %v", code, body)
	}
	// A sandbox cannot widen it: its own allow of evil.test stays denied.
	code, body = ta.do(t, "acme-operator", "PATCH", "/v1/sandboxes/"+own+"/egress/policy", `[{"action":"allow","target":"evil.test"}]`)
	if code != 200 || m(eff(own)).Evaluate("evil.test") != policy.Deny || !strings.Contains(fmt.Sprint(body["policy"]), "evil.test") {
		t.Errorf("widening PATCH: %d %v, effective %+v", code, body, eff(own))
	}
	// ...but it can narrow it.
	ta.do(t, "acme-operator", "PATCH", "/v1/sandboxes/"+own+"/egress/policy", `[{"action":"deny","target":"*.corp.test"}]`)
	if m(eff(own)).Evaluate("a.corp.test") != policy.Deny {
		t.Errorf("narrowing PATCH: effective %+v", eff(own))
	}
	// A new sandbox without a policy is created under the guardrail, and
	// gets an egress API showing it.
	code, body = ta.do(t, "acme-operator", "POST", "/v1/sandboxes", createBody)
	if code != 202 {
		t.Fatalf("create under the guardrail: %d %v", code, body)
	}
	fresh := body["id"].(string)
	if m(eff(fresh)).Evaluate("evil.test") != policy.Deny {
		t.Errorf("new sandbox: %+v", eff(fresh))
	}
	if code, body := ta.do(t, "acme-operator", "GET", "/v1/sandboxes/"+fresh+"/egress/policy", ""); code != 200 || body["effectivePolicy"] == nil {
		t.Errorf("new sandbox's egress GET: %d %v", code, body)
	}
	// A sandbox claimed from a warm pool is attached under it at the claim.
	pool := `{"name":"warm","template":{"image":{"uri":"busybox"},"entrypoint":["sh"]},"capacitySpec":{"bufferMin":1,"bufferMax":1,"poolMin":0,"poolMax":2}}`
	if code, body := ta.do(t, "acme-operator", "POST", "/v1/pools", pool); code != 201 {
		t.Fatalf("pool: %d %v", code, body)
	}
	code, body = ta.do(t, "acme-operator", "POST", "/v1/sandboxes", `{"extensions":{"poolRef":"warm"},"entrypoint":["sh"]}`)
	if code != 202 {
		t.Fatalf("claim: %d %v", code, body)
	}
	claimed := body["id"].(string)
	if m(eff(claimed)).Evaluate("evil.test") != policy.Deny {
		t.Errorf("claimed sandbox: %+v", eff(claimed))
	}
	// Removing the guardrail gives each sandbox its own policy back.
	code, body = ta.do(t, "root", "DELETE", "/v1/tenants/acme/egress", "")
	if code != 200 || body["policy"] != nil || body["applied"] != float64(4) {
		t.Errorf("remove guardrail: %d %v", code, body)
	}
	if p := m(eff(own)); p.Evaluate("evil.test") != policy.Allow || p.Evaluate("ads.test") != policy.Deny {
		t.Errorf("own policy back: %+v", eff(own))
	}
	if eff(fresh).Mode() != policy.ModeAllowAll {
		t.Errorf("the guarded-only sandbox: %+v", eff(fresh))
	}
}

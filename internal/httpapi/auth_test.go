package httpapi_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/moat-sandbox/moat/internal/audit"
	"github.com/moat-sandbox/moat/internal/errdefs"
	"github.com/moat-sandbox/moat/internal/httpapi"
	"github.com/moat-sandbox/moat/internal/metrics"
	"github.com/moat-sandbox/moat/internal/runtime/fake"
	"github.com/moat-sandbox/moat/internal/sandbox"
	"github.com/moat-sandbox/moat/internal/store"
	"github.com/moat-sandbox/moat/internal/tenant"
)

// tenantAPI is an API server with a tenant registry: the server's own key
// (key, admin of the default tenant) plus keys of tenants acme and beta.
type tenantAPI struct {
	srv   *httptest.Server
	api   *httpapi.Server
	reg   *tenant.Registry
	svc   *sandbox.Service
	audit *audit.Memory
	keys  map[string]string // "acme-operator" -> key
	ids   map[string]string // "acme-operator" -> key id
}

// cookieSessions is a stand-in for the console's session resolver: cookie
// "session=<key id>" resolves through the registry; "session=bad" is an
// unusable session.
type cookieSessions struct{ reg *tenant.Registry }

func (c cookieSessions) ResolveSession(r *http.Request) (tenant.Principal, bool, error) {
	ck, err := r.Cookie("session")
	if err != nil {
		return tenant.Principal{}, false, nil
	}
	if ck.Value == "bad" {
		return tenant.Principal{}, false, errdefs.WithPublic(errdefs.ErrUnauthenticated, "SESSION::EXPIRED", "session expired")
	}
	p, err := c.reg.PrincipalOf(ck.Value)
	return p, err == nil, err
}

func newTenantAPI(t *testing.T, cfg sandbox.Config, deps sandbox.Deps) *tenantAPI {
	t.Helper()
	db, err := store.Open(context.Background(), filepath.Join(t.TempDir(), "s.db"), time.Second)
	if err != nil {
		t.Fatal(err)
	}
	reg, err := tenant.Open(db, tenant.Options{RootKey: key})
	if err != nil {
		t.Fatal(err)
	}
	rt := fake.New(fake.Hooks{})
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	deps.Store, deps.Runtime, deps.Images, deps.Log = db, rt, images{}, log
	if deps.Quotas == nil {
		deps.Quotas = reg
	}
	deps.Guardrails = reg
	svc, err := sandbox.New(cfg, deps)
	if err != nil {
		t.Fatal(err)
	}
	ta := &tenantAPI{reg: reg, svc: svc, audit: &audit.Memory{}, keys: map[string]string{"root": key}, ids: map[string]string{"root": tenant.RootKeyID}}
	for _, tn := range []string{"acme", "beta"} {
		for _, role := range tenant.Roles {
			k, tok, err := reg.CreateKey(context.Background(), tenant.NewKey{Tenant: tn, Role: role, Name: tn + " " + string(role)})
			if err != nil {
				t.Fatal(err)
			}
			ta.keys[tn+"-"+string(role)] = tok
			ta.ids[tn+"-"+string(role)] = k.ID
		}
	}
	ta.api = httpapi.New(httpapi.Config{Auth: reg, Sessions: cookieSessions{reg}, Audit: ta.audit,
		Metrics: metrics.New(metrics.Options{})}, svc, log)
	ta.srv = httptest.NewServer(ta.api.Handler())
	t.Cleanup(func() { ta.srv.Close(); svc.Close(); rt.Close(); db.Close() })
	return ta
}

// do sends a request as who ("" = no credential) with extra headers and
// returns the status and the decoded body (nil if not a JSON object).
func (ta *tenantAPI) do(t *testing.T, who, method, path, body string, hdr ...string) (int, map[string]any) {
	t.Helper()
	var r io.Reader
	if body != "" {
		r = strings.NewReader(body)
	}
	req, _ := http.NewRequest(method, ta.srv.URL+path, r)
	if who != "" {
		k, ok := ta.keys[who]
		if !ok {
			t.Fatalf("no key %q", who)
		}
		req.Header.Set("OPEN-SANDBOX-API-KEY", k)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := ta.srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	var m map[string]any
	_ = json.Unmarshal(raw, &m)
	return resp.StatusCode, m
}

func TestRolesOnRoutes(t *testing.T) {
	ta := newTenantAPI(t, sandbox.Config{}, sandbox.Deps{})
	if code, body := ta.do(t, "acme-viewer", "GET", "/v1/sandboxes", ""); code != 200 {
		t.Errorf("viewer list: %d %v", code, body)
	}
	code, body := ta.do(t, "acme-viewer", "POST", "/v1/sandboxes", createBody)
	if code != 403 || body["code"] != "PERMISSION_DENIED" || !strings.Contains(body["message"].(string), "viewer") {
		t.Errorf("viewer create: %d %v", code, body)
	}
	if r := ta.audit.Last(); r.Status != 403 || r.KeyID != ta.ids["acme-viewer"] || r.Tenant != "acme" || r.Role != "viewer" {
		t.Errorf("audit of the refused create: %+v", r)
	}
	if code, body := ta.do(t, "acme-operator", "POST", "/v1/sandboxes", createBody); code != 202 {
		t.Errorf("operator create: %d %v", code, body)
	}
	if r := ta.audit.Last(); r.Status != 202 || r.KeyID != ta.ids["acme-operator"] || r.Tenant != "acme" || r.SandboxID == "" {
		t.Errorf("audit of the create: %+v", r)
	}
	// No credential, a wrong one: 401 and the audit record has no key.
	if code, body := ta.do(t, "", "POST", "/v1/sandboxes", createBody); code != 401 || body["code"] != "MISSING_API_KEY" {
		t.Errorf("no key: %d %v", code, body)
	}
	if code, body := ta.do(t, "", "POST", "/v1/sandboxes", createBody, "OPEN-SANDBOX-API-KEY", "moat_0123456789abcdef_"+strings.Repeat("0", 64)); code != 401 || body["code"] != "INVALID_API_KEY" {
		t.Errorf("unknown key: %d %v", code, body)
	}
	if r := ta.audit.Last(); r.Status != 401 || r.KeyID != "" || r.Tenant != "" {
		t.Errorf("audit of a 401: %+v", r)
	}
	// Public routes need nothing; unrouted paths need a key first.
	if code, _ := ta.do(t, "", "GET", "/health", ""); code != 200 {
		t.Errorf("health: %d", code)
	}
	if code, _ := ta.do(t, "", "GET", "/v1/nope", ""); code != 401 {
		t.Errorf("unrouted without key: %d", code)
	}
	if code, _ := ta.do(t, "acme-viewer", "GET", "/v1/nope", ""); code != 404 {
		t.Errorf("unrouted with key: %d", code)
	}
}

func TestSessionResolver(t *testing.T) {
	ta := newTenantAPI(t, sandbox.Config{}, sandbox.Deps{})
	ck := "session=" + ta.ids["beta-operator"]
	code, body := ta.do(t, "", "POST", "/v1/sandboxes", createBody, "Cookie", ck)
	if code != 202 {
		t.Fatalf("create with a session: %d %v", code, body)
	}
	if r := ta.audit.Last(); r.KeyID != ta.ids["beta-operator"] || r.Tenant != "beta" {
		t.Errorf("audit of a session call: %+v", r)
	}
	if code, body := ta.do(t, "", "GET", "/v1/sandboxes", "", "Cookie", "session=bad"); code != 401 || body["code"] != "SESSION::EXPIRED" {
		t.Errorf("bad session: %d %v", code, body)
	}
	// An API key wins over a session.
	if code, _ := ta.do(t, "beta-viewer", "POST", "/v1/sandboxes", createBody, "Cookie", ck); code != 403 {
		t.Errorf("viewer key with an operator session: %d, want 403", code)
	}
	// Revoking the key ends its sessions at once.
	ta.reg.RevokeKey(context.Background(), ta.ids["beta-operator"])
	if code, body := ta.do(t, "", "GET", "/v1/sandboxes", "", "Cookie", ck); code != 401 || !strings.Contains(fmt.Sprint(body["message"]), "revoked") {
		t.Errorf("session of a revoked key: %d %v", code, body)
	}
}

func TestTenantHeader(t *testing.T) {
	ta := newTenantAPI(t, sandbox.Config{}, sandbox.Deps{})
	if code, body := ta.do(t, "acme-operator", "GET", "/v1/sandboxes", "", httpapi.TenantHeader, "beta"); code != 403 {
		t.Errorf("operator naming another tenant: %d %v", code, body)
	}
	if code, _ := ta.do(t, "acme-operator", "GET", "/v1/sandboxes", "", httpapi.TenantHeader, "acme"); code != 200 {
		t.Errorf("operator naming its own tenant: %d", code)
	}
	if code, body := ta.do(t, "root", "GET", "/v1/sandboxes", "", httpapi.TenantHeader, "nope"); code != 404 || body["code"] != "TENANT::NOT_FOUND" {
		t.Errorf("admin naming an unknown tenant: %d %v", code, body)
	}
	if code, body := ta.do(t, "root", "GET", "/v1/sandboxes", "", httpapi.TenantHeader, "Bad/Name"); code != 400 {
		t.Errorf("admin naming an invalid tenant: %d %v", code, body)
	}
}

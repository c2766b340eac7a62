package httpapi_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"regexp"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/moat-sandbox/moat/internal/egress/policy"
	"github.com/moat-sandbox/moat/internal/errdefs"
	"github.com/moat-sandbox/moat/internal/httpapi"
	"github.com/moat-sandbox/moat/internal/ingress"
	"github.com/moat-sandbox/moat/internal/lifecycle"
	"github.com/moat-sandbox/moat/internal/sandbox"
	"github.com/moat-sandbox/moat/internal/tenant"
)

// memEgress is an in-memory lifecycle.Egress: policies are kept, nothing
// is enforced (the isolation tests need the egress API's routing only).
type memEgress struct {
	mu sync.Mutex
	p  map[string]policy.NetworkPolicy
}

func (m *memEgress) Attach(ctx context.Context, id string, ip netip.Addr, p policy.NetworkPolicy) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.p == nil {
		m.p = map[string]policy.NetworkPolicy{}
	}
	m.p[id] = p
	return nil
}

func (m *memEgress) Detach(ctx context.Context, id string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.p, id)
	return nil
}

func (m *memEgress) Get(id string) (policy.NetworkPolicy, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	p, ok := m.p[id]
	if !ok {
		return p, errdefs.ErrNotFound
	}
	return p, nil
}

func (m *memEgress) Modify(ctx context.Context, id string, fn func(policy.NetworkPolicy) (policy.NetworkPolicy, error)) (policy.NetworkPolicy, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	p, err := fn(m.p[id])
	if err == nil {
		m.p[id] = p
	}
	return p, err
}

// fixture is what tenant acme owns, addressed by the isolation tests.
type fixture struct {
	sandbox, snapshot, pool, key string
	egressToken                  string
	template                     string
	operation                    string
}

const policyBody = `{"defaultAction":"deny","egress":[{"action":"allow","target":"example.test"}]}`

// newIsolationAPI makes the two-tenant server and gives acme a sandbox
// (with an egress policy), a snapshot and a pool; beta gets a sandbox and
// a pool of the same name as acme's, to prove names are per tenant.
func newIsolationAPI(t *testing.T) (*tenantAPI, fixture) {
	t.Helper()
	ta := newTenantAPI(t, sandbox.Config{}, sandbox.Deps{Deps: lifecycle.Deps{Egress: &memEgress{}}, Committer: committer{}})
	var fx fixture
	// acme's sandbox mounts volume "shared" (beta has one of that name
	// too) and "private" (acme only).
	code, body := ta.do(t, "acme-operator", "POST", "/v1/sandboxes",
		`{"image":{"uri":"busybox"},"entrypoint":["sh"],"metadata":{"owner":"acme"},"timeout":3600,"networkPolicy":`+policyBody+`,`+
			`"volumes":[{"name":"a","mountPath":"/a","pvc":{"claimName":"shared"}},{"name":"b","mountPath":"/b","pvc":{"claimName":"private"}}]}`)
	if code != 202 {
		t.Fatalf("acme create: %d %v", code, body)
	}
	fx.sandbox = body["id"].(string)
	code, body = ta.do(t, "acme-operator", "GET", "/v1/sandboxes/"+fx.sandbox+"/endpoints/18080", "")
	if code != 200 {
		t.Fatalf("acme egress endpoint: %d %v", code, body)
	}
	fx.egressToken = body["headers"].(map[string]any)["OPENSANDBOX-EGRESS-AUTH"].(string)
	code, body = ta.do(t, "acme-operator", "POST", "/v1/sandboxes/"+fx.sandbox+"/snapshots", `{"name":"s"}`)
	if code != 202 {
		t.Fatalf("acme snapshot: %d %v", code, body)
	}
	fx.snapshot = body["id"].(string)
	// "warm" exists in both tenants, "private" only in acme.
	fx.pool = "private"
	pool := `{"name":"warm","template":{"image":{"uri":"busybox"},"entrypoint":["sh"]},"capacitySpec":{"bufferMin":0,"bufferMax":0,"poolMin":0,"poolMax":4}}`
	for _, p := range []string{pool, strings.Replace(pool, "warm", "private", 1)} {
		if code, body := ta.do(t, "acme-operator", "POST", "/v1/pools", p); code != 201 {
			t.Fatalf("acme pool: %d %v", code, body)
		}
	}
	if code, body := ta.do(t, "beta-operator", "POST", "/v1/pools", pool); code != 201 {
		t.Fatalf("beta pool of the same name: %d %v", code, body)
	}
	if code, body := ta.do(t, "beta-operator", "POST", "/v1/sandboxes",
		`{"image":{"uri":"busybox"},"entrypoint":["sh"],"volumes":[{"name":"a","mountPath":"/a","pvc":{"claimName":"shared"}}]}`); code != 202 {
		t.Fatalf("beta create: %d %v", code, body)
	}
	fx.template = "acme-only"
	if code, body := ta.do(t, "acme-operator", "POST", "/v1/templates", `{"id":"acme-only","image":"busybox"}`); code != 201 {
		t.Fatalf("acme template: %d %v", code, body)
	}
	// A fork of an acme sandbox without volumes (a source with volumes
	// cannot fork).
	code, body = ta.do(t, "acme-operator", "POST", "/v1/sandboxes", `{"image":{"uri":"busybox"},"entrypoint":["sh"]}`)
	if code != 202 {
		t.Fatalf("acme fork source: %d %v", code, body)
	}
	src := body["id"].(string)
	code, body = ta.do(t, "acme-operator", "POST", "/v1/sandboxes/"+src+"/fork", `{"count":1}`)
	if code != 202 {
		t.Fatalf("acme fork: %d %v", code, body)
	}
	fx.operation = body["id"].(string)
	for deadline := time.Now().Add(10 * time.Second); body["state"] == "Running"; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("acme fork: still %v", body)
		}
		_, body = ta.do(t, "acme-operator", "GET", "/v1/operations/"+fx.operation, "")
	}
	if code, body := ta.do(t, "acme-operator", "DELETE", "/v1/sandboxes/"+src, ""); code != 204 {
		t.Fatalf("delete the acme fork source: %d %v", code, body)
	}
	fx.key = ta.ids["acme-viewer"]
	return ta, fx
}

// concrete fills a route pattern with fx's ids.
func (fx fixture) concrete(pattern string) string {
	return regexp.MustCompile(`\{[^}]+\}`).ReplaceAllStringFunc(pattern, func(m string) string {
		switch m {
		case "{id}":
			return fx.sandbox
		case "{snapshotId}":
			return fx.snapshot
		case "{name}":
			return fx.pool // a pool, and a volume, only acme has
		case "{port}":
			return "44772"
		case "{path...}":
			return "policy"
		case "{keyId}":
			return fx.key
		case "{tenantName}":
			return "acme"
		case "{templateId}":
			return fx.template
		case "{operationId}":
			return fx.operation
		}
		panic("route parameter without a fixture: " + m)
	})
}

// bodies are valid request bodies per route (without prefix), so that a
// refusal is never a mere 400.
var bodies = map[string]string{
	"POST /metrics/events":                  `{"eventType":"create","sandboxId":"x","createDurationMs":1,"success":true}`,
	"POST /sandboxes":                       createBody,
	"POST /sandboxes/{id}/renew-expiration": `{"expiresAt":"2099-01-01T00:00:00Z"}`,
	"PATCH /sandboxes/{id}/metadata":        `{"k":"v"}`,
	"POST /sandboxes/batch":                 `{"count":1,"image":{"uri":"busybox"},"entrypoint":["sh"]}`,
	"POST /sandboxes/{id}/fork":             `{"count":1}`,
	"POST /sandboxes/{id}/snapshots":        `{"name":"x"}`,
	"POST /pools":                           `{"name":"other","template":{"image":{"uri":"busybox"},"entrypoint":["sh"]},"capacitySpec":{"poolMax":1}}`,
	"PUT /pools/{name}":                     `{"name":"private","template":{"image":{"uri":"busybox"},"entrypoint":["sh"]},"capacitySpec":{"poolMax":2}}`,
	"POST /keys":                            `{"tenant":"acme","role":"viewer"}`,
	"POST /templates":                       `{"id":"other","image":"busybox"}`,
	"PUT /tenants/{tenantName}":             `{"quota":{"sandboxes":100}}`,
	"PUT /tenants/{tenantName}/egress":      `{"defaultAction":"allow"}`,
}

func routeKey(r httpapi.Route) string {
	p := strings.TrimPrefix(r.Pattern, "/v1")
	if r.Method == "" {
		return p
	}
	return r.Method + " " + p
}

func methodOf(r httpapi.Route) string {
	if r.Method == "" {
		return "GET"
	}
	return r.Method
}

// owned reports whether a route addresses one tenant resource by id or
// name in its path (as opposed to a collection).
func owned(pattern string) bool {
	for _, p := range []string{"{id}", "{snapshotId}", "{name}", "{keyId}", "{tenantName}", "{templateId}", "{operationId}"} {
		if strings.Contains(pattern, p) {
			return true
		}
	}
	return false
}

// TestCrossTenantEveryRoute addresses tenant acme's sandbox, snapshot,
// pool, key and tenant on every route of the route table (both prefixes)
// with keys that must not reach them: beta's operator, beta's admin (a
// tenant admin is fenced to its tenant), beta's admin naming its own
// tenant with X-Moat-Tenant, and the platform key narrowed to beta. Every
// route that names a resource must answer 404 with {code, message}, as if
// it did not exist (403 PERMISSION_DENIED where the role may not use the
// route at all: a tenant admin on the platform routes), and acme's
// resources must be untouched afterwards. Collection routes must not list
// acme's resources. A route the test does not know fails it.
func TestCrossTenantEveryRoute(t *testing.T) {
	ta, fx := newIsolationAPI(t)
	before := snapshotState(t, ta, fx)
	routes := ta.api.Routes()
	if len(routes) < 60 {
		t.Fatalf("only %d routes: the table is not being read", len(routes))
	}
	collections := map[string]func(t *testing.T, code int, body map[string]any){
		"GET /health":           nil,
		"POST /metrics/events":  nil,
		"POST /sandboxes":       nil, // creates in the caller's tenant (see TestCreateFromAnotherTenantsPoolOrSnapshot)
		"POST /sandboxes/batch": nil,
		"POST /pools":           nil,
		"POST /templates":       nil, // creates in the caller's tenant
		"GET /templates": func(t *testing.T, code int, body map[string]any) {
			if code != 200 || strings.Contains(fmt.Sprint(body), fx.template) || !strings.Contains(fmt.Sprint(body), "base") {
				t.Errorf("beta sees templates %v (status %d), want the built-ins and its own", body, code)
			}
		},
		"GET /sandboxes": func(t *testing.T, code int, body map[string]any) { mustNotList(t, code, body, fx.sandbox) },
		"GET /snapshots": func(t *testing.T, code int, body map[string]any) { mustNotList(t, code, body, fx.snapshot) },
		"GET /pools": func(t *testing.T, code int, body map[string]any) {
			if code != 200 || strings.Contains(fmt.Sprint(body), "private") || !strings.Contains(fmt.Sprint(body), "warm") {
				t.Errorf("beta sees pools %v (status %d), want its own only", body, code)
			}
		},
		"GET /whoami": func(t *testing.T, code int, body map[string]any) {
			if code != 200 || body["tenant"] != "beta" {
				t.Errorf("whoami %d %v", code, body)
			}
		},
		"GET /keys": func(t *testing.T, code int, body map[string]any) {
			if code == 200 {
				mustNotList(t, code, body, fx.key)
			}
		},
		"POST /keys": nil, // admin only; acme is named in the body (TestAdminAPI)
		"GET /metrics": func(t *testing.T, code int, body map[string]any) {
			if code != 403 && code != 200 {
				t.Errorf("metrics: %d %v", code, body) // platform only: counts, no ids
			}
		},
		"GET /volumes": func(t *testing.T, code int, body map[string]any) {
			if code != 200 || strings.Contains(fmt.Sprint(body), "private") || !strings.Contains(fmt.Sprint(body), "shared") {
				t.Errorf("beta sees volumes %v (status %d), want its own only", body, code)
			}
			for _, v := range body["items"].([]any) {
				if s := fmt.Sprint(v.(map[string]any)["sandboxes"]); strings.Contains(s, fx.sandbox) {
					t.Errorf("beta's volume lists acme's sandbox: %v", v)
				}
			}
		},
		"GET /tenants": func(t *testing.T, code int, body map[string]any) {
			if code == 200 && strings.Contains(fmt.Sprint(body), "acme") {
				t.Errorf("beta lists tenant acme: %v", body)
			}
		},
	}
	for _, who := range []struct {
		name string
		key  string
		role tenant.Role
		hdr  []string
	}{
		{"beta operator", "beta-operator", tenant.RoleOperator, nil},
		{"beta tenant admin", "beta-admin", tenant.RoleAdmin, nil},
		{"beta tenant admin naming beta", "beta-admin", tenant.RoleAdmin, []string{httpapi.TenantHeader, "beta"}},
		{"platform narrowed to beta", "root", tenant.RolePlatform, []string{httpapi.TenantHeader, "beta"}},
	} {
		for _, rt := range routes {
			k := routeKey(rt)
			path := fx.concrete(rt.Pattern)
			t.Run(who.name+"/"+methodOf(rt)+" "+rt.Pattern, func(t *testing.T) {
				hdr := append([]string(nil), who.hdr...)
				if strings.Contains(rt.Pattern, "/egress/") {
					// Even with the sandbox's own egress token: no key of
					// another tenant reaches it.
					hdr = append(hdr, "OPENSANDBOX-EGRESS-AUTH", fx.egressToken)
				}
				code, body := ta.do(t, who.key, methodOf(rt), path, bodies[strings.TrimPrefix(k, "")], hdr...)
				if !owned(rt.Pattern) {
					check, known := collections[k]
					if !known {
						t.Fatalf("route %s is not covered by the isolation test: add it", k)
					}
					if !who.role.Allows(rt.Access) && code != 403 {
						t.Errorf("%s %s: %d %v, want 403 (%s route)", methodOf(rt), path, code, body, rt.Access)
					}
					if check != nil {
						check(t, code, body)
					}
					return
				}
				if !who.role.Allows(rt.Access) {
					if code != 403 || body["code"] != "PERMISSION_DENIED" {
						t.Errorf("%s %s: %d %v, want 403 (%s route)", methodOf(rt), path, code, body, rt.Access)
					}
					return
				}
				// A plain not-found envelope, nothing else: the answer
				// to an id that does not exist.
				c, _ := body["code"].(string)
				if code != 404 || !strings.HasSuffix(c, "NOT_FOUND") || body["message"] == nil || len(body) != 2 {
					t.Errorf("%s %s: %d %v, want 404 {code: *NOT_FOUND, message}", methodOf(rt), path, code, body)
				}
			})
		}
	}
	if after := snapshotState(t, ta, fx); after != before {
		t.Errorf("acme's resources changed:\nbefore %s\nafter  %s", before, after)
	}
}

// snapshotState renders acme's resources as acme sees them.
func snapshotState(t *testing.T, ta *tenantAPI, fx fixture) string {
	t.Helper()
	var parts []string
	for _, p := range []string{"/v1/sandboxes/" + fx.sandbox, "/v1/snapshots/" + fx.snapshot, "/v1/pools/" + fx.pool,
		"/v1/sandboxes/" + fx.sandbox + "/egress/policy", "/v1/volumes/private", "/v1/volumes/shared"} {
		code, body := ta.do(t, "acme-operator", "GET", p, "", "OPENSANDBOX-EGRESS-AUTH", fx.egressToken)
		if code != 200 {
			t.Fatalf("acme GET %s: %d %v", p, code, body)
		}
		delete(body, "status") // pool counters may move; states are checked below
		parts = append(parts, fmt.Sprint(body))
	}
	code, body := ta.do(t, "acme-operator", "GET", "/v1/sandboxes/"+fx.sandbox, "")
	if code != 200 || body["status"].(map[string]any)["state"] != "Running" {
		t.Fatalf("acme sandbox: %d %v", code, body)
	}
	if k, err := ta.reg.Key(fx.key); err != nil || k.RevokedAt != nil {
		t.Fatalf("acme key: %+v %v", k, err)
	}
	q := ta.reg.Quota("acme")
	return strings.Join(parts, "\n") + fmt.Sprintf("\nquota %+v", q)
}

func mustNotList(t *testing.T, code int, body map[string]any, id string) {
	t.Helper()
	if code != 200 {
		t.Errorf("list: %d %v", code, body)
		return
	}
	if strings.Contains(fmt.Sprint(body["items"]), id) {
		t.Errorf("list shows the other tenant's %s: %v", id, body)
	}
}

// TestCreateFromAnotherTenantsPoolOrSnapshot: a pool name resolves in the
// caller's tenant and a snapshot id is not found across tenants.
func TestCreateFromAnotherTenantsPoolOrSnapshot(t *testing.T) {
	ta, fx := newIsolationAPI(t)
	code, body := ta.do(t, "beta-operator", "POST", "/v1/sandboxes", `{"snapshotId":"`+fx.snapshot+`"}`)
	if code != 404 || body["code"] != "SNAPSHOT::NOT_FOUND" {
		t.Errorf("beta create from acme's snapshot: %d %v", code, body)
	}
	code, body = ta.do(t, "beta-operator", "POST", "/v1/pools",
		`{"name":"fork","template":{"snapshotId":"`+fx.snapshot+`"},"capacitySpec":{"poolMax":1}}`)
	if code != 404 || body["code"] != "SNAPSHOT::NOT_FOUND" {
		t.Errorf("beta pool from acme's snapshot: %d %v", code, body)
	}
	// "warm" exists in both tenants: beta's claim takes beta's pool.
	code, body = ta.do(t, "beta-operator", "POST", "/v1/sandboxes", `{"extensions":{"poolRef":"warm"},"entrypoint":["sh"]}`)
	if code != 202 {
		t.Fatalf("beta claim: %d %v", code, body)
	}
	id := body["id"].(string)
	if code, _ := ta.do(t, "acme-operator", "GET", "/v1/sandboxes/"+id, ""); code != 404 {
		t.Errorf("acme sees beta's claimed sandbox: %d", code)
	}
	acme, _ := ta.do(t, "acme-operator", "GET", "/v1/pools/warm", "")
	_, ab := ta.do(t, "acme-operator", "GET", "/v1/pools/warm", "")
	_, bb := ta.do(t, "beta-operator", "GET", "/v1/pools/warm", "")
	if acme != 200 || ab["status"].(map[string]any)["allocated"].(float64) != 0 || bb["status"].(map[string]any)["allocated"].(float64) != 1 {
		t.Errorf("pool counts: acme %v beta %v", ab["status"], bb["status"])
	}
	// A tenant without a pool of that name gets the ordinary error.
	code, body = ta.do(t, "beta-operator", "POST", "/v1/sandboxes/batch", `{"count":1,"extensions":{"poolRef":"acme-only"}}`)
	if code != 400 || body["code"] != "SANDBOX::INVALID_POOL_REF" {
		t.Errorf("unknown poolRef: %d %v", code, body)
	}
	// The admin (all tenants) sees both tenants' sandboxes.
	_, all := ta.do(t, "root", "GET", "/v1/sandboxes", "")
	if n := int(all["pagination"].(map[string]any)["totalItems"].(float64)); n != 3 {
		t.Errorf("admin sees %d sandboxes, want 3", n)
	}
	// Volumes: one namespace per tenant; the admin sees them qualified.
	_, vols := ta.do(t, "root", "GET", "/v1/volumes", "")
	var names []string
	for _, v := range vols["items"].([]any) {
		names = append(names, v.(map[string]any)["name"].(string))
	}
	if fmt.Sprint(names) != "[acme.private acme.shared beta.shared]" {
		t.Errorf("admin's volume list: %v", names)
	}
	if code, body := ta.do(t, "root", "GET", "/v1/volumes/beta.shared", ""); code != 200 || body["name"] != "beta.shared" {
		t.Errorf("admin get of a qualified volume: %d %v", code, body)
	}
	for _, name := range []string{"beta.shared", "beta.private", "default.shared", "a.b.c"} {
		if code, body := ta.do(t, "acme-operator", "GET", "/v1/volumes/"+name, ""); code != 404 || body["code"] != "VOLUME::NOT_FOUND" {
			t.Errorf("acme get of %s: %d %v", name, code, body)
		}
	}
	if code, body := ta.do(t, "acme-operator", "POST", "/v1/sandboxes",
		`{"image":{"uri":"busybox"},"entrypoint":["sh"],"volumes":[{"name":"a","mountPath":"/a","pvc":{"claimName":"beta.shared"}}]}`); code != 400 {
		t.Errorf("a claim name with a dot: %d %v", code, body)
	}
	if code, body := ta.do(t, "acme-operator", "DELETE", "/v1/volumes/shared", ""); code != 409 || !strings.Contains(fmt.Sprint(body["message"]), fx.sandbox) {
		t.Errorf("acme delete of its used volume: %d %v", code, body)
	}
	// Deleting acme's pool leaves beta's.
	if code, _ := ta.do(t, "acme-operator", "DELETE", "/v1/pools/warm", ""); code != 204 {
		t.Errorf("acme delete pool: %d", code)
	}
	if code, _ := ta.do(t, "beta-operator", "GET", "/v1/pools/warm", ""); code != 200 {
		t.Errorf("beta's pool went with acme's: %d", code)
	}
}

// TestRolesEveryRoute calls every route with each role and with a revoked
// key and no key: a role below the route's access answers 403
// PERMISSION_DENIED, a revoked key 401 on every route that reads a
// credential, no key 401 MISSING_API_KEY on every route that needs one.
// Nothing a refused call addressed may change.
func TestRolesEveryRoute(t *testing.T) {
	ta, fx := newIsolationAPI(t)
	before := snapshotState(t, ta, fx)
	code, body := ta.do(t, "root", "POST", "/v1/keys", `{"tenant":"acme","role":"admin","name":"soon revoked"}`)
	if code != 201 {
		t.Fatalf("create key: %d %v", code, body)
	}
	if code, _ := ta.do(t, "root", "DELETE", "/v1/keys/"+body["id"].(string), ""); code != 204 {
		t.Fatalf("revoke: %d", code)
	}
	ta.keys["acme-revoked"] = body["key"].(string)
	var seenWrite, seenAdmin, seenPlatform int
	for _, rt := range ta.api.Routes() {
		k := routeKey(rt)
		path := fx.concrete(rt.Pattern)
		t.Run(methodOf(rt)+" "+rt.Pattern, func(t *testing.T) {
			for _, role := range []tenant.Role{tenant.RoleViewer, tenant.RoleOperator, tenant.RoleAdmin} {
				if role.Allows(rt.Access) {
					continue
				}
				switch {
				case rt.Access == tenant.AccessWrite:
					seenWrite++
				case role == tenant.RoleAdmin:
					seenPlatform++
				default:
					seenAdmin++
				}
				code, body := ta.do(t, "acme-"+string(role), methodOf(rt), path, bodies[k])
				if code != 403 || body["code"] != "PERMISSION_DENIED" || body["message"] == nil {
					t.Errorf("%s: %s %s: %d %v, want 403 PERMISSION_DENIED", role, methodOf(rt), path, code, body)
				}
			}
			code, body := ta.do(t, "acme-revoked", methodOf(rt), path, bodies[k])
			switch rt.Access {
			case tenant.AccessPublic:
				if code == 401 {
					t.Errorf("public route refused a revoked key: %d", code)
				}
			default:
				if code != 401 || body["code"] != "INVALID_API_KEY" || !strings.Contains(fmt.Sprint(body["message"]), "revoked") {
					t.Errorf("revoked key: %s %s: %d %v, want 401", methodOf(rt), path, code, body)
				}
			}
			code, body = ta.do(t, "", methodOf(rt), path, bodies[k])
			switch rt.Access {
			case tenant.AccessPublic, tenant.AccessData:
				// The sandbox's own token check may answer 401 (the
				// agent, the egress API); moat's key check must not.
				if c := fmt.Sprint(body["code"]); c == "MISSING_API_KEY" || c == "INVALID_API_KEY" || code == 403 {
					t.Errorf("%s route wants a key: %d %v", rt.Access, code, body)
				}
			default:
				if code != 401 || body["code"] != "MISSING_API_KEY" {
					t.Errorf("no key: %s %s: %d %v, want 401 MISSING_API_KEY", methodOf(rt), path, code, body)
				}
			}
		})
	}
	// 12 write routes refuse viewers, 9 admin and platform routes refuse
	// viewers and operators (GET /tenants/{name} and its egress are read),
	// 4 platform routes refuse tenant admins, under two prefixes; and
	// /metrics.
	if seenWrite < 24 || seenAdmin < 36 || seenPlatform < 9 {
		t.Errorf("only %d write, %d admin and %d platform refusals checked", seenWrite, seenAdmin, seenPlatform)
	}
	if after := snapshotState(t, ta, fx); after != before {
		t.Errorf("refused calls changed acme's resources:\nbefore %s\nafter  %s", before, after)
	}
}

// TestRoutesInSpec holds the route table to the spec: every route is an
// operation of lifecycle.yaml (and TestSpecRoutesServed checks the other
// way), so the isolation tests, which iterate the table, cover the spec.
func TestRoutesInSpec(t *testing.T) {
	doc, _ := loadSpec(t, "lifecycle.yaml")
	ops, _ := servedOps(t, doc)
	norm := func(p string) string { return regexp.MustCompile(`\{[^}]+\}`).ReplaceAllString(p, "{}") }
	inSpec := map[string]bool{}
	for _, op := range ops {
		inSpec[op.method+" "+norm(op.path)] = true
		inSpec["* "+norm(op.path)] = true
	}
	var missing []string
	for _, rt := range newTenantAPI(t, sandbox.Config{}, sandbox.Deps{}).api.Routes() {
		if !strings.HasPrefix(rt.Pattern, "/v1/") {
			continue
		}
		m := rt.Method
		if m == "" {
			m = "*"
		}
		if strings.Contains(rt.Pattern, "/egress/") {
			continue // the egress API (egress.yaml), mounted per sandbox
		}
		if rt.Pattern == "/metrics" {
			continue // Prometheus exposition, not the JSON API
		}
		if k := m + " " + norm(strings.TrimPrefix(rt.Pattern, "/v1")); !inSpec[k] {
			missing = append(missing, k)
		}
	}
	sort.Strings(missing)
	if len(missing) > 0 {
		t.Errorf("routes missing from api/openapi/lifecycle.yaml: %v", missing)
	}
}

// lifecycleResolver resolves gateway routes through the lifecycle, as
// the server wires it.
type lifecycleResolver struct{ svc *sandbox.Service }

func (l lifecycleResolver) Resolve(ctx context.Context, id string, port int) (ingress.Target, error) {
	ep, err := l.svc.Endpoint(ctx, id, port)
	return ingress.Target{Addr: ep.Address, AccessToken: ep.AccessToken}, err
}

func (l lifecycleResolver) Touch(ctx context.Context, id string) {}

// TestIngressGatewayScoped: on the ingress gateway, a request carrying a
// key of another tenant does not find the sandbox (404), an invalid or
// revoked key is refused (401), and a request without a key is routed
// as before (the gateway is the data plane).
func TestIngressGatewayScoped(t *testing.T) {
	ta, fx := newIsolationAPI(t)
	gw := httptest.NewServer(ingress.New(ingress.Config{Credentials: ta.api}, lifecycleResolver{ta.svc}, nil))
	defer gw.Close()
	get := func(hdr ...string) (int, string) {
		req, _ := http.NewRequest("GET", gw.URL+"/"+fx.sandbox+"/44772/ping", nil)
		for i := 0; i+1 < len(hdr); i += 2 {
			req.Header.Set(hdr[i], hdr[i+1])
		}
		resp, err := gw.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	// Routed: the fake agent answered (401 without its token, and an
	// empty body), not the gateway (a JSON envelope).
	routed := func(code int, body string) bool {
		return code != 404 && !strings.Contains(body, `"code"`)
	}
	if code, body := get(); !routed(code, body) {
		t.Errorf("no key: %d %s", code, body)
	}
	if code, body := get("OPEN-SANDBOX-API-KEY", ta.keys["acme-viewer"]); !routed(code, body) {
		t.Errorf("acme key: %d %s", code, body)
	}
	for _, who := range []string{"beta-operator", "beta-admin"} {
		hdr := []string{"X-API-Key", ta.keys[who]}
		if who == "beta-admin" {
			hdr = append(hdr, httpapi.TenantHeader, "beta")
		}
		if code, body := get(hdr...); code != 404 || !strings.Contains(body, "sandbox not found") {
			t.Errorf("%s: %d %s, want 404", who, code, body)
		}
	}
	if code, body := get("OPEN-SANDBOX-API-KEY", "moat_0123456789abcdef_"+strings.Repeat("0", 64)); code != 401 || !strings.Contains(body, "INVALID_API_KEY") {
		t.Errorf("unknown key: %d %s", code, body)
	}
	ta.reg.RevokeKey(context.Background(), ta.ids["acme-viewer"])
	if code, body := get("OPEN-SANDBOX-API-KEY", ta.keys["acme-viewer"]); code != 401 || !strings.Contains(body, "revoked") {
		t.Errorf("revoked key: %d %s", code, body)
	}
}

// TestProxyKeyAsAgentToken: the OpenSandbox SDKs in server-proxy mode send
// the API key as X-EXECD-ACCESS-TOKEN; such a key scopes the proxy too,
// and a viewer's key is not turned into the agent token.
func TestProxyKeyAsAgentToken(t *testing.T) {
	ta, fx := newIsolationAPI(t)
	path := "/v1/sandboxes/" + fx.sandbox + "/proxy/44772/ping"
	get := func(tok string) (int, map[string]any) {
		req, _ := http.NewRequest("GET", ta.srv.URL+path, nil)
		req.Header.Set("X-EXECD-ACCESS-TOKEN", tok)
		resp, err := ta.srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var m map[string]any
		json.NewDecoder(resp.Body).Decode(&m)
		return resp.StatusCode, m
	}
	if code, body := get(ta.keys["beta-operator"]); code != 404 || body["code"] != "SANDBOX::NOT_FOUND" {
		t.Errorf("beta key as agent token: %d %v", code, body)
	}
	if code, _ := get(ta.keys["acme-operator"]); code != 200 {
		t.Errorf("acme operator key as agent token: %d, want the agent's 200", code)
	}
	if code, _ := get(ta.keys["acme-viewer"]); code != 401 {
		t.Errorf("acme viewer key as agent token: %d, want the agent's 401", code)
	}
	if code, body := get("moat_0123456789abcdef_" + strings.Repeat("0", 64)); code != 401 || body["code"] != "INVALID_API_KEY" {
		t.Errorf("unknown moat key: %d %v", code, body)
	}
}

// TestViewerGetsNoControlTokens: a viewer reads endpoints, but without the
// agent and egress tokens (either would let it change the sandbox).
func TestViewerGetsNoControlTokens(t *testing.T) {
	ta, fx := newIsolationAPI(t)
	for _, port := range []string{"44772", "18080"} {
		p := "/v1/sandboxes/" + fx.sandbox + "/endpoints/" + port
		_, op := ta.do(t, "acme-operator", "GET", p, "")
		code, view := ta.do(t, "acme-viewer", "GET", p, "")
		if code != 200 || view["endpoint"] != op["endpoint"] {
			t.Errorf("viewer endpoint %s: %d %v (operator %v)", port, code, view, op)
		}
		if op["headers"] == nil || view["headers"] != nil {
			t.Errorf("port %s: operator headers %v, viewer headers %v; want the viewer's empty", port, op["headers"], view["headers"])
		}
	}
}

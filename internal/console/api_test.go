package console_test

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/moat-sandbox/moat/internal/audit"
	"github.com/moat-sandbox/moat/internal/console"
	"github.com/moat-sandbox/moat/internal/httpapi"
	"github.com/moat-sandbox/moat/internal/image"
	"github.com/moat-sandbox/moat/internal/lifecycle"
	"github.com/moat-sandbox/moat/internal/runtime/fake"
	"github.com/moat-sandbox/moat/internal/sandbox"
	"github.com/moat-sandbox/moat/internal/store"
	"github.com/moat-sandbox/moat/internal/tenant"
)

// The console in front of the real Lifecycle API, tenant registry and the
// fake runtime (whose agents check their token): the console adds no
// authorization of its own, so roles, tenant scoping, revocation and the
// audit record must come out exactly as for API keys.

type noImages struct{}

func (noImages) Ensure(ctx context.Context, ref string, auth *image.Auth) (image.Image, error) {
	return image.Image{Name: ref}, nil
}

type stack struct {
	t     *testing.T
	srv   *httptest.Server
	reg   *tenant.Registry
	audit *audit.Memory
	keys  map[string]string // "acme-operator" -> key
	ids   map[string]string // "acme-operator" -> key id
}

const rootKey = "root-key-of-the-console-test"

func newStack(t *testing.T) *stack {
	t.Helper()
	db, err := store.Open(context.Background(), filepath.Join(t.TempDir(), "s.db"), time.Second)
	if err != nil {
		t.Fatal(err)
	}
	reg, err := tenant.Open(db, tenant.Options{RootKey: rootKey})
	if err != nil {
		t.Fatal(err)
	}
	rt := fake.New(fake.Hooks{})
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	svc, err := sandbox.New(sandbox.Config{Config: lifecycle.Config{}}, sandbox.Deps{Deps: lifecycle.Deps{Store: db, Runtime: rt, Images: noImages{}, Log: log, Quotas: reg}})
	if err != nil {
		t.Fatal(err)
	}
	st := &stack{t: t, reg: reg, audit: &audit.Memory{}, keys: map[string]string{}, ids: map[string]string{}}
	for _, tn := range []string{"acme", "beta"} {
		for _, role := range tenant.Roles {
			k, tok, err := reg.CreateKey(context.Background(), tenant.NewKey{Tenant: tn, Role: role})
			if err != nil {
				t.Fatal(err)
			}
			st.keys[tn+"-"+string(role)], st.ids[tn+"-"+string(role)] = tok, k.ID
		}
	}
	sessions := console.NewSessions(console.SessionOptions{Keys: reg})
	api := httpapi.New(httpapi.Config{Auth: reg, Sessions: sessions, Audit: st.audit}, svc, log)
	c, err := console.New(console.Options{API: api.Handler(), Sessions: sessions, Assets: app, Log: log, Audit: st.audit})
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle("/console/", c)
	mux.Handle("/", api.Handler())
	st.srv = httptest.NewServer(mux)
	t.Cleanup(func() { st.srv.Close(); svc.Close(); rt.Close(); db.Close() })
	return st
}

// browser is one signed-in console session.
type browser struct {
	st           *stack
	cookie, csrf string
}

func (st *stack) signIn(who string) *browser {
	st.t.Helper()
	res, err := http.Post(st.srv.URL+"/console/session", "application/json", strings.NewReader(`{"apiKey":"`+st.keys[who]+`"}`))
	if err != nil {
		st.t.Fatal(err)
	}
	defer res.Body.Close()
	var info struct {
		CSRFToken string           `json:"csrfToken"`
		Principal tenant.Principal `json:"principal"`
	}
	json.NewDecoder(res.Body).Decode(&info)
	if res.StatusCode != 200 || len(res.Cookies()) != 1 {
		st.t.Fatalf("sign-in as %s: %d", who, res.StatusCode)
	}
	if info.Principal.KeyID != st.ids[who] {
		st.t.Fatalf("sign-in as %s: principal %+v", who, info.Principal)
	}
	return &browser{st: st, cookie: res.Cookies()[0].Value, csrf: info.CSRFToken}
}

// call sends an API call through the console gateway.
func (b *browser) call(method, path, body string) (int, map[string]any) {
	b.st.t.Helper()
	var r io.Reader
	if body != "" {
		r = strings.NewReader(body)
	}
	req, _ := http.NewRequest(method, b.st.srv.URL+"/console/api"+path, r)
	req.Header.Set("Cookie", console.CookieName+"="+b.cookie)
	req.Header.Set(console.CSRFHeader, b.csrf)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		b.st.t.Fatal(err)
	}
	defer res.Body.Close()
	raw, _ := io.ReadAll(res.Body)
	var m map[string]any
	json.Unmarshal(raw, &m)
	if m == nil && len(raw) > 0 {
		m = map[string]any{"raw": string(raw)}
	}
	return res.StatusCode, m
}

const createBody = `{"image":{"uri":"busybox"},"entrypoint":["tail","-f","/dev/null"],"timeout":600}`

func TestConsoleRolesAndTenants(t *testing.T) {
	st := newStack(t)
	op := st.signIn("acme-operator")
	code, sb := op.call("POST", "/v1/sandboxes", createBody)
	if code != 202 {
		t.Fatalf("operator create: %d %v", code, sb)
	}
	id := sb["id"].(string)
	if r := st.audit.Last(); r.KeyID != st.ids["acme-operator"] || r.Tenant != "acme" || r.SandboxID != id {
		t.Errorf("audit of a console create: %+v", r)
	}

	// A viewer of the same tenant reads, and is refused every mutation.
	viewer := st.signIn("acme-viewer")
	if code, list := viewer.call("GET", "/v1/sandboxes", ""); code != 200 || len(list["items"].([]any)) != 1 {
		t.Fatalf("viewer list: %d %v", code, list)
	}
	for _, c := range []struct{ method, path, body string }{
		{"POST", "/v1/sandboxes", createBody},
		{"DELETE", "/v1/sandboxes/" + id, ""},
		{"POST", "/v1/sandboxes/" + id + "/pause", ""},
		{"POST", "/v1/pools", `{"name":"p","template":{"image":{"uri":"x"}},"capacitySpec":{"bufferMax":1,"poolMax":1}}`},
	} {
		if code, body := viewer.call(c.method, c.path, c.body); code != 403 || body["code"] != "PERMISSION_DENIED" {
			t.Errorf("viewer %s %s: %d %v", c.method, c.path, code, body)
		}
	}
	// Through the server proxy, an operator's session drives the agent
	// (the proxy swaps in the agent token); a viewer's does not.
	if code, body := op.call("GET", "/v1/sandboxes/"+id+"/proxy/44772/ping", ""); code != 200 {
		t.Errorf("operator ping through the console: %d %v", code, body)
	}
	if code, _ := viewer.call("GET", "/v1/sandboxes/"+id+"/proxy/44772/ping", ""); code != 401 {
		t.Errorf("viewer ping through the console: %d, want the agent's 401", code)
	}

	// Another tenant's session sees nothing of acme.
	beta := st.signIn("beta-operator")
	if code, list := beta.call("GET", "/v1/sandboxes", ""); code != 200 || len(list["items"].([]any)) != 0 {
		t.Fatalf("beta list: %d %v", code, list)
	}
	for _, c := range []struct{ method, path string }{
		{"GET", "/v1/sandboxes/" + id},
		{"DELETE", "/v1/sandboxes/" + id},
		{"GET", "/v1/sandboxes/" + id + "/diagnostics/logs?scope=container"},
		{"GET", "/v1/sandboxes/" + id + "/proxy/44772/ping"},
	} {
		if code, body := beta.call(c.method, c.path, ""); code != 404 {
			t.Errorf("beta %s %s: %d %v", c.method, c.path, code, body)
		}
	}
	// beta's admin is fenced to beta too, in the console as on the API:
	// acme's sandbox, keys and tenant do not exist for it.
	betaAdmin := st.signIn("beta-admin")
	for _, c := range []struct{ method, path, body string }{
		{"GET", "/v1/sandboxes/" + id, ""},
		{"DELETE", "/v1/sandboxes/" + id, ""},
		{"GET", "/v1/keys/" + st.ids["acme-viewer"], ""},
		{"DELETE", "/v1/keys/" + st.ids["acme-viewer"], ""},
		{"GET", "/v1/tenants/acme", ""},
		{"POST", "/v1/keys", `{"tenant":"acme","role":"admin"}`},
	} {
		if code, body := betaAdmin.call(c.method, c.path, c.body); code != 404 {
			t.Errorf("beta admin %s %s: %d %v, want 404", c.method, c.path, code, body)
		}
	}
	if code, list := betaAdmin.call("GET", "/v1/sandboxes", ""); code != 200 || len(list["items"].([]any)) != 0 {
		t.Errorf("beta admin list: %d %v", code, list)
	}
	if code, body := betaAdmin.call("PUT", "/v1/tenants/beta", `{"quota":{"sandboxes":99}}`); code != 403 {
		t.Errorf("beta admin sets its quota: %d %v", code, body)
	}
	// The platform (the server's own key) sees every tenant.
	st.keys["root"], st.ids["root"] = rootKey, tenant.RootKeyID
	admin := st.signIn("root")
	if code, list := admin.call("GET", "/v1/sandboxes", ""); code != 200 || len(list["items"].([]any)) != 1 {
		t.Fatalf("platform list: %d %v", code, list)
	}
}

func TestConsoleRevocationEndsSession(t *testing.T) {
	st := newStack(t)
	b := st.signIn("beta-operator")
	if code, _ := b.call("GET", "/v1/sandboxes", ""); code != 200 {
		t.Fatalf("before revocation: %d", code)
	}
	if _, err := st.reg.RevokeKey(context.Background(), st.ids["beta-operator"]); err != nil {
		t.Fatal(err)
	}
	if code, body := b.call("GET", "/v1/sandboxes", ""); code != 401 || body["code"] != "INVALID_API_KEY" {
		t.Fatalf("after revocation: %d %v", code, body)
	}
	// The session is gone, not only refused once.
	if code, body := b.call("GET", "/v1/sandboxes", ""); code != 401 || body["code"] != "CONSOLE::SIGNED_OUT" {
		t.Fatalf("second call after revocation: %d %v", code, body)
	}
	// And a cookie alone, sent to the API's own routes, is no credential.
	req, _ := http.NewRequest("GET", st.srv.URL+"/v1/sandboxes", nil)
	a := st.signIn("acme-operator")
	req.Header.Set("Cookie", console.CookieName+"="+a.cookie)
	req.Header.Set(console.CSRFHeader, a.csrf)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != 401 {
		t.Fatalf("cookie on /v1/sandboxes: %d, want 401", res.StatusCode)
	}
}

func TestConsoleSignInAndOutAreAudited(t *testing.T) {
	st := newStack(t)
	res, err := http.Post(st.srv.URL+"/console/session", "application/json", strings.NewReader(`{"apiKey":"moat_0123456789abcdef_nope"}`))
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if r := st.audit.Last(); r.Method != "POST" || r.Path != "/console/session" || r.Status != 401 || r.KeyID != "" {
		t.Errorf("refused sign-in: %+v", r)
	}
	b := st.signIn("beta-viewer")
	if r := st.audit.Last(); r.Status != 200 || r.KeyID != st.ids["beta-viewer"] || r.Tenant != "beta" || r.Role != "viewer" {
		t.Errorf("sign-in: %+v", r)
	}
	// Reads are not audited; sign-out is.
	n := len(st.audit.Records())
	b.call("GET", "/v1/sandboxes", "")
	if len(st.audit.Records()) != n {
		t.Errorf("a read was audited: %+v", st.audit.Last())
	}
	req, _ := http.NewRequest("DELETE", st.srv.URL+"/console/session", nil)
	req.Header.Set("Cookie", console.CookieName+"="+b.cookie)
	req.Header.Set(console.CSRFHeader, b.csrf)
	if res, err = http.DefaultClient.Do(req); err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if r := st.audit.Last(); r.Method != "DELETE" || r.Status != 204 || r.KeyID != st.ids["beta-viewer"] || r.Tenant != "beta" {
		t.Errorf("sign-out: %+v", r)
	}
}

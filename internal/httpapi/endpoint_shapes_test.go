package httpapi_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/moat-sandbox/moat/internal/egress/mitm"
	"github.com/moat-sandbox/moat/internal/egress/policy"
	"github.com/moat-sandbox/moat/internal/egress/vault"
	"github.com/moat-sandbox/moat/internal/errdefs"
	"github.com/moat-sandbox/moat/internal/httpapi"
	"github.com/moat-sandbox/moat/internal/lifecycle"
	"github.com/moat-sandbox/moat/internal/runtime/fake"
	"github.com/moat-sandbox/moat/internal/sandbox"
	"github.com/moat-sandbox/moat/internal/store"
)

// fakeEgress is an in-memory lifecycle.Egress with a credential proxy.
type fakeEgress struct {
	mu      sync.Mutex
	pols    map[string]policy.NetworkPolicy
	proxies map[string]*vault.Rules
	// withheld is what each proxy would tell of withheld credentials.
	withheld map[string]func(context.Context, mitm.Withheld)
}

func newFakeEgress() *fakeEgress {
	return &fakeEgress{pols: map[string]policy.NetworkPolicy{}, proxies: map[string]*vault.Rules{}, withheld: map[string]func(context.Context, mitm.Withheld){}}
}

func (f *fakeEgress) Attach(_ context.Context, id string, _ netip.Addr, p policy.NetworkPolicy) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.pols[id] = p
	return nil
}

func (f *fakeEgress) Detach(_ context.Context, id string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.pols, id)
	delete(f.proxies, id)
	delete(f.withheld, id)
	return nil
}

func (f *fakeEgress) Get(id string) (policy.NetworkPolicy, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	p, ok := f.pols[id]
	if !ok {
		return p, errdefs.ErrNotFound
	}
	return p, nil
}

func (f *fakeEgress) Modify(_ context.Context, id string, fn func(policy.NetworkPolicy) (policy.NetworkPolicy, error)) (policy.NetworkPolicy, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	p, err := fn(f.pols[id])
	if err != nil {
		return p, err
	}
	if p, err = policy.Normalize(p); err != nil {
		return p, err
	}
	f.pols[id] = p
	return p, nil
}

func (f *fakeEgress) AttachProxy(_ context.Context, id string, _ *mitm.CA, st *vault.State, withheld func(context.Context, mitm.Withheld)) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.proxies[id] = st.Compile()
	f.withheld[id] = withheld
	return nil
}

func (f *fakeEgress) withheldOf(id string) func(context.Context, mitm.Withheld) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.withheld[id]
}

func (f *fakeEgress) SetProxyRules(_ context.Context, id string, _ *mitm.CA, st *vault.State) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.proxies[id]; !ok {
		return errdefs.ErrNotFound
	}
	f.proxies[id] = st.Compile()
	return nil
}

func (f *fakeEgress) rules(id string) *vault.Rules {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.proxies[id]
}

// newEgressAPI is newAPI with egress enforcement and the Credential Vault.
func newEgressAPI(t *testing.T) (*httptest.Server, *fakeEgress, *store.DB) {
	t.Helper()
	db, err := store.Open(context.Background(), filepath.Join(t.TempDir(), "s.db"), time.Second)
	if err != nil {
		t.Fatal(err)
	}
	rt := fake.New(fake.Hooks{})
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	sealer, err := vault.NewSealer(bytes.Repeat([]byte{1}, vault.KeySize))
	if err != nil {
		t.Fatal(err)
	}
	eg := newFakeEgress()
	svc, err := sandbox.New(sandbox.Config{Config: lifecycle.Config{}}, sandbox.Deps{Deps: lifecycle.Deps{Store: db, Runtime: rt, Images: images{}, Log: log, Egress: eg}, Sealer: sealer})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(httpapi.New(httpapi.Config{APIKey: key}, svc, log).Handler())
	t.Cleanup(func() { srv.Close(); svc.Close(); rt.Close(); db.Close() })
	return srv, eg, db
}

const vaultSandboxBody = `{"image":{"uri":"busybox"},"entrypoint":["sh"],"timeout":120,
 "networkPolicy":{"defaultAction":"deny","egress":[{"action":"allow","target":"api.test"}]},"credentialProxy":{"enabled":true}}`

// TestEndpointShapes checks every endpoint shape the reference lists
// (direct, server proxy; the agent port, the egress port with and
// without a policy, any other port) against the route that serves it:
// each endpoint, used as upstream clients use it (base URL + path, with
// the returned headers), reaches the right service.
func TestEndpointShapes(t *testing.T) {
	srv, _, _ := newEgressAPI(t)
	host := strings.TrimPrefix(srv.URL, "http://")
	create := func(body string) string {
		code, m, _ := call(t, srv, "POST", "/v1/sandboxes", body)
		if code != 202 {
			t.Fatalf("create: %d %v", code, m)
		}
		return m["id"].(string)
	}
	withPolicy := create(vaultSandboxBody)
	plain := create(createBody)

	type use struct {
		path   string // requested under the endpoint
		status int
		want   string // in the body
	}
	for i, tc := range []struct {
		id    string
		port  string
		proxy bool
		shape string // endpoint, with ID for the sandbox and HOST for the server
		hdr   string // header the endpoint must carry
		uses  []use  // nil: shape only (the port serves nothing in the fake runtime)
	}{
		{withPolicy, "44772", false, "", "X-EXECD-ACCESS-TOKEN", []use{{"/ping", 200, ""}}},
		{withPolicy, "44772", true, "HOST/sandboxes/ID/proxy/44772", "X-EXECD-ACCESS-TOKEN", []use{{"/ping", 200, ""}}},
		{withPolicy, "18080", false, "HOST/sandboxes/ID/proxy/18080", "OPENSANDBOX-EGRESS-AUTH", []use{
			{"/policy", 200, `"enforcementMode":"dns+nft"`},
			{"/healthz", 200, "ok"},
			{"/credential-vault", 404, "CREDENTIAL_VAULT::NOT_FOUND"},
		}},
		{withPolicy, "18080", true, "HOST/sandboxes/ID/proxy/18080", "OPENSANDBOX-EGRESS-AUTH", []use{
			{"/policy", 200, `"mode":"enforcing"`},
			{"/credential-vault/bindings", 404, "CREDENTIAL_VAULT::NOT_FOUND"},
		}},
		{plain, "44772", true, "HOST/sandboxes/ID/proxy/44772", "X-EXECD-ACCESS-TOKEN", []use{{"/ping", 200, ""}}},
		{plain, "18080", false, "127.0.0.1:18080", "", nil}, // no policy: the sandbox's own port
		{plain, "18080", true, "HOST/sandboxes/ID/proxy/18080", "", nil},
		{plain, "8080", false, "127.0.0.1:8080", "", nil},
		{plain, "8080", true, "HOST/sandboxes/ID/proxy/8080", "", nil},
	} {
		q := ""
		if tc.proxy {
			q = "?use_server_proxy=true"
		}
		code, m, _ := call(t, srv, "GET", "/v1/sandboxes/"+tc.id+"/endpoints/"+tc.port+q, "")
		if code != 200 {
			t.Fatalf("%d: endpoint: %d %v", i, code, m)
		}
		ep := m["endpoint"].(string)
		hdr := headersOf(m)
		if want := strings.NewReplacer("HOST", host, "ID", tc.id).Replace(tc.shape); want != "" && ep != want {
			t.Errorf("%d: port %s proxy=%v: endpoint %q, want %q", i, tc.port, tc.proxy, ep, want)
		}
		if tc.hdr != "" && hdr[tc.hdr] == "" {
			t.Errorf("%d: endpoint headers %v lack %s", i, hdr, tc.hdr)
		}
		for _, u := range tc.uses {
			req, _ := http.NewRequest("GET", "http://"+ep+u.path, nil)
			for k, v := range hdr {
				req.Header.Set(k, v)
			}
			resp, err := srv.Client().Do(req)
			if err != nil {
				t.Fatalf("%d: GET %s%s: %v", i, ep, u.path, err)
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != u.status || !strings.Contains(string(b), u.want) {
				t.Errorf("%d: GET %s%s: %d %s, want %d with %q", i, ep, u.path, resp.StatusCode, b, u.status, u.want)
			}
		}
	}
	// The earlier shape and the /v1 mount serve the same egress API.
	_, m, _ := call(t, srv, "GET", "/v1/sandboxes/"+withPolicy+"/endpoints/18080", "")
	tok := headersOf(m)["OPENSANDBOX-EGRESS-AUTH"]
	for _, p := range []string{"/sandboxes/" + withPolicy + "/egress/policy", "/v1/sandboxes/" + withPolicy + "/proxy/18080/policy"} {
		if code, m, _ := call(t, srv, "GET", p, "", "OPEN-SANDBOX-API-KEY", "", "OPENSANDBOX-EGRESS-AUTH", tok); code != 200 || m["status"] != "ok" {
			t.Errorf("GET %s: %d %v", p, code, m)
		}
	}
	// Without the token (and without an API key) the egress API refuses.
	resp, err := http.Get(srv.URL + "/sandboxes/" + withPolicy + "/proxy/18080/policy")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 401 {
		t.Errorf("egress API without a token: %d", resp.StatusCode)
	}
	// An API key that may drive the sandbox stands in for the token.
	if code, _, _ := call(t, srv, "GET", "/sandboxes/"+withPolicy+"/proxy/18080/policy", ""); code != 200 {
		t.Errorf("egress API with the API key: %d", code)
	}
}

// TestCredentialProxyCreate covers credentialProxy on create and the vault
// behind the egress route: rules reach the proxy, the record holds no
// value in the clear.
func TestCredentialProxyCreate(t *testing.T) {
	srv, eg, db := newEgressAPI(t)
	for i, tc := range []struct {
		body, code string
		status     int
	}{
		{`{"image":{"uri":"busybox"},"entrypoint":["sh"],"credentialProxy":{"enabled":true}}`, "SANDBOX::INVALID_PARAMETER", 400},
		{`{"image":{"uri":"busybox"},"entrypoint":["sh"],"networkPolicy":{"defaultAction":"deny"},"credentialProxy":true}`, "SANDBOX::INVALID_PARAMETER", 400},
	} {
		if code, m, _ := call(t, srv, "POST", "/v1/sandboxes", tc.body); code != tc.status || m["code"] != tc.code {
			t.Errorf("%d: %d %v", i, code, m)
		}
	}
	// A pooled sandbox already runs: its trust store cannot get the CA.
	if code, m, _ := call(t, srv, "POST", "/v1/pools", `{"name":"p1","template":{"image":{"uri":"busybox"},"entrypoint":["sh"]},"capacitySpec":{"bufferMin":0,"bufferMax":0,"poolMin":0,"poolMax":4}}`); code != 201 {
		t.Fatalf("pool: %d %v", code, m)
	}
	if code, m, _ := call(t, srv, "POST", "/v1/sandboxes", `{"extensions":{"poolRef":"p1"},"networkPolicy":{"defaultAction":"deny"},"credentialProxy":{"enabled":true}}`); code != 400 || !strings.Contains(m["message"].(string), "pool") {
		t.Fatalf("credentialProxy on a pool claim: %d %v", code, m)
	}
	// enabled:false is no proxy: the vault routes answer 412.
	code, m, _ := call(t, srv, "POST", "/v1/sandboxes", `{"image":{"uri":"busybox"},"entrypoint":["sh"],"networkPolicy":{"defaultAction":"deny"},"credentialProxy":{"enabled":false}}`)
	if code != 202 {
		t.Fatalf("create: %d %v", code, m)
	}
	off := m["id"].(string)
	if code, m, _ := call(t, srv, "GET", "/sandboxes/"+off+"/proxy/18080/credential-vault", ""); code != 412 || m["code"] != vault.CodeNotEnabled {
		t.Fatalf("vault of a sandbox without credentialProxy: %d %v", code, m)
	}

	_, m, _ = call(t, srv, "POST", "/v1/sandboxes", vaultSandboxBody)
	id := m["id"].(string)
	if r := eg.rules(id); r != nil {
		t.Fatalf("a new sandbox has rules %v", r)
	}
	const secret = "httpapi-VAULT-secret-31"
	code, m, _ = call(t, srv, "POST", "/sandboxes/"+id+"/proxy/18080/credential-vault",
		`{"credentials":[{"name":"c","source":{"type":"inline","value":"`+secret+`"}}],
		  "bindings":[{"name":"b","match":{"hosts":["api.test"]},"auth":{"type":"bearer","credential":"c"}}]}`)
	if code != 201 || m["revision"] != float64(1) {
		t.Fatalf("create vault: %d %v", code, m)
	}
	if r := eg.rules(id); r.Revision() != 1 || r.Match("https", "api.test", 443, "GET", "/") == nil {
		t.Fatalf("the proxy did not get the rules: %v", r)
	}
	var rawMsg json.RawMessage
	if err := db.Get(lifecycle.Bucket, id, &rawMsg); err != nil {
		t.Fatal(err)
	}
	raw := []byte(rawMsg)
	if bytes.Contains(raw, []byte(secret)) || bytes.Contains(raw, []byte("PRIVATE KEY")) {
		t.Fatal("the sandbox record holds a credential value or the CA key in the clear")
	}
	var rec struct {
		CredentialProxy struct{ CACert, Sealed []byte } `json:"credentialProxy"`
	}
	if err := json.Unmarshal(raw, &rec); err != nil || !bytes.Contains(rec.CredentialProxy.CACert, []byte("BEGIN CERTIFICATE")) || len(rec.CredentialProxy.Sealed) == 0 {
		t.Fatalf("record: %v %+v", err, rec)
	}
	// Hosts outside the policy's explicit allow rules cannot be bound.
	code, m, _ = call(t, srv, "PATCH", "/sandboxes/"+id+"/proxy/18080/credential-vault",
		`{"bindings":{"add":[{"name":"x","match":{"hosts":["evil.test"]},"auth":{"type":"bearer","credential":"c"}}]}}`)
	if code != 400 || !strings.Contains(m["message"].(string), "not allowed") {
		t.Fatalf("binding outside the policy: %d %v", code, m)
	}
	if code, _, _ := call(t, srv, "DELETE", "/sandboxes/"+id+"/proxy/18080/credential-vault", ""); code != 204 {
		t.Fatalf("delete vault: %d", code)
	}
	if r := eg.rules(id); r != nil && r.Match("https", "api.test", 443, "GET", "/") != nil {
		t.Fatal("rules still inject after the vault was deleted")
	}
}

// A credential the proxy withholds (the destination was not resolved by
// moat's DNS) is a runtime event of the sandbox, naming the binding, the
// host and the address and pointing at match.trustedCidrs.
func TestWithheldCredentialIsASandboxEvent(t *testing.T) {
	srv, eg, _ := newEgressAPI(t)
	code, m, _ := call(t, srv, "POST", "/v1/sandboxes", vaultSandboxBody)
	if code != 202 {
		t.Fatalf("create: %d %v", code, m)
	}
	id := m["id"].(string)
	var report func(context.Context, mitm.Withheld)
	for deadline := time.Now().Add(30 * time.Second); report == nil; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the credential proxy was never attached")
		}
		report = eg.withheldOf(id)
	}
	report(context.Background(), mitm.Withheld{Binding: "api", Host: "api.test", Dst: netip.MustParseAddr("10.0.0.5")})
	events := func(scope string) string {
		t.Helper()
		code, m, _ := call(t, srv, "GET", "/v1/sandboxes/"+id+"/diagnostics/events?scope="+scope, "")
		if code != 200 {
			t.Fatalf("events: %d %v", code, m)
		}
		return m["content"].(string)
	}
	got := events("runtime")
	for _, want := range []string{" runtime CredentialWithheld UnresolvedDestination ", `binding "api"`, "api.test at 10.0.0.5",
		"match.trustedCidrs, e.g. 10.0.0.5/32"} {
		if !strings.Contains(got, want) {
			t.Errorf("runtime events lack %q:\n%s", want, got)
		}
	}
	if got := events("lifecycle"); strings.Contains(got, "CredentialWithheld") {
		t.Errorf("a runtime event among the lifecycle ones:\n%s", got)
	}
	// A sandbox that is gone takes no event (and the report does not fail).
	if code, m, _ := call(t, srv, "DELETE", "/v1/sandboxes/"+id, ""); code != 204 {
		t.Fatalf("delete: %d %v", code, m)
	}
	report(context.Background(), mitm.Withheld{Binding: "api", Host: "api.test", Dst: netip.MustParseAddr("10.0.0.6")})
	if got := events("runtime"); strings.Contains(got, "10.0.0.6") {
		t.Errorf("a deleted sandbox recorded an event:\n%s", got)
	}
}

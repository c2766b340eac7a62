package e2e

import (
	"bytes"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/moat-sandbox/moat/internal/egress/mitm"
	"github.com/moat-sandbox/moat/internal/egress/nettest"
)

// Credential values planted by the vault tests. None may appear in a
// sandbox, in the server's log or in its state on disk.
const (
	vaultBearer   = "vault-e2e-BEARER-4f1c9a"
	vaultBearer2  = "vault-e2e-BEARER2-77d0e1"
	vaultBasic    = "dmF1bHQtZTJlOkJBU0lDLTll" // base64 "vault-e2e:BASIC-9e"
	vaultKey      = "vault-e2e-APIKEY-0b5e"
	vaultOrg      = "vault-e2e-ORG-61aa"
	vaultTeam     = "vault-e2e-TEAM-c3d2"
	vaultOversize = "vault-e2e-OVERSIZE-"
	vaultSubst    = "vault-e2e-SUBST-5a93"
)

var vaultSecrets = []string{vaultBearer, vaultBearer2, vaultBasic, vaultKey, vaultOrg, vaultTeam, vaultOversize, vaultSubst}

// fakeUpstream is the "outside" API: HTTPS on :443 of two addresses of an
// outside netns (certificates from a test CA the server is told to trust),
// plain HTTP on :80. It records every request and echoes the request's
// Authorization header in its body, as httpbin does, which the credential
// proxy must scrub before it reaches the sandbox.
type fakeUpstream struct {
	mu  sync.Mutex
	got []upstreamRequest
}

type upstreamRequest struct {
	Host   string
	Path   string
	Query  string
	Header http.Header
	Body   string
}

func (u *fakeUpstream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	u.mu.Lock()
	u.got = append(u.got, upstreamRequest{Host: r.Host, Path: r.URL.Path, Query: r.URL.RawQuery, Header: r.Header.Clone(), Body: string(body)})
	u.mu.Unlock()
	fmt.Fprintf(w, "upstream %s saw Authorization=%q", r.Host, r.Header.Get("Authorization"))
}

// last returns the last request for host and path (each probe uses a
// path of its own, so an older request cannot stand in for a lost one).
func (u *fakeUpstream) last(t *testing.T, host, path string) upstreamRequest {
	t.Helper()
	u.mu.Lock()
	defer u.mu.Unlock()
	for i := len(u.got) - 1; i >= 0; i-- {
		if u.got[i].Host == host && u.got[i].Path == path {
			return u.got[i]
		}
	}
	t.Fatalf("the upstream received no request for %s%s", host, path)
	return upstreamRequest{}
}

func startFakeUpstream(t *testing.T, ns string, ca *mitm.CA, addrs ...string) *fakeUpstream {
	t.Helper()
	u := &fakeUpstream{}
	for _, a := range addrs {
		for _, port := range []string{"443", "80"} {
			var ln net.Listener
			if err := nettest.Do(ns, func() (err error) { ln, err = net.Listen("tcp", net.JoinHostPort(a, port)); return err }); err != nil {
				t.Fatal(err)
			}
			srv := &http.Server{Handler: u, ErrorLog: log.New(io.Discard, "", 0)}
			if port == "443" {
				srv.TLSConfig = &tls.Config{GetCertificate: func(h *tls.ClientHelloInfo) (*tls.Certificate, error) { return ca.Leaf(h.ServerName) }}
				go srv.ServeTLS(ln, "", "")
			} else {
				go srv.Serve(ln)
			}
			t.Cleanup(func() { srv.Close() })
		}
	}
	return u
}

// buildProbe builds testdata/tlsprobe as a static binary.
func buildProbe(t *testing.T) []byte {
	t.Helper()
	out := filepath.Join(t.TempDir(), "tlsprobe")
	cmd := exec.Command("go", "build", "-o", out, "./testdata/tlsprobe")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH="+runtime.GOARCH)
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build tlsprobe: %v\n%s", err, b)
	}
	b, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

type probeResult struct {
	Status int    `json:"status"`
	Issuer string `json:"issuer"`
	Body   string `json:"body"`
	Err    string `json:"err"`
}

// vaultSandbox is one sandbox with the credential proxy.
type vaultSandbox struct {
	t        *testing.T
	srv      *server
	id       string
	egress   string // base URL of its egress API
	tok      string
	agent    string
	agentHdr map[string]string
}

func (v *vaultSandbox) probe(args ...string) probeResult {
	v.t.Helper()
	out, _ := shell(v.t, v.srv, v.id, "/tmp/tlsprobe "+strings.Join(args, " "))
	var r probeResult
	if err := json.Unmarshal([]byte(strings.TrimSpace(out)), &r); err != nil {
		v.t.Fatalf("probe %v: %q", args, out)
	}
	return r
}

// vault calls the sandbox's egress API (what the SDKs call).
func (v *vaultSandbox) vault(method, path, body string) (int, string) {
	v.t.Helper()
	req, _ := http.NewRequest(method, v.egress+path, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("OPENSANDBOX-EGRESS-AUTH", v.tok)
	resp, err := (&http.Client{Timeout: 30 * time.Second}).Do(req)
	if err != nil {
		v.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func (v *vaultSandbox) mustVault(want int, method, path, body string) string {
	v.t.Helper()
	code, out := v.vault(method, path, body)
	if code != want {
		v.t.Fatalf("%s %s: %d, want %d: %s", method, path, code, want, out)
	}
	for _, s := range vaultSecrets {
		if strings.Contains(out, s) {
			v.t.Fatalf("%s %s returned a credential value: %s", method, path, out)
		}
	}
	return out
}

// newVaultSandbox creates a sandbox for t; parent owns its deletion (it
// outlives t). Its policy allows *.vault.test and the allow targets.
func newVaultSandbox(t, parent *testing.T, srv *server, ref, class string, probe []byte, allow ...string) *vaultSandbox {
	t.Helper()
	rules := []map[string]string{{"action": "allow", "target": "*.vault.test"}}
	for _, a := range allow {
		rules = append(rules, map[string]string{"action": "allow", "target": a})
	}
	np := map[string]any{"defaultAction": "deny", "egress": rules}
	body := map[string]any{"image": map[string]any{"uri": ref}, "entrypoint": []string{"tail", "-f", "/dev/null"}, "timeout": 600,
		"networkPolicy": np, "credentialProxy": map[string]any{"enabled": true}, "extensions": map[string]string{"moat.runtime": class}}
	var c sandboxResp
	srv.mustJSON(202, "POST", "/v1/sandboxes", body, &c)
	parent.Cleanup(func() { srv.do("DELETE", "/v1/sandboxes/"+c.ID, nil) })
	v := &vaultSandbox{t: t, srv: srv, id: c.ID}
	var ep endpointResp
	srv.mustJSON(200, "GET", "/v1/sandboxes/"+c.ID+"/endpoints/18080", nil, &ep)
	if !strings.HasSuffix(ep.Endpoint, "/sandboxes/"+c.ID+"/proxy/18080") || ep.Headers["OPENSANDBOX-EGRESS-AUTH"] == "" {
		t.Fatalf("egress endpoint %+v", ep)
	}
	v.egress, v.tok = "http://"+ep.Endpoint, ep.Headers["OPENSANDBOX-EGRESS-AUTH"]
	v.agent, v.agentHdr = srv.agent(c.ID)
	uploadFile(t, v.agent, v.agentHdr, "/tmp/tlsprobe", probe)
	if out, ok := shell(t, srv, c.ID, "chmod 755 /tmp/tlsprobe && echo ok"); !ok || !strings.Contains(out, "ok") {
		t.Fatalf("chmod probe: %q", out)
	}
	return v
}

const vaultCreate = `{
 "credentials": [
  {"name": "bearer", "source": {"type": "inline", "value": "` + vaultBearer + `"}},
  {"name": "basic", "source": {"type": "inline", "value": "` + vaultBasic + `"}},
  {"name": "key", "source": {"type": "inline", "value": "` + vaultKey + `"}},
  {"name": "org", "source": {"type": "inline", "value": "` + vaultOrg + `"}},
  {"name": "team", "source": {"type": "inline", "value": "` + vaultTeam + `"}}
 ],
 "bindings": [
  {"name": "api-v1", "match": {"hosts": ["api.vault.test"], "paths": ["/v1/*"]}, "auth": {"type": "bearer", "credential": "bearer"}},
  {"name": "v6", "match": {"hosts": ["v6.vault.test"]}, "auth": {"type": "bearer", "credential": "bearer"}},
  {"name": "api-v2", "match": {"hosts": ["api.vault.test"], "paths": ["/v2/*"], "methods": ["GET"]}, "auth": {"type": "apiKey", "name": "X-Api-Key", "credential": "key"}},
  {"name": "basic", "match": {"hosts": ["*.basic.vault.test"]}, "auth": {"type": "basic", "credential": "basic"}},
  {"name": "query", "match": {"hosts": ["q.vault.test"]}, "auth": {"type": "apiKey", "name": "api_key", "in": "query", "credential": "key"}},
  {"name": "plain", "match": {"hosts": ["plain.vault.test"], "schemes": ["http"]},
   "auth": {"type": "customHeaders", "headers": [{"name": "X-Org", "credential": "org"}, {"name": "X-Team", "credential": "team"}]}}
 ]
}`

// vaultEnv is the outside world of a Credential Vault test: a fake
// upstream (HTTPS and HTTP on two IPv4 and two IPv6 addresses of an
// outside netns, certificates from a test CA the server is told to trust),
// a DNS map naming it, and the flags that make a server use them.
type vaultEnv struct {
	o     outside
	up    *fakeUpstream
	flags []string // for moat serve: --dns-upstream, --vault-upstream-ca, --subnet6
	probe []byte
}

func newVaultEnv(t *testing.T, srv *server) *vaultEnv {
	t.Helper()
	o := outsideHost(t, srv.net, true) // dual-stack: IPv6 goes through the proxy too
	upCA, err := mitm.NewCA("upstream-e2e")
	if err != nil {
		t.Fatal(err)
	}
	caFile := filepath.Join(t.TempDir(), "upstream-ca.pem")
	if err := os.WriteFile(caFile, upCA.CertPEM(), 0o644); err != nil {
		t.Fatal(err)
	}
	up := startFakeUpstream(t, o.ns, upCA, o.a, o.b, o.a6, o.b6)
	rec := func(name, addr string) []string { return []string{name + ". 60 IN A " + addr} }
	dns, _ := nettest.ServeDNS(t, "", "127.0.0.1:0", map[string][]string{
		"api.vault.test.":     rec("api.vault.test", o.a),
		"x.basic.vault.test.": rec("x.basic.vault.test", o.a),
		"q.vault.test.":       rec("q.vault.test", o.a),
		"plain.vault.test.":   rec("plain.vault.test", o.a),
		"other.vault.test.":   rec("other.vault.test", o.b),
		"s.vault.test.":       rec("s.vault.test", o.a),
		"v6.vault.test.":      {"v6.vault.test. 60 IN AAAA " + o.a6}, // IPv6 only
	})
	return &vaultEnv{o: o, up: up, probe: buildProbe(t),
		flags: []string{"--dns-upstream", dns, "--vault-upstream-ca", caFile, "--subnet6", srv.net.Subnet6.String()}}
}

// TestCredentialVault exercises the Credential Vault through a real `moat
// serve` on every native runtime class (runc, crun, runsc): see
// vaultCases and vaultAfter. TestCredentialVaultDocker runs the same on
// the docker runtime.
func TestCredentialVault(t *testing.T) {
	srv := newServer(t)
	ref := startRegistry(t)
	env := newVaultEnv(t, srv)
	srv.start(env.flags...)

	classes := []string{"runc", "crun"}
	if _, err := exec.LookPath("runsc"); err == nil {
		classes = append(classes, "runsc")
	}
	var sandboxes []*vaultSandbox
	parent := t
	for _, class := range classes {
		t.Run(class, func(t *testing.T) {
			v := newVaultSandbox(t, parent, srv, ref, class, env.probe)
			sandboxes = append(sandboxes, v)
			vaultCases(t, v, env)
		})
	}
	vaultAfter(t, srv, ref, env, sandboxes)
}

// TestCredentialVaultDocker: the Credential Vault on the docker runtime,
// whose egress stack is the native one's (the host intercept table of its
// bridge, the same credential proxy): the cases of TestCredentialVault.
func TestCredentialVaultDocker(t *testing.T) {
	srv := newServer(t)
	ref := startRegistry(t)
	env := newVaultEnv(t, srv)
	srv.startDocker(env.flags...)
	var sandboxes []*vaultSandbox
	parent := t
	t.Run("docker", func(t *testing.T) {
		v := newVaultSandbox(t, parent, srv, ref, "docker", env.probe)
		sandboxes = append(sandboxes, v)
		vaultCases(t, v, env)
	})
	vaultAfter(t, srv, ref, env, sandboxes)
}

// vaultCases: every auth type reaches the fake upstream (names from the
// test's DNS map), a live PATCH takes effect at the next request, an
// unbound host is tunnelled untouched (the sandbox sees the upstream's own
// certificate) and gets no credential, the policy still denies an address
// no allowed name resolved to, bad input is refused with {code,message},
// and no credential value is readable in the sandbox (files, environment,
// /proc).
func vaultCases(t *testing.T, v *vaultSandbox, env *vaultEnv) {
	t.Helper()
	up, o := env.up, env.o
	caName := "moat sandbox CA " + v.id
	// No vault yet: bound nothing, so nothing is intercepted.
	if r := v.probe("-insecure", "https://api.vault.test/v1/before"); r.Status != 200 || r.Issuer != "moat sandbox CA upstream-e2e" {
		t.Fatalf("before the vault: %+v", r)
	}
	v.mustVault(404, "GET", "/credential-vault", "")
	out := v.mustVault(201, "POST", "/credential-vault", vaultCreate)
	if !strings.Contains(out, `"revision":1`) || !strings.Contains(out, `"name":"api-v1"`) {
		t.Fatalf("create: %s", out)
	}

	// Every auth type arrives; the sandbox trusts the proxy's leaf
	// through its installed CA, and sees the echo scrubbed.
	r := v.probe("https://api.vault.test/v1/models", "'Authorization: Bearer sandbox-own'")
	if r.Status != 200 || r.Issuer != caName {
		t.Fatalf("bearer: %+v", r)
	}
	if got := up.last(t, "api.vault.test", "/v1/models").Header.Values("Authorization"); len(got) != 1 || got[0] != "Bearer "+vaultBearer {
		t.Fatalf("bearer: upstream saw %q", got)
	}
	if strings.Contains(r.Body, vaultBearer) || !strings.Contains(r.Body, strings.Repeat("*", len(vaultBearer))) {
		t.Fatalf("bearer: the echo was not scrubbed: %q", r.Body)
	}
	// Over IPv6 (the name has only an AAAA record).
	if r := v.probe("https://v6.vault.test/six"); r.Status != 200 || r.Issuer != caName {
		t.Fatalf("IPv6: %+v", r)
	}
	if got := up.last(t, "v6.vault.test", "/six"); got.Header.Get("Authorization") != "Bearer "+vaultBearer {
		t.Fatalf("IPv6: upstream saw %v", got.Header)
	}
	v.probe("https://api.vault.test/v2/models")
	if h := up.last(t, "api.vault.test", "/v2/models").Header; h.Get("X-Api-Key") != vaultKey || h.Get("Authorization") != "" {
		t.Fatalf("apiKey header: upstream saw %v", h)
	}
	v.probe("https://api.vault.test/v3/models")
	if h := up.last(t, "api.vault.test", "/v3/models").Header; h.Get("X-Api-Key") != "" || h.Get("Authorization") != "" {
		t.Fatalf("unbound path: upstream saw %v", h)
	}
	v.probe("https://x.basic.vault.test/")
	if h := up.last(t, "x.basic.vault.test", "/").Header; h.Get("Authorization") != "Basic "+vaultBasic {
		t.Fatalf("basic: upstream saw %v", h)
	}
	v.probe("'https://q.vault.test/geo?z=1&api_key=mine'")
	if q := up.last(t, "q.vault.test", "/geo").Query; !strings.Contains(q, "api_key="+vaultKey) || strings.Contains(q, "mine") || !strings.Contains(q, "z=1") {
		t.Fatalf("apiKey query: upstream saw %q", q)
	}
	v.probe("http://plain.vault.test/")
	if h := up.last(t, "plain.vault.test", "/").Header; h.Get("X-Org") != vaultOrg || h.Get("X-Team") != vaultTeam {
		t.Fatalf("customHeaders over http: upstream saw %v", h)
	}
	// An unbound host: tunnelled, its own certificate, no credential.
	if r := v.probe("-insecure", "https://other.vault.test/", "'Authorization: Bearer sandbox-own'"); r.Status != 200 || r.Issuer != "moat sandbox CA upstream-e2e" {
		t.Fatalf("unbound host: %+v", r)
	}
	if h := up.last(t, "other.vault.test", "/").Header; h.Get("Authorization") != "Bearer sandbox-own" {
		t.Fatalf("unbound host: upstream saw %v", h)
	}
	if r := v.probe("https://other.vault.test/"); r.Err == "" || !strings.Contains(r.Err, "certificate") {
		t.Fatalf("the sandbox trusted an unbound host's certificate it has no root for: %+v", r)
	}
	// The policy still decides: an address no allowed name resolved
	// to stays unreachable on the intercepted port (a server does
	// listen there).
	if r := v.probe("-insecure", "-timeout", "3s", "https://["+o.b6+"]/denied"); r.Status != 0 || r.Err == "" {
		t.Fatalf("a vault sandbox reached an address its policy denies: %+v", r)
	}
	up.mu.Lock()
	for _, g := range up.got {
		if g.Path == "/denied" {
			t.Errorf("the denied address received a request: %+v", g)
		}
	}
	up.mu.Unlock()

	// Live PATCH: replace a credential and a binding, delete one,
	// bind the unbound host; the next requests follow at once.
	v.mustVault(409, "PATCH", "/credential-vault", `{"expectedRevision":7,"bindings":{"delete":["basic"]}}`)
	out = v.mustVault(200, "PATCH", "/credential-vault", `{"expectedRevision":1,
	  "credentials":{"replace":[{"name":"bearer","source":{"type":"inline","value":"`+vaultBearer2+`"}}]},
	  "bindings":{"delete":["basic"],
	    "replace":[{"name":"api-v2","match":{"hosts":["api.vault.test"],"paths":["/v2/*"]},"auth":{"type":"bearer","credential":"bearer"}}],
	    "add":[{"name":"other","match":{"hosts":["other.vault.test"]},"auth":{"type":"apiKey","name":"X-Other","credential":"key"}}]}}`)
	if !strings.Contains(out, `"revision":2`) {
		t.Fatalf("patch: %s", out)
	}
	v.probe("https://api.vault.test/v1/x")
	if h := up.last(t, "api.vault.test", "/v1/x").Header; h.Get("Authorization") != "Bearer "+vaultBearer2 {
		t.Fatalf("after PATCH, replaced credential: %v", h)
	}
	v.probe("https://api.vault.test/v2/x")
	if h := up.last(t, "api.vault.test", "/v2/x").Header; h.Get("Authorization") != "Bearer "+vaultBearer2 || h.Get("X-Api-Key") != "" {
		t.Fatalf("after PATCH, replaced binding: %v", h)
	}
	// The host is no longer bound: tunnelled (its own certificate).
	if r := v.probe("-insecure", "https://x.basic.vault.test/deleted"); r.Status != 200 || r.Issuer != "moat sandbox CA upstream-e2e" {
		t.Fatalf("after PATCH, host of a deleted binding: %+v", r)
	}
	if got := up.last(t, "x.basic.vault.test", "/deleted"); got.Path != "/deleted" || got.Header.Get("Authorization") != "" {
		t.Fatalf("after PATCH, deleted binding still injects: %+v", got)
	}
	if r := v.probe("https://other.vault.test/bound"); r.Status != 200 || r.Issuer != caName {
		t.Fatalf("after PATCH, newly bound host: %+v", r)
	}
	if h := up.last(t, "other.vault.test", "/bound").Header; h.Get("X-Other") != vaultKey {
		t.Fatalf("after PATCH, newly bound host: upstream saw %v", h)
	}

	// Bad input: a clear {code, message}, nothing leaked, nothing changed.
	for _, bad := range []struct{ body, code, want string }{
		{`{"bindings":{"add":[{"name":"x","match":{"hosts":["x.vault.test"]},"auth":{"type":"oauth2","credential":"key"}}]}}`, "CREDENTIAL_VAULT::INVALID_REQUEST", "unsupported auth type"},
		{`{"bindings":{"add":[{"name":"x","match":{"hosts":["https://x.vault.test/a"]},"auth":{"type":"bearer","credential":"key"}}]}}`, "CREDENTIAL_VAULT::INVALID_REQUEST", "not a valid host pattern"},
		{`{"bindings":{"add":[{"name":"x","match":{"hosts":["x.vault.test"],"paths":["v1"]},"auth":{"type":"bearer","credential":"key"}}]}}`, "CREDENTIAL_VAULT::INVALID_REQUEST", "must start with /"},
		{`{"bindings":{"add":[{"name":"x","match":{"hosts":["api.outside.example"]},"auth":{"type":"bearer","credential":"key"}}]}}`, "CREDENTIAL_VAULT::INVALID_REQUEST", "not allowed by an explicit allow rule"},
		{`{"credentials":{"add":[{"name":"big","source":{"value":"` + vaultOversize + strings.Repeat("x", 9000) + `"}}]}}`, "CREDENTIAL_VAULT::INVALID_REQUEST", "larger than"},
		{`{"expectedRevision":1}`, "CREDENTIAL_VAULT::REVISION_CONFLICT", "does not match"},
	} {
		code, out := v.vault("PATCH", "/credential-vault", bad.body)
		var e struct{ Code, Message string }
		json.Unmarshal([]byte(out), &e)
		if code < 400 || code >= 500 || e.Code != bad.code || !strings.Contains(e.Message, bad.want) {
			t.Errorf("bad PATCH %.60s: %d %s", bad.body, code, out)
		}
		if strings.Contains(out, vaultOversize) || strings.Contains(out, vaultKey) {
			t.Errorf("bad PATCH echoed a value: %s", out)
		}
	}
	out = v.mustVault(200, "GET", "/credential-vault", "")
	if !strings.Contains(out, `"revision":2`) {
		t.Fatalf("a refused PATCH changed the vault: %s", out)
	}
	v.mustVault(200, "GET", "/credential-vault/credentials/bearer", "")
	v.mustVault(200, "GET", "/credential-vault/bindings/other", "")
	v.mustVault(404, "GET", "/credential-vault/bindings/basic", "")

	// Substitutions (a live PATCH): the sandbox writes a placeholder in
	// the path, query, a header and a JSON body; the upstream gets the
	// value in each, and its echo reaches the sandbox scrubbed.
	out = v.mustVault(200, "PATCH", "/credential-vault", `{"expectedRevision":2,
	  "credentials":{"add":[{"name":"subst","source":{"value":"`+vaultSubst+`"}}]},
	  "bindings":{"add":[{"name":"subst","match":{"hosts":["s.vault.test"],"methods":["POST"]},"auth":{"type":"passthrough",
	    "substitutions":[{"credential":"subst","placeholder":"{{SUBST}}","in":["path","query","header","body"]}]}}]}}`)
	if !strings.Contains(out, `"revision":3`) || !strings.Contains(out, `"type":"passthrough"`) || strings.Contains(out, "{{SUBST}}") {
		t.Fatalf("substitutions patch: %s", out)
	}
	r = v.probe("-data", `'{"key":"{{SUBST}}"}'`, "'https://s.vault.test/p/{{SUBST}}?k={{SUBST}}'",
		"'Authorization: Bearer {{SUBST}}'", "'Content-Type: application/json'")
	if r.Status != 200 || r.Issuer != caName {
		t.Fatalf("substitutions: %+v", r)
	}
	got := up.last(t, "s.vault.test", "/p/"+vaultSubst)
	if got.Query != "k="+vaultSubst || got.Header.Get("Authorization") != "Bearer "+vaultSubst || got.Body != `{"key":"`+vaultSubst+`"}` {
		t.Fatalf("substitutions: upstream saw %+v", got)
	}
	if strings.Contains(r.Body, vaultSubst) || !strings.Contains(r.Body, strings.Repeat("*", len(vaultSubst))) {
		t.Fatalf("substitutions: the echo was not scrubbed: %q", r.Body)
	}

	assertSandboxHoldsNoSecret(t, v)
}

// vaultAfter (after vaultCases on sandboxes): the denied address answers
// a sandbox without a policy (the control of the denied-address case);
// across a server restart every vault (sealed in the store) keeps its
// effect; DELETE stops the injection; no value is in the server's log or
// on its disk; deleting the sandboxes empties the intercept table.
func vaultAfter(t *testing.T, srv *server, ref string, env *vaultEnv, sandboxes []*vaultSandbox) {
	t.Helper()
	up, o, probe := env.up, env.o, env.probe
	if t.Failed() || len(sandboxes) == 0 {
		return
	}
	// Control for the denied-address check: without a policy the same
	// address and port answer.
	var c sandboxResp
	srv.mustJSON(202, "POST", "/v1/sandboxes", map[string]any{"image": map[string]any{"uri": ref}, "entrypoint": []string{"tail", "-f", "/dev/null"}, "timeout": 600}, &c)
	t.Cleanup(func() { srv.do("DELETE", "/v1/sandboxes/"+c.ID, nil) })
	ctl := &vaultSandbox{t: t, srv: srv, id: c.ID}
	ctl.agent, ctl.agentHdr = srv.agent(c.ID)
	uploadFile(t, ctl.agent, ctl.agentHdr, "/tmp/tlsprobe", probe)
	shell(t, srv, c.ID, "chmod 755 /tmp/tlsprobe")
	if r := ctl.probe("-insecure", "-timeout", "10s", "https://["+o.b6+"]/control"); r.Status != 200 {
		t.Fatalf("control: a sandbox without policy cannot reach the address: %+v", r)
	}
	up.last(t, "["+o.b6+"]", "/control")

	// A restart keeps every vault (sealed in the store) and its effect.
	srv.kill9()
	srv.start(srv.lastArgs...)
	v := sandboxes[0]
	v.t = t
	v.mustVault(200, "GET", "/credential-vault", "")
	v.probe("https://api.vault.test/v1/after-restart")
	if h := up.last(t, "api.vault.test", "/v1/after-restart").Header; h.Get("Authorization") != "Bearer "+vaultBearer2 {
		t.Fatalf("after a server restart: upstream saw %v", h)
	}
	v.mustVault(204, "DELETE", "/credential-vault", "")
	v.probe("-insecure", "https://api.vault.test/v1/after-delete")
	if h := up.last(t, "api.vault.test", "/v1/after-delete").Header; h.Get("Authorization") != "" {
		t.Fatalf("after DELETE: upstream saw %v", h)
	}

	// Nothing in the server's log or on its disk holds a value.
	logb, _ := os.ReadFile(srv.logf.Name())
	for _, s := range vaultSecrets {
		if bytes.Contains(logb, []byte(s)) {
			t.Errorf("the server log holds a credential value (%s...)", s[:12])
		}
	}
	filepath.Walk(srv.root, func(p string, info os.FileInfo, err error) error {
		if err != nil || !info.Mode().IsRegular() || info.Size() > 256<<20 {
			return nil
		}
		b, _ := os.ReadFile(p)
		for _, s := range vaultSecrets {
			if bytes.Contains(b, []byte(s)) {
				t.Errorf("%s holds a credential value in the clear (%s...)", p, s[:12])
			}
		}
		return nil
	})
	if _, err := os.Stat(filepath.Join(srv.root, "vault.key")); err != nil {
		t.Errorf("no vault key: %v", err)
	}

	// Deleting the sandboxes takes their addresses out of the intercept
	// table (a later sandbox on a reused address is not redirected).
	sets := func() string {
		out, err := exec.Command("nft", "list", "table", "inet", "moat-vault-"+srv.sandboxBridge()).CombinedOutput()
		if err != nil {
			t.Fatalf("nft list: %v: %s", err, out)
		}
		return string(out)
	}
	if got := sets(); !strings.Contains(got, "elements") {
		t.Fatalf("the intercept table has no clients while vault sandboxes run:\n%s", got)
	}
	srv.deleteAll()
	if got := sets(); strings.Contains(got, "elements") {
		t.Fatalf("intercept clients left after every sandbox was deleted:\n%s", got)
	}
}

// assertSandboxHoldsNoSecret searches the sandbox's files, every
// process's environment and command line for each credential value. The
// values are handed in through a file (so no grep command line carries
// one), which the search skips and which is removed afterwards (the
// server's disk is searched later).
func assertSandboxHoldsNoSecret(t *testing.T, v *vaultSandbox) {
	t.Helper()
	uploadFile(t, v.agent, v.agentHdr, "/tmp/.needles", []byte(strings.Join(vaultSecrets, "\n")+"\n"))
	out, _ := shell(t, v.srv, v.id, `
for d in /bin /dev/shm /etc /home /root /run /sbin /tmp /usr /var /.moat; do
  [ -e "$d" ] && grep -rlsF -f /tmp/.needles "$d" | grep -v '^/tmp/.needles$'
done
for f in /proc/[0-9]*/environ /proc/[0-9]*/cmdline; do grep -lsF -f /tmp/.needles "$f"; done
env | grep -F -f /tmp/.needles
echo searched`)
	if strings.TrimSpace(out) != "searched" {
		t.Fatalf("a credential value is readable inside the sandbox:\n%s", out)
	}
	// The search itself works: a planted value is found.
	if out, _ := shell(t, v.srv, v.id, "cp /tmp/.needles /tmp/planted; grep -rlsF -f /tmp/.needles /tmp | grep -c planted; rm /tmp/planted /tmp/.needles"); strings.TrimSpace(out) != "1" {
		t.Fatalf("the sandbox search does not find a planted value: %q", out)
	}
}

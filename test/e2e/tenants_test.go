package e2e

import (
	"bufio"
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestTenants drives tenants, keys and roles through a real `moat serve`
// (native runtime) and the real `moat` CLI: keys made with `moat key
// create` (the server's own key is the platform key of tenant default), one
// tenant's sandbox invisible to another on the API, the server proxy and
// the ingress gateway, a viewer refused every change, a quota refusal,
// the audit log naming key and tenant, keys and quotas surviving a server
// restart, and revocation taking effect at once.
func TestTenants(t *testing.T) {
	srv := newServer(t)
	ref := startRegistry(t)
	gw := freePort(t)
	srv.start("--ingress-listen", gw)

	// The key secret is created on first start, private to root.
	if fi, err := os.Stat(filepath.Join(srv.root, "key-secret")); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("key secret file: %v %v", fi, err)
	}
	newKey := func(tenant, role string) string {
		t.Helper()
		r := mustCLI(t, srv, 0, "key", "create", "--tenant", tenant, "--role", role, "--name", "e2e "+role)
		k := strings.TrimSpace(r.stdout)
		if !strings.HasPrefix(k, "moat_") || !strings.Contains(r.stderr, "cannot be shown again") {
			t.Fatalf("key create: %q %q", r.stdout, r.stderr)
		}
		return k
	}
	acme, acmeView, beta := newKey("acme", "operator"), newKey("acme", "viewer"), newKey("beta", "operator")
	as := func(key, method, path string, body any, hdr ...string) (int, map[string]any) {
		t.Helper()
		code, b, _ := srv.do(method, path, body, append([]string{"OPEN-SANDBOX-API-KEY", key}, hdr...)...)
		var m map[string]any
		json.Unmarshal(b, &m)
		return code, m
	}
	create := map[string]any{"image": map[string]any{"uri": ref}, "entrypoint": []string{"sh", "-c", "echo hello-acme > /tmp/index.html && exec httpd -f -p 8080 -h /tmp"},
		"timeout": 600, "resourceLimits": map[string]string{"cpu": "500m", "memory": "128Mi"}}
	code, sb := as(acme, "POST", "/v1/sandboxes", create)
	if code != 202 {
		t.Fatalf("acme create: %d %v", code, sb)
	}
	id := sb["id"].(string)

	// acme's viewer reads it; beta finds nothing, anywhere.
	if code, body := as(acmeView, "GET", "/v1/sandboxes/"+id, nil); code != 200 || body["status"].(map[string]any)["state"] != "Running" {
		t.Fatalf("acme viewer get: %d %v", code, body)
	}
	for _, p := range []string{"/v1/sandboxes/" + id, "/v1/sandboxes/" + id + "/endpoints/8080", "/v1/sandboxes/" + id + "/diagnostics/summary",
		"/v1/sandboxes/" + id + "/proxy/8080/", "/sandboxes/" + id + "/proxy/44772/ping"} {
		if code, body := as(beta, "GET", p, nil); code != 404 {
			t.Errorf("beta GET %s: %d %v, want 404", p, code, body)
		}
	}
	for _, call := range [][2]string{{"DELETE", "/v1/sandboxes/" + id}, {"POST", "/v1/sandboxes/" + id + "/pause"}} {
		if code, body := as(beta, call[0], call[1], nil); code != 404 {
			t.Errorf("beta %s %s: %d %v, want 404", call[0], call[1], code, body)
		}
	}
	if _, list := as(beta, "GET", "/v1/sandboxes", nil); strings.Contains(jsonString(list), id) {
		t.Errorf("beta lists acme's sandbox: %v", list)
	}
	// The viewer changes nothing.
	for _, call := range []struct {
		m, p string
		body any
	}{{"DELETE", "/v1/sandboxes/" + id, nil}, {"POST", "/v1/sandboxes", create}, {"PATCH", "/v1/sandboxes/" + id + "/metadata", map[string]string{"a": "b"}}} {
		if code, body := as(acmeView, call.m, call.p, call.body); code != 403 || body["code"] != "PERMISSION_DENIED" {
			t.Errorf("viewer %s %s: %d %v, want 403", call.m, call.p, code, body)
		}
	}
	// The owner reaches the sandbox's port through the server proxy; the
	// gateway routes it for acme's key and for no key (the data plane),
	// not for beta's.
	proxied := func(key string) (int, string) {
		t.Helper()
		// httpd may still be starting: until it listens the server proxy
		// answers 503 SANDBOX::PROXY_UNREACHABLE (connection refused). How
		// long that takes depends on the machine's load (it took over 2.5 s
		// under a CPU hog on both cores), so only a hang fails.
		for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
			code, b, _ := srv.do("GET", "/v1/sandboxes/"+id+"/proxy/8080/index.html", nil, "OPEN-SANDBOX-API-KEY", key)
			starting := code == 502 || (code == 503 && strings.Contains(string(b), "SANDBOX::PROXY_UNREACHABLE"))
			if !starting || time.Now().After(deadline) {
				return code, strings.TrimSpace(string(b))
			}
		}
	}
	if code, body := proxied(acme); code != 200 || body != "hello-acme" {
		t.Errorf("proxy with acme's key: %d %q", code, body)
	}
	if code, body := proxied(beta); code != 404 || !strings.Contains(body, "SANDBOX::NOT_FOUND") {
		t.Errorf("proxy with beta's key: %d %q", code, body)
	}
	gwGet := func(key string) int {
		hdr := map[string]string{}
		if key != "" {
			hdr["OPEN-SANDBOX-API-KEY"] = key
		}
		code, _, err := getServed(&http.Client{Timeout: 10 * time.Second}, "http://"+gw+"/"+id+"/8080/index.html", hdr)
		if err != nil {
			t.Fatal(err)
		}
		return code
	}
	if c := gwGet(beta); c != 404 {
		t.Errorf("gateway with beta's key: %d, want 404", c)
	}
	if a, n := gwGet(acme), gwGet(""); a != 200 || n != 200 {
		t.Errorf("gateway with acme's key %d, without a key %d: want 200 from the sandbox", a, n)
	}
	if c := gwGet(acme[:len(acme)-1] + "x"); c != 401 {
		t.Errorf("gateway with a forged key: %d, want 401", c)
	}

	// Quota: acme may hold one sandbox; the refusal is clear.
	mustCLI(t, srv, 0, "tenant", "set", "acme", "--sandboxes", "1", "--cpu", "2", "--memory", "1Gi")
	if code, body := as(acme, "POST", "/v1/sandboxes", create); code != 403 || body["code"] != "TENANT::QUOTA_EXCEEDED" {
		t.Errorf("create over quota: %d %v", code, body)
	}
	if r := mustCLI(t, srv, 0, "tenant", "get", "acme"); !strings.Contains(r.stdout, "1/1") || !strings.Contains(r.stdout, "500m/2") {
		t.Errorf("tenant usage: %q", r.stdout)
	}

	// The server's own key is the platform key of tenant default: it sees
	// acme's sandbox, and can act in acme.
	if code, body := as(srv.key, "GET", "/v1/sandboxes/"+id, nil); code != 200 {
		t.Errorf("server key get: %d %v", code, body)
	}
	if _, body := as(srv.key, "GET", "/v1/sandboxes", nil, "X-Moat-Tenant", "beta"); strings.Contains(jsonString(body), id) {
		t.Errorf("platform key narrowed to beta sees acme's sandbox")
	}

	// The audit log names the key and tenant of acme's create.
	var acmeKeyID string
	if code, who := as(acme, "GET", "/v1/whoami", nil); code == 200 {
		acmeKeyID, _ = who["keyId"].(string)
	}
	if !auditHas(t, srv, func(r map[string]any) bool {
		return r["method"] == "POST" && r["sandboxId"] == id && r["keyId"] == acmeKeyID && r["tenant"] == "acme" && r["status"] == float64(202)
	}) {
		t.Errorf("no audit record of acme's create by key %s", acmeKeyID)
	}

	// Keys, tenants, quotas and ownership survive a restart.
	srv.stop()
	srv.start("--ingress-listen", gw)
	if code, body := as(beta, "GET", "/v1/sandboxes/"+id, nil); code != 404 {
		t.Errorf("after restart, beta get: %d %v", code, body)
	}
	if code, body := as(acme, "POST", "/v1/sandboxes", create); code != 403 || body["code"] != "TENANT::QUOTA_EXCEEDED" {
		t.Errorf("after restart, create over quota: %d %v", code, body)
	}
	// Revocation is immediate.
	mustCLI(t, srv, 0, "key", "revoke", acmeKeyID)
	if code, body := as(acme, "GET", "/v1/sandboxes/"+id, nil); code != 401 || body["code"] != "INVALID_API_KEY" {
		t.Errorf("revoked key: %d %v", code, body)
	}
	if code, _ := as(acmeView, "GET", "/v1/sandboxes/"+id, nil); code != 200 {
		t.Errorf("the viewer's key went with the operator's: %d", code)
	}
	// The keys never appear in the store or the audit log.
	for _, f := range []string{"state.db", "audit.log"} {
		b, err := os.ReadFile(filepath.Join(srv.root, f))
		if err != nil {
			t.Fatal(err)
		}
		for _, k := range []string{acme, acmeView, beta} {
			if strings.Contains(string(b), k[len(k)-64:]) {
				t.Errorf("%s holds a key's secret", f)
			}
		}
	}
	if code, _ := as(srv.key, "DELETE", "/v1/sandboxes/"+id, nil); code != 204 {
		t.Errorf("delete: %d", code)
	}
}

func jsonString(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}

// auditHas reports whether a record of the server's audit log matches.
func auditHas(t *testing.T, srv *server, match func(map[string]any) bool) bool {
	t.Helper()
	f, err := os.Open(filepath.Join(srv.root, "audit.log"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var r map[string]any
		if json.Unmarshal(sc.Bytes(), &r) == nil && match(r) {
			return true
		}
	}
	return false
}

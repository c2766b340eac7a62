package e2e

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/moat-sandbox/moat/internal/egress/nettest"
)

// TestTenantAdminFenced drives the fence through a real `moat serve` and
// the real CLI: tenant acme's admin key manages acme and finds nothing of
// tenant default (the server key's sandbox, keys, tenant), may not grant
// the platform role nor set quotas, and `moat key whoami` says what it
// sees; a role that does not exist is a clear error.
func TestTenantAdminFenced(t *testing.T) {
	srv := newServer(t)
	ref := startRegistry(t)
	srv.start()
	key := func(tenant, role string) string {
		t.Helper()
		return strings.TrimSpace(mustCLI(t, srv, 0, "key", "create", "--tenant", tenant, "--role", role).stdout)
	}
	admin := key("acme", "admin")
	as := func(k, method, path string, body any, hdr ...string) (int, map[string]any) {
		t.Helper()
		code, b, _ := srv.do(method, path, body, append([]string{"OPEN-SANDBOX-API-KEY", k}, hdr...)...)
		var m map[string]any
		json.Unmarshal(b, &m)
		return code, m
	}
	def := srv.createIdle(ref, nil) // tenant default's, by the server's key
	for _, c := range [][2]string{{"GET", "/v1/sandboxes/" + def}, {"DELETE", "/v1/sandboxes/" + def}, {"POST", "/v1/sandboxes/" + def + "/pause"},
		{"GET", "/v1/sandboxes/" + def + "/endpoints/44772"}, {"GET", "/v1/sandboxes/" + def + "/diagnostics/summary"},
		{"GET", "/v1/sandboxes/" + def + "/proxy/44772/ping"}, {"GET", "/v1/keys/root"}, {"GET", "/v1/tenants/default"}} {
		if code, body := as(admin, c[0], c[1], nil); code != 404 {
			t.Errorf("acme admin %s %s: %d %v, want 404", c[0], c[1], code, body)
		}
	}
	// The same through the X-Moat-Tenant header: only its own tenant.
	if code, body := as(admin, "GET", "/v1/sandboxes", nil, "X-Moat-Tenant", "default"); code != 403 || body["code"] != "PERMISSION_DENIED" {
		t.Errorf("acme admin naming default: %d %v", code, body)
	}
	if code, body := as(admin, "GET", "/v1/sandboxes", nil); code != 200 || strings.Contains(jsonString(body), def) {
		t.Errorf("acme admin lists %d %v", code, body)
	}
	// It manages acme's keys, not default's, and cannot grant platform.
	cli := func(k string, code int, args ...string) cliRun {
		t.Helper()
		cmd := cliCmd(srv, args...)
		cmd.Env = append(cmd.Env, "OPEN_SANDBOX_API_KEY="+k)
		var out, errOut strings.Builder
		cmd.Stdout, cmd.Stderr = &out, &errOut
		err := cmd.Run()
		got := 0
		if err != nil {
			got = cmd.ProcessState.ExitCode()
		}
		if got != code {
			t.Fatalf("moat %v: exit %d, want %d: %s %s", args, got, code, out.String(), errOut.String())
		}
		return cliRun{stdout: out.String(), stderr: errOut.String(), code: got}
	}
	if r := cli(admin, 0, "key", "create", "--tenant", "acme", "--role", "viewer"); !strings.HasPrefix(strings.TrimSpace(r.stdout), "moat_") {
		t.Errorf("acme admin creates an acme viewer: %q", r.stdout)
	}
	if r := cli(admin, 4, "key", "create", "--tenant", "default", "--role", "admin"); !strings.Contains(r.stderr, "not found") {
		t.Errorf("acme admin creates a default key: %q", r.stderr)
	}
	if r := cli(admin, 1, "key", "create", "--tenant", "acme", "--role", "platform"); !strings.Contains(r.stderr, "only the server's own key") {
		t.Errorf("acme admin grants platform: %q", r.stderr)
	}
	if r := cli(admin, 1, "tenant", "set", "acme", "--sandboxes", "500"); !strings.Contains(r.stderr, "needs platform") {
		t.Errorf("acme admin sets its quota: %q", r.stderr)
	}
	if r := cli(admin, 0, "key", "ls"); strings.Contains(r.stdout, "root") || strings.Contains(r.stdout, "default") {
		t.Errorf("acme admin lists keys:\n%s", r.stdout)
	}
	if r := cli(admin, 0, "key", "whoami"); !strings.Contains(r.stdout, "tenant acme only") || !strings.Contains(r.stdout, "admin") {
		t.Errorf("whoami (acme admin):\n%s", r.stdout)
	}
	if r := mustCLI(t, srv, 0, "key", "whoami"); !strings.Contains(r.stdout, "all tenants") || !strings.Contains(r.stdout, "platform") {
		t.Errorf("whoami (server key):\n%s", r.stdout)
	}
	// Bad input: a role that does not exist.
	if code, body := as(srv.key, "POST", "/v1/keys", map[string]string{"tenant": "acme", "role": "superuser"}); code != 400 || body["code"] != "KEY::INVALID_ROLE" || !strings.Contains(jsonString(body["message"]), "platform, admin, operator or viewer") {
		t.Errorf("unknown role: %d %v", code, body)
	}
	// The server key grants platform; that key sees default's sandbox.
	plat := key("default", "platform")
	if code, body := as(plat, "GET", "/v1/sandboxes/"+def, nil); code != 200 {
		t.Errorf("platform key: %d %v", code, body)
	}
	if code, _ := as(srv.key, "GET", "/v1/sandboxes/"+def, nil); code != 200 {
		t.Errorf("default's sandbox was touched: %d", code)
	}
}

// TestTenantEgressGuardrail: a platform key sets tenant acme's egress
// guardrail; acme's running sandboxes (one without a policy of its own, one
// with an allow-all policy) reach a fake outside host before it and not
// after, at once, while a sandbox of tenant beta still does; the host the
// guardrail allows stays reachable; the effective policy is readable; the
// guardrail survives a restart; a Credential Vault binding outside it is
// refused; a policy that does not parse is a clear 400.
func TestTenantEgressGuardrail(t *testing.T) {
	srv := newServer(t)
	ref := startRegistry(t)
	o := outsideHost(t, srv.net, false)
	nettest.ServeTCP(t, o.ns, o.b+":7000")
	srv.start()
	acme := strings.TrimSpace(mustCLI(t, srv, 0, "key", "create", "--tenant", "acme", "--role", "operator").stdout)
	beta := strings.TrimSpace(mustCLI(t, srv, 0, "key", "create", "--tenant", "beta", "--role", "operator").stdout)
	create := func(k string, extra map[string]any) string {
		t.Helper()
		body := map[string]any{"image": map[string]any{"uri": ref}, "entrypoint": []string{"tail", "-f", "/dev/null"}, "timeout": 600}
		for kk, v := range extra {
			body[kk] = v
		}
		code, b, _ := srv.do("POST", "/v1/sandboxes", body, "OPEN-SANDBOX-API-KEY", k)
		var c sandboxResp
		if json.Unmarshal(b, &c); code != 202 || c.ID == "" {
			t.Fatalf("create: %d %s", code, b)
		}
		t.Cleanup(func() { srv.do("DELETE", "/v1/sandboxes/"+c.ID, nil) })
		return c.ID
	}
	bare := create(acme, nil)
	own := create(acme, map[string]any{"networkPolicy": map[string]any{"defaultAction": "allow"}})
	other := create(beta, nil)
	reaches := func(id, addr string) bool {
		t.Helper()
		out, _ := shell(t, srv, id, probeOutside(addr))
		return reachedOutside(out)
	}
	for _, id := range []string{bare, own, other} {
		if !reaches(id, o.a) {
			t.Fatalf("before the guardrail, %s cannot reach the outside host", id)
		}
	}

	// Bad input first: nothing is set.
	code, b, _ := srv.do("PUT", "/v1/tenants/acme/egress", []byte(`{"defaultAction":"sometimes"}`))
	var e map[string]any
	if json.Unmarshal(b, &e); code != 400 || e["code"] != "TENANT::INVALID_EGRESS_POLICY" || !strings.Contains(jsonString(e["message"]), "defaultAction") {
		t.Errorf("bad guardrail: %d %s", code, b)
	}
	r := mustCLI(t, srv, 0, "tenant", "egress", "set", "acme", "--default", "deny", "--allow", o.b+"/32", "--allow", "api.vault.test")
	if !strings.Contains(r.stdout, "Applied to:") || !strings.Contains(r.stdout, "2 running sandboxes") {
		t.Errorf("egress set: %q", r.stdout)
	}
	// At once: no wait, the update is synchronous.
	for _, id := range []string{bare, own} {
		if reaches(id, o.a) {
			t.Errorf("after the guardrail, acme's %s still reaches %s", id, o.a)
		}
		if !reaches(id, o.b) {
			t.Errorf("after the guardrail, acme's %s no longer reaches the allowed %s", id, o.b)
		}
	}
	if !reaches(other, o.a) {
		t.Error("beta's sandbox lost its egress to acme's guardrail")
	}
	// Readable: the tenant's guardrail, and a sandbox's layers.
	if r := cli(t, srv, nil, "tenant", "egress", "get", "acme"); r.code != 0 || !strings.Contains(r.stdout, "allow "+o.b+"/32") {
		t.Errorf("egress get: %+v", r)
	}
	code, b, _ = srv.do("GET", "/v1/sandboxes/"+own+"/egress/policy", nil, "OPEN-SANDBOX-API-KEY", acme)
	var st struct {
		Mode                                  string
		Policy, TenantPolicy, EffectivePolicy *struct{ DefaultAction string }
	}
	if json.Unmarshal(b, &st); code != 200 || st.Policy == nil || st.Policy.DefaultAction != "allow" || st.TenantPolicy == nil ||
		st.EffectivePolicy == nil || st.EffectivePolicy.DefaultAction != "deny" || st.Mode != "enforcing" {
		t.Errorf("egress policy of a guarded sandbox: %d %s", code, b)
	}
	// The sandbox cannot widen it through its own egress API.
	code, b, _ = srv.do("PATCH", "/v1/sandboxes/"+own+"/egress/policy", []byte(`[{"action":"allow","target":"`+o.a+`"}]`), "OPEN-SANDBOX-API-KEY", acme)
	if code != 200 || reaches(own, o.a) {
		t.Errorf("a sandbox widened its guardrail: %d %s", code, b)
	}

	// A Credential Vault binding must fall inside the guardrail.
	vs := create(acme, map[string]any{"networkPolicy": map[string]any{"defaultAction": "deny", "egress": []map[string]string{{"action": "allow", "target": "*.vault.test"}}},
		"credentialProxy": map[string]any{"enabled": true}})
	vault := func(body string) (int, map[string]any) {
		code, b, _ := srv.do("POST", "/v1/sandboxes/"+vs+"/egress/credential-vault", []byte(body), "OPEN-SANDBOX-API-KEY", acme)
		var m map[string]any
		json.Unmarshal(b, &m)
		return code, m
	}
	bind := func(host string) string {
		return `{"credentials":[{"name":"c","source":{"type":"inline","value":"guardrail-e2e-secret"}}],` +
			`"bindings":[{"name":"b","match":{"hosts":["` + host + `"]},"auth":{"type":"bearer","credential":"c"}}]}`
	}
	if code, body := vault(bind("other.vault.test")); code != 400 || body["code"] != "CREDENTIAL_VAULT::INVALID_REQUEST" ||
		!strings.Contains(jsonString(body["message"]), "egress guardrail of tenant acme") {
		t.Errorf("binding outside the guardrail: %d %v", code, body)
	}
	if code, body := vault(bind("api.vault.test")); code != 201 {
		t.Errorf("binding inside the guardrail: %d %v", code, body)
	}

	// The guardrail survives a restart: re-attached with it.
	srv.stop()
	srv.start()
	deadline := time.Now().Add(30 * time.Second)
	for reaches(bare, o.a) {
		if time.Now().After(deadline) {
			t.Fatal("after a restart, the guarded sandbox reaches the denied host")
		}
		time.Sleep(time.Second)
	}
	// Removed: the sandboxes get their own policies back, at once.
	mustCLI(t, srv, 0, "tenant", "egress", "rm", "acme")
	for _, id := range []string{bare, own} {
		if !reaches(id, o.a) {
			t.Errorf("after removing the guardrail, %s cannot reach %s", id, o.a)
		}
	}
}

package cli

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/moat-sandbox/moat/internal/egress"
	"github.com/moat-sandbox/moat/internal/egress/policy"
	"github.com/moat-sandbox/moat/internal/egress/vault"
)

// memVaults is an in-memory egress.VaultService.
type memVaults struct {
	mu    sync.Mutex
	state *vault.State
}

func (m *memVaults) CreateVault(_ context.Context, _ string, req vault.CreateRequest) (vault.View, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.state != nil {
		return vault.View{}, vault.ErrExists
	}
	s, err := vault.New(req, nil)
	if err != nil {
		return vault.View{}, err
	}
	m.state = s
	return s.View(), nil
}

func (m *memVaults) GetVault(context.Context, string) (*vault.State, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.state == nil {
		return nil, vault.ErrNotFound
	}
	return m.state, nil
}

func (m *memVaults) PatchVault(_ context.Context, _ string, req vault.PatchRequest) (vault.View, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.state == nil {
		return vault.View{}, vault.ErrNotFound
	}
	s, err := m.state.Apply(req, nil)
	if err != nil {
		return vault.View{}, err
	}
	m.state = s
	return s.View(), nil
}

func (m *memVaults) DeleteVault(context.Context, string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.state == nil {
		return vault.ErrNotFound
	}
	m.state = nil
	return nil
}

type nopPolicies struct{}

func (nopPolicies) Get(string) (policy.NetworkPolicy, error) { return policy.DenyAll(), nil }
func (nopPolicies) Modify(_ context.Context, _ string, fn func(policy.NetworkPolicy) (policy.NetworkPolicy, error)) (policy.NetworkPolicy, error) {
	return fn(policy.DenyAll())
}

// TestVaultCommands drives `moat credential-vault` against the real egress
// API handler behind a loopback server that resolves endpoints as moat does.
func TestVaultCommands(t *testing.T) {
	const tok = "egress-tok"
	mv := &memVaults{}
	eh := egress.NewHandler(nopPolicies{}, "sb1", egress.HandlerOptions{Token: tok, Vault: mv})
	mux := http.NewServeMux()
	var srv *httptest.Server
	mux.HandleFunc("GET /v1/sandboxes/sb1/endpoints/{port}", func(w http.ResponseWriter, r *http.Request) {
		host := strings.TrimPrefix(srv.URL, "http://")
		ep := map[string]any{"endpoint": host + "/agent", "headers": map[string]string{"X-EXECD-ACCESS-TOKEN": "a"}}
		if r.PathValue("port") == "18080" {
			ep = map[string]any{"endpoint": host + "/sandboxes/sb1/proxy/18080", "headers": map[string]string{"OPENSANDBOX-EGRESS-AUTH": tok}}
		}
		json.NewEncoder(w).Encode(ep)
	})
	mux.Handle("/sandboxes/sb1/proxy/18080/", http.StripPrefix("/sandboxes/sb1/proxy/18080", eh))
	srv = httptest.NewServer(mux)
	defer srv.Close()

	const secret = "cli-SECRET-value-99"
	file := filepath.Join(t.TempDir(), "vault.json")
	os.WriteFile(file, []byte(`{"credentials":[{"name":"gh","source":{"type":"inline","value":"`+secret+`"}}],
	  "bindings":[{"name":"github","match":{"hosts":["api.test"]},"auth":{"type":"apiKey","name":"X-Key","in":"query","credential":"gh"}}]}`), 0o600)
	run := func(stdin string, args ...string) (string, string, int) {
		t.Helper()
		var in *strings.Reader
		if stdin != "" {
			in = strings.NewReader(stdin)
		}
		all := append([]string{"credential-vault", "--server", srv.URL, "--api-key", "k"}, args...)
		var out, errOut string
		var code int
		if in != nil {
			out, errOut, code = runMoat(t, in, all...)
		} else {
			out, errOut, code = runMoat(t, nil, all...)
		}
		if strings.Contains(out+errOut, secret) {
			t.Fatalf("%v printed a credential value: %s %s", args, out, errOut)
		}
		return out, errOut, code
	}
	if out, errOut, code := run("", "create", "sb1", "--file", file); code != 0 || !strings.Contains(out, "github") || !strings.Contains(out, "query X-Key") {
		t.Fatalf("create: %d %q %q", code, out, errOut)
	}
	if _, errOut, code := run("", "create", "sb1", "--file", file); code != 3 || !strings.Contains(errOut, "CREDENTIAL_VAULT::ALREADY_EXISTS") {
		t.Fatalf("second create: %d %q", code, errOut)
	}
	if _, errOut, code := run("", "create", "sb1"); code != 2 || !strings.Contains(errOut, "--file is required") {
		t.Fatalf("create without a file: %d %q", code, errOut)
	}
	out, _, code := run("", "get", "sb1", "-o", "json")
	var st struct{ Revision int64 }
	if code != 0 || json.Unmarshal([]byte(out), &st) != nil || st.Revision != 1 {
		t.Fatalf("get: %d %q", code, out)
	}
	patch := `{"credentials":{"add":[{"name":"k2","source":{"value":"` + secret + `2"}}]}}`
	if _, errOut, code := run(patch, "patch", "sb1", "--expected-revision", "5", "--file", "-"); code != 3 || !strings.Contains(errOut, "REVISION_CONFLICT") {
		t.Fatalf("stale patch: %d %q", code, errOut)
	}
	if out, errOut, code := run(patch, "patch", "sb1", "--expected-revision", "1", "-f", "-"); code != 0 || !strings.Contains(out, "k2") {
		t.Fatalf("patch: %d %q %q", code, out, errOut)
	}
	if _, errOut, code := run(`{"bindings":{"add":[{"name":"x","match":{"hosts":["a.test"]},"auth":{"type":"oauth","credential":"gh"}}]}}`, "patch", "sb1", "-f", "-"); code != 2 || !strings.Contains(errOut, "unsupported auth type") {
		t.Fatalf("bad patch: %d %q", code, errOut)
	}
	if out, _, code := run("", "credential", "list", "sb1"); code != 0 || !strings.Contains(out, "gh") || !strings.Contains(out, "k2") {
		t.Fatalf("credential list: %d %q", code, out)
	}
	if out, _, code := run("", "credential", "get", "sb1", "k2"); code != 0 || !strings.Contains(out, "inline") {
		t.Fatalf("credential get: %d %q", code, out)
	}
	if _, _, code := run("", "credential", "get", "sb1", "nope"); code != 4 {
		t.Fatalf("credential get unknown: %d", code)
	}
	if out, _, code := run("", "binding", "list", "sb1", "-o", "yaml"); code != 0 || !strings.Contains(out, "api.test") {
		t.Fatalf("binding list: %d %q", code, out)
	}
	if out, _, code := run("", "binding", "get", "sb1", "github"); code != 0 || !strings.Contains(out, "api.test") {
		t.Fatalf("binding get: %d %q", code, out)
	}
	if _, _, code := run("", "delete", "sb1"); code != 0 {
		t.Fatalf("delete: %d", code)
	}
	if _, _, code := run("", "get", "sb1"); code != 4 {
		t.Fatalf("get after delete: %d", code)
	}
}

func TestCreateFlagsCredentialProxy(t *testing.T) {
	pf := filepath.Join(t.TempDir(), "np.json")
	os.WriteFile(pf, []byte(`{"defaultAction":"deny","egress":[{"action":"allow","target":"api.test"}]}`), 0o600)
	f := &createFlags{image: "img", count: 1, networkPolicyFile: pf, credentialProxy: true}
	req, err := f.request(nil)
	if err != nil || req.NetworkPolicy == nil || req.NetworkPolicy.DefaultAction != "deny" || len(req.NetworkPolicy.Egress) != 1 ||
		req.CredentialProxy == nil || !req.CredentialProxy.Enabled {
		t.Fatalf("request %+v %v", req, err)
	}
	f = &createFlags{image: "img", count: 1, credentialProxy: true}
	if _, err := f.request(nil); err == nil || !strings.Contains(err.Error(), "needs --network-policy-file") {
		t.Fatalf("credential proxy without policy: %v", err)
	}
	os.WriteFile(pf, []byte(`{"defaultAction":"deny","rules":[]}`), 0o600)
	f = &createFlags{image: "img", count: 1, networkPolicyFile: pf}
	if _, err := f.request(nil); err == nil || !strings.Contains(err.Error(), "unknown field") {
		t.Fatalf("bad policy file: %v", err)
	}
}

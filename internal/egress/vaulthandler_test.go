package egress

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/moat-sandbox/moat/internal/egress/policy"
	"github.com/moat-sandbox/moat/internal/egress/vault"
	"github.com/moat-sandbox/moat/internal/gen/egressapi"
	"github.com/moat-sandbox/moat/internal/gen/wirecheck"
)

// fakeVaults is an in-memory VaultService over the vault package, with
// the host check of a fixed policy.
type fakeVaults struct {
	mu    sync.Mutex
	state *vault.State
	check vault.HostCheck
}

func (f *fakeVaults) CreateVault(_ context.Context, _ string, req vault.CreateRequest) (vault.View, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.state != nil {
		return vault.View{}, vault.ErrExists
	}
	s, err := vault.New(req, f.check)
	if err != nil {
		return vault.View{}, err
	}
	f.state = s
	return s.View(), nil
}

func (f *fakeVaults) GetVault(context.Context, string) (*vault.State, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.state == nil {
		return nil, vault.ErrNotFound
	}
	return f.state, nil
}

func (f *fakeVaults) PatchVault(_ context.Context, _ string, req vault.PatchRequest) (vault.View, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.state == nil {
		return vault.View{}, vault.ErrNotFound
	}
	s, err := f.state.Apply(req, f.check)
	if err != nil {
		return vault.View{}, err
	}
	f.state = s
	return s.View(), nil
}

func (f *fakeVaults) DeleteVault(context.Context, string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.state == nil {
		return vault.ErrNotFound
	}
	f.state = nil
	return nil
}

const vaultSecret = "ghp-VAULT-SECRET-777"

const vaultCreateBody = `{"credentials":[{"name":"gh","source":{"type":"inline","value":"` + vaultSecret + `"}}],
 "bindings":[{"name":"github","match":{"hosts":["api.github.test"]},"auth":{"type":"bearer","credential":"gh"}},
             {"name":"maps","match":{"hosts":["maps.test"]},"auth":{"type":"apiKey","name":"key","in":"query","credential":"gh"}}]}`

type vaultCall struct {
	method, path, body string
	remote, token      string
	status             int
	code               string // expected error code, or "" for success
}

func TestVaultRoutes(t *testing.T) {
	m, err := policy.Compile(policy.NetworkPolicy{DefaultAction: policy.Deny, Egress: []policy.Rule{
		{Action: policy.Allow, Target: "api.github.test"}, {Action: policy.Allow, Target: "maps.test"}, {Action: policy.Allow, Target: "new.test"},
	}})
	if err != nil {
		t.Fatal(err)
	}
	fv := &fakeVaults{check: m.ExplicitlyAllows}
	h := NewHandler(&fakeService{p: policy.AllowAll()}, "sb1", HandlerOptions{Token: "tok", Vault: fv, Authorized: func(r *http.Request) bool { return r.Header.Get("X-Test-Key") == "api-key" }})
	const loop = "127.0.0.1:5555"
	for i, c := range []vaultCall{
		{"GET", "/credential-vault", "", loop, "", 401, "CREDENTIAL_VAULT::UNAUTHORIZED"},
		{"GET", "/credential-vault", "", loop, "wrong", 401, "CREDENTIAL_VAULT::UNAUTHORIZED"},
		{"GET", "/credential-vault", "", loop, "tok", 404, vault.CodeNotFound},
		{"POST", "/credential-vault", vaultCreateBody, "192.0.2.1:1234", "tok", 403, "CREDENTIAL_VAULT::INSECURE_TRANSPORT"},
		{"POST", "/credential-vault", `{"credentials":[],"bindings":[{"name":"b","match":{"hosts":["x.test"]},"auth":{"type":"oauth","credential":"c"}}]}`, loop, "tok", 400, vault.CodeInvalid},
		{"POST", "/credential-vault", `{"credentials":[{"name":"c","source":{"value":"` + vaultSecret + `"}}],"bindings":[{"name":"b","match":{"hosts":["other.test"]},"auth":{"type":"bearer","credential":"c"}}]}`, loop, "tok", 400, vault.CodeInvalid},
		{"POST", "/credential-vault", vaultCreateBody, loop, "tok", 201, ""},
		{"POST", "/credential-vault", vaultCreateBody, "[::1]:80", "api-key", 409, vault.CodeExists},
		{"GET", "/credential-vault", "", "192.0.2.1:1234", "tok", 200, ""}, // reads need no TLS
		{"GET", "/credential-vault/credentials", "", loop, "tok", 200, ""},
		{"GET", "/credential-vault/credentials/gh", "", loop, "tok", 200, ""},
		{"GET", "/credential-vault/credentials/nope", "", loop, "tok", 404, vault.CodeNotFound},
		{"GET", "/credential-vault/bindings", "", loop, "tok", 200, ""},
		{"GET", "/credential-vault/bindings/maps", "", loop, "tok", 200, ""},
		{"GET", "/credential-vault/bindings/nope", "", loop, "tok", 404, vault.CodeNotFound},
		{"PATCH", "/credential-vault", `{"expectedRevision":5,"bindings":{"delete":["maps"]}}`, loop, "tok", 409, vault.CodeConflict},
		{"PATCH", "/credential-vault", `{"expectedRevision":1,"credentials":{"add":[{"name":"big","source":{"value":"` + strings.Repeat("x", vault.MaxValueBytes+1) + `"}}]}}`, loop, "tok", 400, vault.CodeInvalid},
		{"PATCH", "/credential-vault", `{"expectedRevision":1,"bindings":{"add":[{"name":"n","match":{"hosts":["new.test"],"paths":["no-slash"]},"auth":{"type":"bearer","credential":"gh"}}]}}`, loop, "tok", 400, vault.CodeInvalid},
		{"PATCH", "/credential-vault", `{"expectedRevision":1,"bindings":{"delete":["maps"],"add":[{"name":"n","match":{"hosts":["new.test"]},"auth":{"type":"customHeaders","headers":[{"name":"X-Key","credential":"gh"}]}}]}}`, loop, "tok", 200, ""},
		{"PATCH", "/credential-vault", `{"expectedRevision":1}`, loop, "tok", 409, vault.CodeConflict},
		{"PATCH", "/credential-vault", `{"bogus":1}`, loop, "tok", 400, vault.CodeInvalid},
		{"PATCH", "/credential-vault", strings.Repeat(" ", maxBody+1), loop, "tok", 413, "CREDENTIAL_VAULT::REQUEST_TOO_LARGE"},
		{"DELETE", "/credential-vault", "", loop, "tok", 204, ""},
		{"DELETE", "/credential-vault", "", loop, "tok", 404, vault.CodeNotFound},
		{"GET", "/credential-vault/bindings", "", loop, "tok", 404, vault.CodeNotFound},
	} {
		req := httptest.NewRequest(c.method, c.path, strings.NewReader(c.body))
		req.RemoteAddr = c.remote
		switch c.token {
		case "":
		case "api-key":
			req.Header.Set("X-Test-Key", c.token)
		default:
			req.Header.Set(AuthHeader, c.token)
		}
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		body := rec.Body.String()
		if rec.Code != c.status {
			t.Fatalf("%d: %s %s: status %d, want %d: %s", i, c.method, c.path, rec.Code, c.status, body)
		}
		if strings.Contains(body, vaultSecret) || strings.Contains(body, "xxxxxxxx") {
			t.Fatalf("%d: response leaks a credential value: %s", i, body)
		}
		if c.status == 204 {
			continue
		}
		if ct := rec.Header().Get("Content-Type"); ct != "application/json" {
			t.Fatalf("%d: content type %q", i, ct)
		}
		raw := json.RawMessage(body)
		if c.code != "" {
			var e struct{ Code, Message string }
			if err := json.Unmarshal(raw, &e); err != nil || e.Code != c.code || e.Message == "" {
				t.Fatalf("%d: error body %s, want code %s", i, body, c.code)
			}
			wirecheck.Response[egressapi.VaultErrorResponse](t, c.path, raw)
			continue
		}
		switch {
		case c.path == "/credential-vault":
			wirecheck.Response[egressapi.CredentialVaultState](t, c.method+" "+c.path, raw)
		case c.path == "/credential-vault/credentials":
			wirecheck.Response[egressapi.CredentialListResponse](t, c.path, raw)
		case c.path == "/credential-vault/bindings":
			wirecheck.Response[egressapi.CredentialBindingListResponse](t, c.path, raw)
		case strings.HasPrefix(c.path, "/credential-vault/credentials/"):
			wirecheck.Response[egressapi.CredentialMetadata](t, c.path, raw)
		case strings.HasPrefix(c.path, "/credential-vault/bindings/"):
			wirecheck.Response[egressapi.CredentialBindingMetadata](t, c.path, raw)
		}
	}
}

func TestVaultNotEnabled(t *testing.T) {
	h := NewHandler(&fakeService{p: policy.AllowAll()}, "sb1", HandlerOptions{})
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest("GET", "/credential-vault", nil))
	if rec.Code != http.StatusPreconditionFailed || !strings.Contains(rec.Body.String(), vault.CodeNotEnabled) {
		t.Fatalf("%d %s", rec.Code, rec.Body)
	}
}

func TestVaultRequestsMatchSpecModels(t *testing.T) {
	wirecheck.Request[vault.CreateRequest, egressapi.CredentialVaultCreateRequest](t, "CredentialVaultCreateRequest")
	wirecheck.Request[vault.PatchRequest, egressapi.CredentialVaultMutationRequest](t, "CredentialVaultMutationRequest")
}

package tenant

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func writeFile(t *testing.T, body string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "tenants.toml")
	if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestLoadTenantsFile reads OpenSandbox's tenants.toml and refuses the
// files that would be ambiguous, never printing a key.
func TestLoadTenantsFile(t *testing.T) {
	fts, err := LoadTenantsFile(writeFile(t, `
# tenants.toml
[[tenants]]
name = "team-alpha"
namespace = "opensandbox-alpha"
api_keys = [
    "osk-4xz0123456789abc",
    "osk-9yz0123456789abc",     # second key for rotation
]

[[tenants]]
name = "team-beta"
api_keys = ["osk-b3t40123456789ab"]
role = "viewer"
`))
	if err != nil {
		t.Fatal(err)
	}
	if len(fts) != 2 || fts[0].Name != "team-alpha" || fts[0].Namespace != "opensandbox-alpha" || len(fts[0].APIKeys) != 2 ||
		fts[0].Role != RoleOperator || fts[1].Role != RoleViewer || fts[1].Namespace != "" {
		t.Fatalf("tenants %+v", fts)
	}
	for i, tc := range []struct{ body, want string }{
		{`[[tenants]]
name = "a"
api_keys = []`, "at least one key"},
		{`[[tenants]]
name = "A_b"
api_keys = ["0123456789abcdef"]`, "DNS label"},
		{`[[tenants]]
name = "a"
api_keys = ["0123456789abcdef"]
[[tenants]]
name = "b"
api_keys = ["0123456789abcdef"]`, "declare the same API key"},
		{`[[tenants]]
name = "a"
api_keys = ["0123456789abcdef"]
[[tenants]]
name = "a"
api_keys = ["fedcba9876543210"]`, "listed twice"},
		{`[[tenants]]
name = "a"
api_keys = ["short"]`, "shorter than 16"},
		{`[[tenants]]
name = "a"
namespace = "Not_A_Namespace"
api_keys = ["0123456789abcdef"]`, "not a namespace name"},
		{`[[tenants]]
name = "a"
api_keys = ["0123456789abcdef"]
role = "platform"`, "must be admin, operator or viewer"},
		{`[[tenants]]
name = "a"
apikeys = ["0123456789abcdef"]`, "unknown key"},
	} {
		_, err := LoadTenantsFile(writeFile(t, tc.body))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%d: err = %v, want %q", i, err, tc.want)
		}
		if err != nil && strings.Contains(err.Error(), "0123456789abcdef") {
			t.Errorf("%d: the error shows a key: %v", i, err)
		}
	}
}

// TestFileKeysAuthenticate: the keys of a tenants file authenticate as
// their tenant and role, by key id too (console sessions), and their
// tenants exist.
func TestFileKeysAuthenticate(t *testing.T) {
	db := openDB(t, filepath.Join(t.TempDir(), "state.db"))
	defer db.Close()
	fts := []FileTenant{
		{Name: "alpha", Namespace: "ns-a", APIKeys: []string{"osk-alpha-key-1-0123", "osk-alpha-key-2-0123"}, Role: RoleOperator},
		{Name: "beta", APIKeys: []string{"osk-beta-key-0123456"}, Role: RoleViewer},
	}
	r, err := Open(db, Options{RootKey: "root-key", FileTenants: fts})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		key    string
		tenant string
		role   Role
	}{{"osk-alpha-key-1-0123", "alpha", RoleOperator}, {"osk-alpha-key-2-0123", "alpha", RoleOperator}, {"osk-beta-key-0123456", "beta", RoleViewer}} {
		p, err := r.Authenticate(tc.key)
		if err != nil || p.Tenant != tc.tenant || p.Role != tc.role || p.AllTenants || !strings.HasPrefix(p.KeyID, FileKeyIDPrefix) {
			t.Errorf("key of %s: %+v, %v", tc.tenant, p, err)
			continue
		}
		if strings.Contains(p.KeyID, tc.key) {
			t.Errorf("key id %s shows the key", p.KeyID)
		}
		if q, err := r.PrincipalOf(p.KeyID); err != nil || q != p {
			t.Errorf("PrincipalOf(%s) = %+v, %v", p.KeyID, q, err)
		}
	}
	if _, err := r.Authenticate("osk-alpha-key-3-0123"); publicCode(err) != "INVALID_API_KEY" {
		t.Errorf("an unknown key: %v", err)
	}
	for _, name := range []string{"alpha", "beta"} {
		if _, err := r.Tenant(name); err != nil {
			t.Errorf("tenant %s of the file: %v", name, err)
		}
	}
	// A tenant that exists keeps its quota when the file is read again.
	if _, _, err := r.PutTenant(t.Context(), "alpha", Quota{Sandboxes: 3}); err != nil {
		t.Fatal(err)
	}
	r2, err := Open(db, Options{RootKey: "root-key", FileTenants: fts})
	if err != nil {
		t.Fatal(err)
	}
	if q := r2.Quota("alpha"); q.Sandboxes != 3 {
		t.Errorf("alpha's quota after a restart = %+v, want 3 sandboxes", q)
	}
}

// TestSetFileTenants: a reread file's keys replace the old ones at once.
func TestSetFileTenants(t *testing.T) {
	r, err := Open(nil, Options{FileTenants: []FileTenant{{Name: "a", APIKeys: []string{"osk-old-key-0123456789"}, Role: RoleOperator}}})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.SetFileTenants([]FileTenant{{Name: "b", APIKeys: []string{"osk-new-key-0123456789"}, Role: RoleAdmin}}); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Authenticate("osk-old-key-0123456789"); publicCode(err) != "INVALID_API_KEY" {
		t.Errorf("a removed key: %v", err)
	}
	if p, err := r.Authenticate("osk-new-key-0123456789"); err != nil || p.Tenant != "b" || p.Role != RoleAdmin {
		t.Errorf("a new key: %+v, %v", p, err)
	}
	if _, err := r.Tenant("b"); err != nil {
		t.Errorf("tenant b: %v", err)
	}
}

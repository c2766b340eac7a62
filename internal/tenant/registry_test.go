package tenant

import (
	"bytes"
	"context"
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/moat-sandbox/moat/internal/egress/policy"
	"github.com/moat-sandbox/moat/internal/errdefs"
	"github.com/moat-sandbox/moat/internal/store"
)

func openDB(t *testing.T, path string) *store.DB {
	t.Helper()
	db, err := store.Open(context.Background(), path, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	return db
}

func publicCode(err error) string {
	if p, ok := errdefs.PublicOf(err); ok {
		return p.Code
	}
	return ""
}

func TestRootKeyIsPlatformInDefault(t *testing.T) {
	r, err := Open(nil, Options{RootKey: "legacy-key"})
	if err != nil {
		t.Fatal(err)
	}
	p, err := r.Authenticate("legacy-key")
	if err != nil {
		t.Fatal(err)
	}
	if p != (Principal{KeyID: RootKeyID, Tenant: Default, Role: RolePlatform, AllTenants: true}) || !p.CanGrantPlatform() {
		t.Errorf("root principal = %+v", p)
	}
	for _, bad := range []string{"", "legacy-ke", "legacy-key ", "LEGACY-KEY"} {
		if _, err := r.Authenticate(bad); !errors.Is(err, errdefs.ErrUnauthenticated) || publicCode(err) != "INVALID_API_KEY" {
			t.Errorf("Authenticate(%q) = %v, want INVALID_API_KEY", bad, err)
		}
	}
	if _, err := r.RevokeKey(context.Background(), RootKeyID); !errdefs.IsFailedPrecondition(err) {
		t.Errorf("revoke root key: %v, want failed precondition", err)
	}
	if p, err := r.PrincipalOf(RootKeyID); err != nil || p.Role != RolePlatform {
		t.Errorf("PrincipalOf(root) = %+v, %v", p, err)
	}
	// Without a root key, "root" is just an unknown id.
	r2, _ := Open(nil, Options{})
	if _, err := r2.PrincipalOf(RootKeyID); !errors.Is(err, errdefs.ErrUnauthenticated) {
		t.Errorf("PrincipalOf(root) without a root key: %v", err)
	}
	if _, err := r2.Authenticate(""); err == nil {
		t.Error("empty key authenticated against a registry without a root key")
	}
}

func TestKeyLifecycleAndPersistence(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "state.db")
	secret := bytes.Repeat([]byte{7}, SecretLen)
	now := time.Date(2026, 12, 3, 10, 0, 0, 0, time.UTC)
	clock := func() time.Time { return now }
	db := openDB(t, path)
	r, err := Open(db, Options{Secret: secret, Now: clock})
	if err != nil {
		t.Fatal(err)
	}
	k, token, err := r.CreateKey(ctx, NewKey{Tenant: "acme", Role: RoleOperator, Name: "ci", CreatedBy: RootKeyID})
	if err != nil {
		t.Fatal(err)
	}
	if !LooksLikeKey(token) || !strings.HasPrefix(token, "moat_"+k.ID+"_") {
		t.Fatalf("token %q does not have the key format with id %s", token, k.ID)
	}
	if strings.Contains(k.Digest, token[len(token)-64:]) || k.Digest == "" {
		t.Fatalf("digest %q holds the secret or is empty", k.Digest)
	}
	p, err := r.Authenticate(token)
	if err != nil {
		t.Fatal(err)
	}
	if p != (Principal{KeyID: k.ID, Tenant: "acme", Role: RoleOperator}) {
		t.Errorf("principal = %+v", p)
	}
	if _, err := r.Tenant("acme"); err != nil {
		t.Errorf("the key's tenant was not created: %v", err)
	}
	// One changed secret character, a known id with a foreign secret,
	// an unknown id: all plain INVALID_API_KEY.
	flip := []byte(token)
	if flip[len(flip)-1] == 'a' {
		flip[len(flip)-1] = 'b'
	} else {
		flip[len(flip)-1] = 'a'
	}
	_, other, _ := r.CreateKey(ctx, NewKey{Tenant: "acme", Role: RoleViewer})
	forged := token[:len("moat_")+16] + other[len("moat_")+16:]
	for i, bad := range []string{string(flip), forged, "moat_0123456789abcdef_" + strings.Repeat("0", 64), token + "0", strings.ToUpper(token)} {
		if _, err := r.Authenticate(bad); publicCode(err) != "INVALID_API_KEY" {
			t.Errorf("%d: Authenticate(%q) = %v, want INVALID_API_KEY", i, bad, err)
		}
	}

	// The registry survives a restart with the same secret, and only then.
	db.Close()
	db = openDB(t, path)
	r, err = Open(db, Options{Secret: secret, Now: clock})
	if err != nil {
		t.Fatal(err)
	}
	if got, err := r.Authenticate(token); err != nil || got != p {
		t.Fatalf("after reopen: %+v, %v", got, err)
	}
	wrong, _ := Open(db, Options{Secret: bytes.Repeat([]byte{8}, SecretLen)})
	if _, err := wrong.Authenticate(token); err == nil {
		t.Error("a key authenticated under another server secret")
	}

	// Revocation is immediate, persistent, and idempotent; the holder
	// learns why, and sessions (PrincipalOf) end too.
	if _, err := r.RevokeKey(ctx, k.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Authenticate(token); !errors.Is(err, errdefs.ErrUnauthenticated) || !strings.Contains(err.Error(), "revoked") {
		t.Errorf("revoked key: %v", err)
	}
	if _, err := r.PrincipalOf(k.ID); !errors.Is(err, errdefs.ErrUnauthenticated) {
		t.Errorf("PrincipalOf(revoked) = %v", err)
	}
	if again, err := r.RevokeKey(ctx, k.ID); err != nil || again.RevokedAt == nil {
		t.Errorf("second revoke: %+v, %v", again, err)
	}
	db.Close()
	db = openDB(t, path)
	defer db.Close()
	r, _ = Open(db, Options{Secret: secret, Now: clock})
	if _, err := r.Authenticate(token); err == nil {
		t.Error("a revoked key authenticates after a restart")
	}
	if _, err := r.RevokeKey(ctx, "0000000000000000"); !errdefs.IsNotFound(err) {
		t.Errorf("revoke unknown: %v", err)
	}
	ks := r.Keys("acme")
	revoked := 0
	for _, x := range ks {
		if x.RevokedAt != nil {
			revoked++
			if x.ID != k.ID {
				t.Errorf("key %s revoked, want only %s", x.ID, k.ID)
			}
		}
	}
	if len(ks) != 2 || revoked != 1 || len(r.Keys("other")) != 0 || len(r.Keys("")) != 2 {
		t.Errorf("Keys(acme) = %+v", ks)
	}
}

func TestKeyExpiry(t *testing.T) {
	now := time.Date(2026, 12, 3, 10, 0, 0, 0, time.UTC)
	r, _ := Open(nil, Options{Now: func() time.Time { return now }})
	at := now.Add(time.Hour)
	_, token, err := r.CreateKey(context.Background(), NewKey{Tenant: Default, Role: RoleViewer, ExpiresAt: &at})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.Authenticate(token); err != nil {
		t.Fatal(err)
	}
	now = at
	if _, err := r.Authenticate(token); err == nil || !strings.Contains(err.Error(), "expired") {
		t.Errorf("expired key: %v", err)
	}
	past := now.Add(-time.Second)
	if _, _, err := r.CreateKey(context.Background(), NewKey{Tenant: Default, Role: RoleViewer, ExpiresAt: &past}); !errdefs.IsInvalidArgument(err) {
		t.Errorf("key expiring in the past: %v", err)
	}
}

func TestCreateKeyValidation(t *testing.T) {
	r, _ := Open(nil, Options{})
	for i, req := range []NewKey{
		{Tenant: "", Role: RoleViewer},
		{Tenant: "Acme", Role: RoleViewer},
		{Tenant: "a/b", Role: RoleViewer},
		{Tenant: "acme", Role: "root"},
		{Tenant: "acme", Role: ""},
		{Tenant: "acme", Role: RoleViewer, Name: strings.Repeat("x", 129)},
		{Tenant: "acme", Role: RoleViewer, Name: "bell\a"},
	} {
		if _, _, err := r.CreateKey(context.Background(), req); !errdefs.IsInvalidArgument(err) {
			t.Errorf("%d: CreateKey(%+v) = %v, want invalid argument", i, req, err)
		}
	}
	if len(r.Keys("")) != 0 || len(r.Tenants()) != 1 {
		t.Errorf("refused requests left state: keys %v tenants %v", r.Keys(""), r.Tenants())
	}
}

func TestTenants(t *testing.T) {
	ctx := context.Background()
	r, _ := Open(nil, Options{RootKey: "k"})
	if ts := r.Tenants(); len(ts) != 1 || ts[0].Name != Default {
		t.Errorf("fresh registry tenants = %+v", ts)
	}
	q := Quota{Sandboxes: 3, CPUMillis: 2000, MemoryBytes: 1 << 30}
	if _, created, err := r.PutTenant(ctx, "acme", q); err != nil || !created {
		t.Fatalf("PutTenant: %v %v", created, err)
	}
	if got := r.Quota("acme"); got != q {
		t.Errorf("Quota = %+v", got)
	}
	if _, created, err := r.PutTenant(ctx, "acme", Quota{}); err != nil || created {
		t.Fatalf("update: %v %v", created, err)
	}
	if !r.Quota("acme").Zero() {
		t.Error("quota not cleared")
	}
	if _, _, err := r.PutTenant(ctx, "acme", Quota{Sandboxes: -1}); !errdefs.IsInvalidArgument(err) {
		t.Errorf("negative quota: %v", err)
	}
	k, _, _ := r.CreateKey(ctx, NewKey{Tenant: "acme", Role: RoleViewer})
	if err := r.DeleteTenant(ctx, "acme", nil); !errors.Is(err, ErrTenantInUse) {
		t.Errorf("delete with an active key: %v", err)
	}
	r.RevokeKey(ctx, k.ID)
	if err := r.DeleteTenant(ctx, "acme", func(string) string { return "2 sandboxes" }); !errors.Is(err, ErrTenantInUse) || !strings.Contains(err.Error(), "acme") {
		t.Errorf("delete with resources: %v", err)
	}
	if err := r.DeleteTenant(ctx, "acme", func(string) string { return "" }); err != nil {
		t.Errorf("delete: %v", err)
	}
	if _, err := r.Tenant("acme"); !errdefs.IsNotFound(err) {
		t.Errorf("deleted tenant: %v", err)
	}
	if err := r.DeleteTenant(ctx, Default, nil); !errdefs.IsFailedPrecondition(err) {
		t.Errorf("delete default: %v", err)
	}
	if err := r.DeleteTenant(ctx, "nope", nil); !errdefs.IsNotFound(err) {
		t.Errorf("delete unknown: %v", err)
	}
}

func TestQuotaAdmit(t *testing.T) {
	q := Quota{Sandboxes: 2, CPUMillis: 2000, MemoryBytes: 2 << 30}
	used := Usage{Sandboxes: 1, CPUMillis: 1000, MemoryBytes: 1 << 30}
	for i, tc := range []struct {
		q       Quota
		n       int
		cpu     int64
		mem     int64
		wantErr string // "" = admitted; else the public code
	}{
		{q, 1, 1000, 1 << 30, ""},
		{q, 2, 500, 512 << 20, CodeQuotaExceeded},        // count
		{q, 1, 1001, 1 << 30, CodeQuotaExceeded},         // cpu
		{q, 1, 1000, 1<<30 + 1, CodeQuotaExceeded},       // memory
		{q, 1, 0, 1 << 30, "SANDBOX::INVALID_PARAMETER"}, // no cpu limit under a cpu quota
		{q, 1, 1000, 0, "SANDBOX::INVALID_PARAMETER"},    // no memory limit under a memory quota
		{Quota{Sandboxes: 2}, 1, 0, 0, ""},
		{Quota{}, 1000, 0, 0, ""},
	} {
		err := tc.q.Admit("acme", used, tc.n, tc.cpu, tc.mem)
		if got := publicCode(err); got != tc.wantErr {
			t.Errorf("%d: Admit = %v (code %q), want %q", i, err, got, tc.wantErr)
		}
		if tc.wantErr == CodeQuotaExceeded && !errors.Is(err, errdefs.ErrPermissionDenied) {
			t.Errorf("%d: quota error class: %v", i, err)
		}
	}
}

func TestRolesAndScope(t *testing.T) {
	for _, tc := range []struct {
		r    Role
		a    Access
		want bool
	}{
		{RoleViewer, AccessRead, true}, {RoleViewer, AccessWrite, false}, {RoleViewer, AccessAdmin, false},
		{RoleOperator, AccessWrite, true}, {RoleOperator, AccessAdmin, false},
		{RoleAdmin, AccessAdmin, true}, {RoleAdmin, AccessPlatform, false}, {RoleAdmin, AccessWrite, true},
		{RolePlatform, AccessPlatform, true}, {RolePlatform, AccessAdmin, true}, {RoleOperator, AccessPlatform, false},
		{Role("x"), AccessRead, false}, {Role("x"), AccessPlatform, false},
	} {
		if got := tc.r.Allows(tc.a); got != tc.want {
			t.Errorf("%s.Allows(%s) = %v", tc.r, tc.a, got)
		}
	}
	ctx := context.Background()
	if s := ScopeOf(ctx); !s.All || !s.Sees("anyone") {
		t.Errorf("server scope = %+v", s)
	}
	ctx = WithPrincipal(ctx, Principal{KeyID: "x", Tenant: "acme", Role: RoleOperator})
	s := ScopeOf(ctx)
	if s.All || !s.Sees("acme") || s.Sees("other") || s.Sees("") {
		t.Errorf("acme scope = %+v", s)
	}
	if d := (Scope{Tenant: Default}); !d.Sees("") || !d.Sees(Default) || d.Sees("acme") {
		t.Error("default scope does not own pre-tenant records")
	}
}

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// BenchmarkAuthenticate measures the per-request cost of resolving a key:
// a registry key (HMAC-SHA256, map lookup, constant-time compare), the
// server's own key, and an unknown key.
func BenchmarkAuthenticate(b *testing.B) {
	r, _ := Open(nil, Options{RootKey: "legacy-key-0123456789abcdef0123456789abcdef"})
	_, token, err := r.CreateKey(context.Background(), NewKey{Tenant: "acme", Role: RoleOperator})
	if err != nil {
		b.Fatal(err)
	}
	for i := 0; i < 1000; i++ { // a registry of 1000 keys
		r.CreateKey(context.Background(), NewKey{Tenant: "t", Role: RoleViewer})
	}
	for _, bc := range []struct{ name, key string }{
		{"registry-key", token},
		{"root-key", "legacy-key-0123456789abcdef0123456789abcdef"},
		{"unknown-key", "moat_0123456789abcdef_" + strings.Repeat("0", 64)},
	} {
		b.Run(bc.name, func(b *testing.B) {
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					r.Authenticate(bc.key)
				}
			})
		})
	}
}

func TestE2BKeyForm(t *testing.T) {
	r, err := Open(nil, Options{RootKey: "0123abcd", Secret: bytes.Repeat([]byte{1}, SecretLen)})
	if err != nil {
		t.Fatal(err)
	}
	k, key, err := r.CreateKey(context.Background(), NewKey{Tenant: "acme", Role: RoleViewer})
	if err != nil {
		t.Fatal(err)
	}
	e := E2BKey(key)
	if !strings.HasPrefix(e, "e2b_") || len(e) != 4+80 || strings.Trim(e[4:], "0123456789abcdef") != "" || E2BKey(e) != e {
		t.Fatalf("E2BKey(%q) = %q", key, e)
	}
	for _, form := range []string{key, e} {
		p, err := r.Authenticate(form)
		if err != nil || p.KeyID != k.ID || p.Tenant != "acme" {
			t.Fatalf("Authenticate(%q) = %+v, %v", form, p, err)
		}
		if !LooksLikeKey(form) {
			t.Fatalf("LooksLikeKey(%q) = false", form)
		}
	}
	if p, err := r.Authenticate("e2b_0123abcd"); err != nil || p.KeyID != RootKeyID {
		t.Fatalf("root key's e2b_ form: %+v, %v", p, err)
	}
	// A changed character, or the wrong length, is no key.
	bad := e[:len(e)-1] + map[bool]string{true: "0", false: "1"}[e[len(e)-1] != '0']
	for _, f := range []string{bad, e[:len(e)-2], "e2b_", "e2b_0123abcdX"} {
		if _, err := r.Authenticate(f); !errors.Is(err, errdefs.ErrUnauthenticated) {
			t.Fatalf("Authenticate(%q) = %v", f, err)
		}
	}
}

// TestAdminsFenced: an admin key sees its own tenant only; a platform key
// sees every tenant; only the server's own key may grant platform.
func TestAdminsFenced(t *testing.T) {
	r, _ := Open(nil, Options{RootKey: "root-key"})
	ctx := context.Background()
	_, admin, _ := r.CreateKey(ctx, NewKey{Tenant: "acme", Role: RoleAdmin})
	_, plat, _ := r.CreateKey(ctx, NewKey{Tenant: Default, Role: RolePlatform})
	p, err := r.Authenticate(admin)
	if err != nil || p.AllTenants || p.Tenant != "acme" || ScopeOf(WithPrincipal(ctx, p)).Sees(Default) {
		t.Errorf("acme admin: %+v %v", p, err)
	}
	if p.CanGrantPlatform() {
		t.Error("an admin may grant platform")
	}
	p, err = r.Authenticate(plat)
	if err != nil || !p.AllTenants || !ScopeOf(WithPrincipal(ctx, p)).Sees("acme") || p.CanGrantPlatform() {
		t.Errorf("platform key: %+v %v (only the server's own key grants platform)", p, err)
	}
	for _, tc := range []struct {
		r, o Role
		want bool
	}{{RolePlatform, RoleAdmin, true}, {RoleAdmin, RolePlatform, false}, {RoleAdmin, RoleAdmin, true}, {RoleOperator, RoleAdmin, false}, {RoleAdmin, Role("root"), false}} {
		if got := tc.r.Covers(tc.o); got != tc.want {
			t.Errorf("%s.Covers(%s) = %v", tc.r, tc.o, got)
		}
	}
	if _, err := ParseRole("superuser"); publicCode(err) != CodeInvalidRole || !strings.Contains(err.Error(), "platform, admin, operator or viewer") {
		t.Errorf("unknown role: %v", err)
	}
}

// TestMigrationPromotesDefaultAdmins: a registry written before admins were
// fenced (no schema record) is migrated once: default's admin keys become
// platform keys, other tenants' admins stay admins (now fenced), and an
// admin of default created after the migration stays an admin.
func TestMigrationPromotesDefaultAdmins(t *testing.T) {
	path := filepath.Join(t.TempDir(), "s.db")
	db := openDB(t, path)
	old := map[string]Key{
		"0000000000000001": {ID: "0000000000000001", Tenant: "", Role: RoleAdmin},
		"0000000000000002": {ID: "0000000000000002", Tenant: Default, Role: RoleAdmin},
		"0000000000000003": {ID: "0000000000000003", Tenant: "acme", Role: RoleAdmin},
		"0000000000000004": {ID: "0000000000000004", Tenant: Default, Role: RoleOperator},
	}
	for id, k := range old {
		if err := db.Put(KeyBucket, id, k); err != nil {
			t.Fatal(err)
		}
	}
	r, err := Open(db, Options{Secret: make([]byte, SecretLen)})
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]Role{"0000000000000001": RolePlatform, "0000000000000002": RolePlatform, "0000000000000003": RoleAdmin, "0000000000000004": RoleOperator}
	for id, role := range want {
		if k, err := r.Key(id); err != nil || k.Role != role {
			t.Errorf("key %s: %+v %v, want role %s", id, k, err, role)
		}
	}
	var sc schema
	if err := db.Get(MetaBucket, SchemaKey, &sc); err != nil || sc.Version != SchemaVersion || len(sc.Promoted) != 2 {
		t.Errorf("schema record: %+v %v", sc, err)
	}
	// A new admin of default stays an admin across reopening.
	k, _, err := r.CreateKey(context.Background(), NewKey{Tenant: Default, Role: RoleAdmin})
	if err != nil {
		t.Fatal(err)
	}
	r2, err := Open(db, Options{Secret: make([]byte, SecretLen)})
	if err != nil {
		t.Fatal(err)
	}
	if got, _ := r2.Key(k.ID); got.Role != RoleAdmin {
		t.Errorf("a post-migration admin of default became %s", got.Role)
	}
}

func TestTenantEgress(t *testing.T) {
	r, _ := Open(nil, Options{})
	ctx := context.Background()
	if _, err := r.SetEgress(ctx, "nope", &policy.NetworkPolicy{}); publicCode(err) != "TENANT::NOT_FOUND" {
		t.Errorf("unknown tenant: %v", err)
	}
	if _, err := r.SetEgress(ctx, Default, &policy.NetworkPolicy{DefaultAction: "maybe"}); !errdefs.IsInvalidArgument(err) {
		t.Errorf("bad policy: %v", err)
	}
	p := policy.NetworkPolicy{DefaultAction: "DENY", Egress: []policy.Rule{{Action: "allow", Target: "Example.TEST."}}}
	if _, err := r.SetEgress(ctx, Default, &p); err != nil {
		t.Fatal(err)
	}
	g := r.EgressGuardrail("")
	if g == nil || g.DefaultAction != policy.Deny || g.Egress[0].Target != "example.test" {
		t.Errorf("guardrail = %+v, want it normalized", g)
	}
	if _, _, err := r.PutTenant(ctx, Default, Quota{Sandboxes: 3}); err != nil || r.EgressGuardrail(Default) == nil {
		t.Errorf("setting a quota dropped the guardrail: %v", err)
	}
	if _, err := r.SetEgress(ctx, Default, nil); err != nil || r.EgressGuardrail(Default) != nil {
		t.Errorf("remove: %v", err)
	}
}

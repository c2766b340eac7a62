package cli

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/moat-sandbox/moat/internal/httpapi"
	"github.com/moat-sandbox/moat/internal/image"
	"github.com/moat-sandbox/moat/internal/lifecycle"
	"github.com/moat-sandbox/moat/internal/runtime/fake"
	"github.com/moat-sandbox/moat/internal/sandbox"
	"github.com/moat-sandbox/moat/internal/store"
	"github.com/moat-sandbox/moat/internal/tenant"
)

type localImages struct{}

func (localImages) Ensure(ctx context.Context, ref string, auth *image.Auth) (image.Image, error) {
	return image.Image{Name: ref}, nil
}

// localCommitter stands in for the image store's snapshot commits.
type localCommitter struct{}

func (localCommitter) Commit(ctx context.Context, upperDir, baseRef, name string) (image.Image, error) {
	return image.Image{Name: name}, nil
}
func (localCommitter) Remove(ctx context.Context, ref string) error { return nil }

// realAPI serves the real lifecycle API (fake runtime) with a key registry
// whose server key is "root-key".
func realAPI(t *testing.T) string {
	t.Helper()
	db, err := store.Open(context.Background(), filepath.Join(t.TempDir(), "s.db"), time.Second)
	if err != nil {
		t.Fatal(err)
	}
	reg, err := tenant.Open(db, tenant.Options{RootKey: "root-key"})
	if err != nil {
		t.Fatal(err)
	}
	rt := fake.New(fake.Hooks{})
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	svc, err := sandbox.New(sandbox.Config{Config: lifecycle.Config{}}, sandbox.Deps{Deps: lifecycle.Deps{Store: db, Runtime: rt, Images: localImages{}, Log: log, Quotas: reg}, Committer: localCommitter{}})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(httpapi.New(httpapi.Config{Auth: reg}, svc, log).Handler())
	t.Cleanup(func() { srv.Close(); svc.Close(); rt.Close(); db.Close() })
	return srv.URL
}

func TestKeyAndTenantVerbs(t *testing.T) {
	url := realAPI(t)
	as := func(key string, args ...string) (string, string, int) {
		return runMoat(t, nil, append(args, "--server", url, "--api-key", key)...)
	}
	out, errOut, code := as("root-key", "key", "create", "--tenant", "acme", "--role", "operator", "--name", "ci runner", "--expires", "30d")
	key := strings.TrimSpace(out)
	if code != 0 || !strings.HasPrefix(key, "moat_") || !strings.Contains(errOut, "cannot be shown again") {
		t.Fatalf("create: %d %q %q", code, out, errOut)
	}
	out, _, code = as(key, "key", "whoami", "-o", "json")
	var p map[string]any
	if code != 0 || json.Unmarshal([]byte(out), &p) != nil || p["tenant"] != "acme" || p["role"] != "operator" {
		t.Fatalf("whoami: %d %q", code, out)
	}
	id := p["keyId"].(string)
	// --format e2b prints the key in E2B's e2b_<hex> form, which works
	// like any key; a bad --format is a usage error.
	out, _, code = as("root-key", "key", "create", "--tenant", "acme", "--role", "viewer", "--format", "e2b")
	e2bKey := strings.TrimSpace(out)
	if code != 0 || !strings.HasPrefix(e2bKey, "e2b_") || strings.Trim(e2bKey[4:], "0123456789abcdef") != "" {
		t.Fatalf("create --format e2b: %d %q", code, out)
	}
	var ep map[string]any
	if out, _, code = as(e2bKey, "key", "whoami", "-o", "json"); code != 0 || json.Unmarshal([]byte(out), &ep) != nil || ep["role"] != "viewer" {
		t.Fatalf("whoami with the e2b_ form: %d %q", code, out)
	}
	if _, _, code = as("root-key", "key", "revoke", ep["keyId"].(string)); code != 0 {
		t.Fatalf("revoke the e2b_ key: %d", code)
	}
	if _, _, code = as("root-key", "key", "create", "--tenant", "acme", "--role", "viewer", "--format", "pem"); code != 2 {
		t.Fatalf("--format pem: exit %d, want 2", code)
	}
	out, _, code = as("root-key", "key", "ls")
	if code != 0 || !strings.Contains(out, id) || !strings.Contains(out, "ci runner") || !strings.Contains(out, "root") || strings.Contains(out, key) {
		t.Errorf("ls: %d %q", code, out)
	}
	if out, _, code = as("root-key", "tenant", "set", "acme", "--sandboxes", "3", "--cpu", "4", "--memory", "8Gi"); code != 0 || !strings.Contains(out, "0/3") || !strings.Contains(out, "0/4") || !strings.Contains(out, "0/8Gi") {
		t.Errorf("tenant set: %d %q", code, out)
	}
	if out, _, code = as(key, "tenant", "get", "acme"); code != 0 || !strings.Contains(out, "acme") {
		t.Errorf("tenant get (own): %d %q", code, out)
	}
	if _, errOut, code = as(key, "tenant", "ls"); code != 1 || !strings.Contains(errOut, "PERMISSION_DENIED") {
		t.Errorf("tenant ls as operator: %d %q", code, errOut)
	}
	if _, errOut, code = as(key, "tenant", "get", "default"); code != 4 || !strings.Contains(errOut, "TENANT::NOT_FOUND") {
		t.Errorf("tenant get (other): %d %q", code, errOut)
	}
	if out, _, code = as("root-key", "key", "revoke", id); code != 0 || strings.TrimSpace(out) != id {
		t.Errorf("revoke: %d %q", code, out)
	}
	if _, errOut, code = as(key, "key", "whoami"); code != 1 || !strings.Contains(errOut, "INVALID_API_KEY") || !strings.Contains(errOut, "revoked") {
		t.Errorf("whoami with a revoked key: %d %q", code, errOut)
	}
	if out, _, code = as("root-key", "key", "get", id); code != 0 || !strings.Contains(out, "revoked") {
		t.Errorf("get revoked: %d %q", code, out)
	}
	for _, args := range [][]string{
		{"key", "create", "--tenant", "acme"},
		{"key", "create", "--tenant", "acme", "--role", "viewer", "--expires", "soon"},
		{"key", "create", "--tenant", "acme", "--role", "god"},
		{"tenant", "set", "acme", "--cpu", "lots"},
	} {
		if _, errOut, code := as("root-key", args...); code != 2 {
			t.Errorf("%v: exit %d, want 2 (%q)", args, code, errOut)
		}
	}
	// An admin acts in one tenant with --as-tenant.
	if out, _, code := as("root-key", "key", "whoami", "--as-tenant", "acme"); code != 0 || !strings.Contains(out, "acme") || strings.Contains(out, "all tenants") {
		t.Errorf("whoami --as-tenant: %d %q", code, out)
	}
	if _, errOut, code := as("root-key", "sb", "ls", "--as-tenant", "nope"); code != 4 || !strings.Contains(errOut, "TENANT::NOT_FOUND") {
		t.Errorf("--as-tenant of an unknown tenant: %d %q", code, errOut)
	}
	if _, _, code := as("root-key", "tenant", "rm", "acme"); code != 0 {
		t.Errorf("tenant rm: %d", code)
	}
}

func TestParseExpiry(t *testing.T) {
	now := time.Date(2026, 12, 3, 10, 0, 0, 0, time.UTC)
	for in, want := range map[string]string{
		"30d": "2027-01-02T10:00:00Z", "90m": "2026-12-03T11:30:00Z", "2027-01-01T00:00:00Z": "2027-01-01T00:00:00Z",
	} {
		got, err := parseExpiry(in, now)
		if err != nil || got.Format(time.RFC3339) != want {
			t.Errorf("parseExpiry(%q) = %v, %v; want %s", in, got, err, want)
		}
	}
	for _, bad := range []string{"0d", "-1d", "xd", "-5m", "tomorrow"} {
		if _, err := parseExpiry(bad, now); err == nil {
			t.Errorf("parseExpiry(%q) accepted", bad)
		}
	}
	if got, err := parseExpiry("", now); got != nil || err != nil {
		t.Errorf("empty: %v %v", got, err)
	}
}

// TestTenantEgressVerbs: moat tenant egress get/set/rm against a server
// that enforces no egress (the fake runtime): get says there is none, set
// is refused with the server's clear error, flags are checked first.
func TestTenantEgressVerbs(t *testing.T) {
	url := realAPI(t)
	as := func(key string, args ...string) (string, string, int) {
		return runMoat(t, nil, append(args, "--server", url, "--api-key", key)...)
	}
	if out, _, code := as("root-key", "tenant", "egress", "get", "default"); code != 0 || !strings.Contains(out, "none") {
		t.Errorf("get: %d %q", code, out)
	}
	if _, errOut, code := as("root-key", "tenant", "egress", "set", "default", "--file", "x.json", "--allow", "a.test"); code != 2 || !strings.Contains(errOut, "--file excludes") {
		t.Errorf("conflicting flags: %d %q", code, errOut)
	}
	if _, errOut, code := as("root-key", "tenant", "egress", "set", "default", "--default", "deny", "--allow", "a.test"); code != 1 || !strings.Contains(errOut, "enforces no egress") {
		t.Errorf("set without enforcement: %d %q", code, errOut)
	}
	if out, _, code := as("root-key", "tenant", "egress", "rm", "default"); code != 0 || !strings.Contains(out, "none") {
		t.Errorf("rm: %d %q", code, out)
	}
	if out, _, code := as("root-key", "key", "whoami"); code != 0 || !strings.Contains(out, "platform") || !strings.Contains(out, "all tenants") {
		t.Errorf("whoami: %d %q", code, out)
	}
}

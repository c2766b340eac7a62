package sidecar_test

import (
	"bytes"
	"context"
	"crypto/x509"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/moat-sandbox/moat/internal/egress"
	"github.com/moat-sandbox/moat/internal/egress/mitm"
	"github.com/moat-sandbox/moat/internal/egress/sidecar"
	"github.com/moat-sandbox/moat/internal/egress/vault"
)

const vaultSecret = "tok-SIDECAR-SECRET-7"

func sealer(t *testing.T, b byte) *vault.Sealer {
	t.Helper()
	s, err := vault.NewSealer(bytes.Repeat([]byte{b}, vault.KeySize))
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// vaultBody is what the server pushes: the CA and a vault sealed under sl.
func vaultBody(t *testing.T, sl *vault.Sealer, match string) ([]byte, *mitm.CA) {
	t.Helper()
	req, err := vault.DecodeCreate([]byte(`{"credentials":[{"name":"t","source":{"value":"` + vaultSecret + `"}}],
	 "bindings":[{"name":"api","match":` + match + `,"auth":{"type":"bearer","credential":"t"}}]}`))
	if err != nil {
		t.Fatal(err)
	}
	st, err := vault.New(req, nil)
	if err != nil {
		t.Fatal(err)
	}
	ca, err := mitm.NewCA("sb-1")
	if err != nil {
		t.Fatal(err)
	}
	key, err := ca.KeyDER()
	if err != nil {
		t.Fatal(err)
	}
	blob, err := vault.SealState(sl, sidecar.VaultAD, st, key)
	if err != nil {
		t.Fatal(err)
	}
	b, err := json.Marshal(sidecar.VaultRequest{CACert: ca.CertPEM(), Sealed: blob})
	if err != nil {
		t.Fatal(err)
	}
	return b, ca
}

// TestVaultHandler: the sidecar puts in force what the server sealed for
// it, only with the token and its own key, and never answers a value.
func TestVaultHandler(t *testing.T) {
	var logs bytes.Buffer
	log := slog.New(slog.NewTextHandler(&logs, nil))
	var got *vault.Rules
	var gotCA *mitm.CA
	var gotRoots *x509.CertPool
	attachErr := error(nil)
	state := filepath.Join(t.TempDir(), "vault.json")
	h := sidecar.VaultHandler(token, sealer(t, 1), func(_ context.Context, ca *mitm.CA, r *vault.Rules, roots *x509.CertPool) error {
		if attachErr != nil {
			return attachErr
		}
		gotCA, got, gotRoots = ca, r, roots
		return nil
	}, log, state)
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	body, ca := vaultBody(t, sealer(t, 1), `{"hosts":["api.test"]}`)
	foreign, _ := vaultBody(t, sealer(t, 2), `{"hosts":["api.test"]}`)

	put := func(tok string, b []byte) (int, string) {
		t.Helper()
		req, _ := http.NewRequest(http.MethodPut, srv.URL+sidecar.VaultPath, bytes.NewReader(b))
		if tok != "" {
			req.Header.Set(egress.AuthHeader, tok)
		}
		resp, err := srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		out, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(out)
	}
	for i, c := range []struct {
		tok  string
		body []byte
		want int
	}{
		{"", body, http.StatusUnauthorized},
		{"wrong", body, http.StatusUnauthorized},
		{token, foreign, http.StatusBadRequest}, // sealed under another key
		{token, []byte("{"), http.StatusBadRequest},
	} {
		if code, out := put(c.tok, c.body); code != c.want || strings.Contains(out, vaultSecret) {
			t.Errorf("%d: got %d %q, want %d without the value", i, code, out, c.want)
		}
	}
	if got != nil {
		t.Fatal("rules applied from a refused request")
	}
	if code, out := put(token, body); code != http.StatusNoContent {
		t.Fatalf("put: %d %q", code, out)
	}
	if got == nil || !got.Intercepts("https", "api.test", 443) || got.Intercepts("https", "other.test", 443) {
		t.Fatalf("rules in force: %+v", got)
	}
	if kept, err := os.ReadFile(state); err != nil || !bytes.Equal(kept, body) || bytes.Contains(kept, []byte(vaultSecret)) {
		t.Fatalf("kept state: %v, sealed as pushed: %v", err, bytes.Equal(kept, body))
	}
	if !gotCA.Certificate().Equal(ca.Certificate()) {
		t.Fatal("CA in force is not the server's")
	}
	if gotRoots != nil {
		t.Fatal("a push without an upstream CA set roots other than the image's")
	}
	// The server's upstream CA, sealed: the proxy trusts it for
	// upstreams; one that does not open (another key, or the vault's own
	// sealing ID) is refused whole.
	upCA, err := mitm.NewCA("upstream")
	if err != nil {
		t.Fatal(err)
	}
	withCA := func(sl *vault.Sealer, ad string) []byte {
		var req sidecar.VaultRequest
		if err := json.Unmarshal(body, &req); err != nil {
			t.Fatal(err)
		}
		req.UpstreamCA = sl.Seal(ad, upCA.CertPEM())
		b, err := json.Marshal(req)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	got = nil
	for _, b := range [][]byte{withCA(sealer(t, 2), sidecar.UpstreamCAAD), withCA(sealer(t, 1), sidecar.VaultAD)} {
		if code, _ := put(token, b); code != http.StatusBadRequest || got != nil {
			t.Fatalf("a foreign upstream CA: %d, want 400 and nothing in force", code)
		}
	}
	if code, out := put(token, withCA(sealer(t, 1), sidecar.UpstreamCAAD)); code != http.StatusNoContent {
		t.Fatalf("put with an upstream CA: %d %q", code, out)
	}
	leaf, err := upCA.Leaf("up.test")
	if err != nil {
		t.Fatal(err)
	}
	if gotRoots == nil {
		t.Fatal("the upstream CA is not in force")
	}
	if _, err := leaf.Leaf.Verify(x509.VerifyOptions{DNSName: "up.test", Roots: gotRoots}); err != nil {
		t.Fatalf("an upstream certificate of the server's CA does not verify: %v", err)
	}
	attachErr = errors.New("no interceptor")
	if code, _ := put(token, body); code != http.StatusNotImplemented {
		t.Fatalf("attach failing: %d, want 501", code)
	}
	if strings.Contains(logs.String(), vaultSecret) {
		t.Fatalf("value logged: %s", logs.String())
	}
}

package kubernetes

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
	"strings"
	"testing"

	sbv1 "github.com/moat-sandbox/moat/api/v1alpha1"
	"github.com/moat-sandbox/moat/internal/egress/mitm"
	"github.com/moat-sandbox/moat/internal/egress/policy"
	"github.com/moat-sandbox/moat/internal/egress/sidecar"
	"github.com/moat-sandbox/moat/internal/egress/vault"
	"github.com/moat-sandbox/moat/internal/errdefs"
	"github.com/moat-sandbox/moat/internal/runtime"
)

const podVaultSecret = "tok-K8S-POD-SECRET-3"

// TestEgressSecretVaultKey: a sandbox with the Credential Vault gets a
// fresh vault key of its own in its token Secret; one without gets none,
// and its sidecar runs no proxy.
func TestEgressSecretVaultKey(t *testing.T) {
	r := &Runtime{cfg: Config{DNSUpstreams: []string{"127.0.0.1:53"}}}
	spec := runtime.Spec{ID: "sb-1", Egress: &runtime.Egress{Token: "t", Policy: policy.NetworkPolicy{DefaultAction: policy.Deny}}}
	plain := map[string]string{}
	if err := r.egressSecret(spec, plain); err != nil {
		t.Fatal(err)
	}
	if _, ok := plain[sbv1.EgressSecretVaultKey]; ok {
		t.Errorf("a sandbox without credentialProxy got a vault key")
	}
	spec.Egress.CredentialProxy = true
	a, b := map[string]string{}, map[string]string{}
	if err := r.egressSecret(spec, a); err != nil {
		t.Fatal(err)
	}
	if err := r.egressSecret(spec, b); err != nil {
		t.Fatal(err)
	}
	ka, err := vault.ParseKey(a[sbv1.EgressSecretVaultKey])
	if err != nil {
		t.Fatalf("vault key %q: %v", a[sbv1.EgressSecretVaultKey], err)
	}
	if bytes.Equal(ka, make([]byte, vault.KeySize)) || a[sbv1.EgressSecretVaultKey] == b[sbv1.EgressSecretVaultKey] {
		t.Error("vault keys are not fresh per sandbox")
	}
}

// TestSealForSidecar: what the server pushes opens in the sidecar's
// handler under the pod's key (the CA and the rules in force), carries no
// value in the clear, and does not open under another pod's key.
func TestSealForSidecar(t *testing.T) {
	r := &Runtime{cfg: Config{DNSUpstreams: []string{"127.0.0.1:53"}}}
	data := map[string]string{}
	spec := runtime.Spec{ID: "sb-1", Egress: &runtime.Egress{Token: "tok", Policy: policy.NetworkPolicy{DefaultAction: policy.Deny}, CredentialProxy: true}}
	if err := r.egressSecret(spec, data); err != nil {
		t.Fatal(err)
	}
	req, err := vault.DecodeCreate([]byte(`{"credentials":[{"name":"t","source":{"value":"` + podVaultSecret + `"}}],
	 "bindings":[{"name":"api","match":{"hosts":["api.test"]},"auth":{"type":"bearer","credential":"t"}}]}`))
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
	body, err := sealForSidecar([]byte(data[sbv1.EgressSecretVaultKey]), ca, st, nil)
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Contains(body, []byte(podVaultSecret)) {
		t.Fatal("the pushed body holds the credential in the clear")
	}
	put := func(key string) (int, *vault.Rules, *mitm.CA) {
		t.Helper()
		k, err := vault.ParseKey(key)
		if err != nil {
			t.Fatal(err)
		}
		sl, err := vault.NewSealer(k)
		if err != nil {
			t.Fatal(err)
		}
		var got *vault.Rules
		var gotCA *mitm.CA
		h := sidecar.VaultHandler("tok", sl, func(_ context.Context, ca *mitm.CA, rules *vault.Rules, _ *x509.CertPool) error {
			got, gotCA = rules, ca
			return nil
		}, slog.New(slog.NewTextHandler(io.Discard, nil)), "")
		w := httptest.NewRecorder()
		rq := httptest.NewRequest(http.MethodPut, sidecar.VaultPath, bytes.NewReader(body))
		rq.Header.Set("OPENSANDBOX-EGRESS-AUTH", "tok")
		h.ServeHTTP(w, rq)
		return w.Code, got, gotCA
	}
	code, rules, gotCA := put(data[sbv1.EgressSecretVaultKey])
	if code != http.StatusNoContent || rules == nil || gotCA == nil {
		t.Fatalf("the pod's sidecar answered %d (rules %v)", code, rules)
	}
	if !bytes.Equal(gotCA.CertPEM(), ca.CertPEM()) {
		t.Error("the sidecar got another CA")
	}
	inj := rules.Match("https", "api.test", 443, "GET", "/")
	if inj == nil {
		t.Fatal("the sidecar's rules do not bind api.test")
	}
	h := http.Header{}
	if err := inj.Apply(h, nil); err != nil || h.Get("Authorization") != "Bearer "+podVaultSecret {
		t.Errorf("the sidecar's rules inject %q (%v)", h.Get("Authorization"), err)
	}
	other := map[string]string{}
	if err := r.egressSecret(spec, other); err != nil {
		t.Fatal(err)
	}
	if code, _, _ := put(other[sbv1.EgressSecretVaultKey]); code != http.StatusBadRequest {
		t.Errorf("another pod's sidecar answered %d, want 400", code)
	}
	// The server's upstream CA goes sealed with it, and the pod's
	// sidecar trusts it for upstreams.
	upCA, err := mitm.NewCA("upstream")
	if err != nil {
		t.Fatal(err)
	}
	withCA, err := sealForSidecar([]byte(data[sbv1.EgressSecretVaultKey]), ca, st, upCA.CertPEM())
	if err != nil {
		t.Fatal(err)
	}
	var pushed sidecar.VaultRequest
	if err := json.Unmarshal(withCA, &pushed); err != nil || len(pushed.UpstreamCA) == 0 {
		t.Fatalf("the push carries no sealed upstream CA (%v)", err)
	}
	k, _ := vault.ParseKey(data[sbv1.EgressSecretVaultKey])
	sl, _ := vault.NewSealer(k)
	var roots *x509.CertPool
	hr := sidecar.VaultHandler("tok", sl, func(_ context.Context, _ *mitm.CA, _ *vault.Rules, r *x509.CertPool) error {
		roots = r
		return nil
	}, slog.New(slog.NewTextHandler(io.Discard, nil)), "")
	w := httptest.NewRecorder()
	rq := httptest.NewRequest(http.MethodPut, sidecar.VaultPath, bytes.NewReader(withCA))
	rq.Header.Set("OPENSANDBOX-EGRESS-AUTH", "tok")
	hr.ServeHTTP(w, rq)
	leaf, err := upCA.Leaf("up.test")
	if err != nil {
		t.Fatal(err)
	}
	if w.Code != http.StatusNoContent || roots == nil {
		t.Fatalf("push with the upstream CA: %d, roots %v", w.Code, roots)
	}
	if _, err := leaf.Leaf.Verify(x509.VerifyOptions{DNSName: "up.test", Roots: roots}); err != nil {
		t.Errorf("the sidecar does not trust the server's upstream CA: %v", err)
	}
	if _, err := sealForSidecar(nil, ca, st, nil); !errors.Is(err, errdefs.ErrNotImplemented) {
		t.Errorf("a pod without a vault key: %v, want ErrNotImplemented", err)
	}
	if strings.Contains(data[sbv1.EgressSecretPolicy], podVaultSecret) {
		t.Error("the policy key holds the credential")
	}
}

package e2e

import (
	"strings"
	"testing"
)

// TestCredentialVaultUnresolvedDestination: a sandbox that reaches a bound
// host at an address it chose itself (the probe's -resolve, as curl
// --resolve) gets no credential, and the sandbox's events say so once
// (CredentialWithheld, reason UnresolvedDestination) however often it
// tries; the same address named in a binding's match.trustedCidrs gets
// the credential and no event, and a name resolved through moat's DNS
// gets it as always.
func TestCredentialVaultUnresolvedDestination(t *testing.T) {
	srv := newServer(t)
	ref := startRegistry(t)
	env := newVaultEnv(t, srv)
	srv.start(env.flags...)
	up, o := env.up, env.o
	// The policy allows the address itself: the sandbox may reach it, the
	// vault decides about the credential.
	v := newVaultSandbox(t, t, srv, ref, "runc", env.probe, o.b)
	v.mustVault(201, "POST", "/credential-vault", `{
	 "credentials": [{"name": "bearer", "source": {"type": "inline", "value": "`+vaultBearer+`"}}],
	 "bindings": [
	  {"name": "api", "match": {"hosts": ["api.vault.test"]}, "auth": {"type": "bearer", "credential": "bearer"}},
	  {"name": "trusted", "match": {"hosts": ["t.vault.test"], "trustedCidrs": ["`+o.b+`/32"]}, "auth": {"type": "bearer", "credential": "bearer"}}
	 ]}`)
	caName := "moat sandbox CA " + v.id

	// Not resolved by moat's DNS (api.vault.test resolves to o.a, and the
	// sandbox asked no one): forwarded, without the credential, twice.
	for _, path := range []string{"/chosen-1", "/chosen-2"} {
		r := v.probe("-resolve", "api.vault.test:443:"+o.b, "https://api.vault.test"+path)
		if r.Status != 200 || r.Issuer != caName {
			t.Fatalf("unresolved destination %s: %+v", path, r)
		}
		if h := up.last(t, "api.vault.test", path).Header; h.Get("Authorization") != "" {
			t.Fatalf("a credential went to an address the sandbox chose: %v", h)
		}
	}
	// The proxy records the event off the request's path.
	got := srv.waitWithheld(t, v.id)
	if len(got) != 1 {
		t.Fatalf("want one CredentialWithheld event for two withheld requests (one a minute per binding and host), got %q", got)
	}
	for _, want := range []string{"runtime CredentialWithheld UnresolvedDestination", `binding "api"`, "api.vault.test at " + o.b, "match.trustedCidrs"} {
		if !strings.Contains(got[0], want) {
			t.Errorf("the event lacks %q: %s", want, got[0])
		}
	}
	for _, s := range vaultSecrets {
		if strings.Contains(got[0], s) {
			t.Fatalf("the event holds a credential value: %s", got[0])
		}
	}

	// The same address, trusted by the binding: the credential, no event.
	r := v.probe("-resolve", "t.vault.test:443:"+o.b, "https://t.vault.test/trusted")
	if r.Status != 200 || r.Issuer != caName {
		t.Fatalf("trusted destination: %+v", r)
	}
	if h := up.last(t, "t.vault.test", "/trusted").Header; h.Get("Authorization") != "Bearer "+vaultBearer {
		t.Fatalf("trusted destination: upstream saw %v", h)
	}
	// Resolved through moat's DNS: the credential, no event.
	v.probe("https://api.vault.test/resolved")
	if h := up.last(t, "api.vault.test", "/resolved").Header; h.Get("Authorization") != "Bearer "+vaultBearer {
		t.Fatalf("resolved destination: upstream saw %v", h)
	}
	if got := srv.withheldEvents(t, v.id); len(got) != 1 {
		t.Fatalf("a credential that was injected recorded an event: %q", got)
	}
	assertSandboxHoldsNoSecret(t, v)
}

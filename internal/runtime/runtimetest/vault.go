package runtimetest

import (
	"context"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"sync"
	"testing"

	"github.com/moat-sandbox/moat/internal/agentproto"
	"github.com/moat-sandbox/moat/internal/egress/mitm"
	"github.com/moat-sandbox/moat/internal/egress/policy"
	"github.com/moat-sandbox/moat/internal/egress/vault"
)

// VaultHarness runs the Credential Vault's proxy for a backend's
// sandboxes the way the server does (credvault.CredentialProxy).
type VaultHarness interface {
	EgressHarness
	// AttachProxy starts attached sandbox id's proxy with ca and state.
	AttachProxy(ctx context.Context, id string, ca *mitm.CA, state *vault.State, withheld func(context.Context, mitm.Withheld)) error
	// SetProxyRules replaces its vault.
	SetProxyRules(ctx context.Context, id string, ca *mitm.CA, state *vault.State) error
	// Upstream is an address of the host the sandboxes reach, where the
	// case serves plain HTTP on port 80 (the bound upstream).
	Upstream() string
}

// The case's credential values, which must reach the upstream and
// nothing else. Commands in the sandbox name them in two halves.
const (
	vaultSecretA = "rt-vault-" + "SECRET-A-91c4"
	vaultSecretB = "rt-vault-" + "SECRET-B-2e7d"
)

// vaultUpstream records the Authorization header of each path and echoes
// it, as httpbin does (the proxy must scrub it).
type vaultUpstream struct {
	mu  sync.Mutex
	got map[string]string
}

func (u *vaultUpstream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	io.Copy(io.Discard, r.Body)
	u.mu.Lock()
	u.got[r.URL.Path] = r.Header.Get("Authorization")
	u.mu.Unlock()
	fmt.Fprintf(w, "upstream saw Authorization=%q", r.Header.Get("Authorization"))
}

func (u *vaultUpstream) auth(path string) (string, bool) {
	u.mu.Lock()
	defer u.mu.Unlock()
	a, ok := u.got[path]
	return a, ok
}

func vaultState(t *testing.T, secret, upstream string) *vault.State {
	t.Helper()
	req, err := vault.DecodeCreate([]byte(`{"credentials":[{"name":"t","source":{"type":"inline","value":"` + secret + `"}}],
	 "bindings":[{"name":"api","match":{"schemes":["http"],"hosts":["api.vault.test"],"trustedCidrs":["` + upstream + `/32"]},
	 "auth":{"type":"bearer","credential":"t"}}]}`))
	if err != nil {
		t.Fatal(err)
	}
	st, err := vault.New(req, nil)
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// vaultCase: a sandbox created with the Credential Vault trusts its CA
// (the agent installs it; the variable does not reach its processes),
// its request to the bound host gets the credential and an answer
// scrubbed of it, a new vault takes effect at the next request, an empty
// one injects nothing, and no value is readable in the sandbox.
func (s *suite) vaultCase(t *testing.T) {
	if s.opts.NoCommands {
		t.Fatal("Options.Vault needs a backend whose agents run commands")
	}
	ctx := s.ctxFor(t)
	rt := s.newRuntime(t)
	h := s.opts.Vault(t, rt)
	addr := h.Upstream()
	up := &vaultUpstream{got: map[string]string{}}
	ln, err := net.Listen("tcp", net.JoinHostPort(addr, "80"))
	if err != nil {
		t.Fatal(err)
	}
	hs := &http.Server{Handler: up}
	go hs.Serve(ln)
	t.Cleanup(func() { hs.Close() })

	id := NewID("vault")
	ca, err := mitm.NewCA(id)
	if err != nil {
		t.Fatal(err)
	}
	p := policy.NetworkPolicy{DefaultAction: policy.Deny, Egress: []policy.Rule{{Action: policy.Allow, Target: addr + "/32"}}}
	spec := s.spec(id)
	spec.Env = maps.Clone(spec.Env)
	spec.Env[agentproto.TrustCAEnv] = string(ca.CertPEM())
	if in, ok := h.(EgressInside); ok {
		spec.Egress = in.Spec(p)
		spec.Egress.CredentialProxy = true
	}
	st := s.createSpec(t, ctx, rt, spec)
	ip, err := netip.ParseAddr(st.IP)
	if err != nil {
		t.Fatalf("sandbox IP %q: %v", st.IP, err)
	}
	if err := h.Attach(ctx, id, ip, p); err != nil {
		t.Fatalf("attach the policy: %v", err)
	}
	if err := h.AttachProxy(ctx, id, ca, vaultState(t, vaultSecretA, addr), nil); err != nil {
		t.Fatalf("attach the proxy: %v", err)
	}
	WaitAgent(t, ctx, rt, id, s.opts.AgentTimeout)
	get := func(path, want string) {
		t.Helper()
		out, _, err := Exec(ctx, rt, id, "wget -q -O- --header 'Host: api.vault.test' http://"+addr+path+" 2>&1; true")
		if err != nil {
			t.Fatalf("exec: %v", err)
		}
		got, ok := up.auth(path)
		if !ok {
			t.Fatalf("%s did not reach the upstream: %q", path, out)
		}
		if got != want {
			t.Errorf("%s: the upstream saw Authorization %q, want %q", path, got, want)
		}
		if strings.Contains(out, vaultSecretA) || strings.Contains(out, vaultSecretB) {
			t.Errorf("%s: the sandbox read a credential in the answer: %q", path, out)
		}
	}
	get("/v1/a", "Bearer "+vaultSecretA)
	if err := h.SetProxyRules(ctx, id, ca, vaultState(t, vaultSecretB, addr)); err != nil {
		t.Fatalf("set the rules: %v", err)
	}
	get("/v1/b", "Bearer "+vaultSecretB)
	if err := h.SetProxyRules(ctx, id, ca, nil); err != nil {
		t.Fatalf("clear the rules: %v", err)
	}
	get("/v1/c", "")

	out, _, err := Exec(ctx, rt, id, `grep -c 'BEGIN CERTIFICATE' /etc/ssl/certs/ca-certificates.crt; env | grep -c `+agentproto.TrustCAEnv+`;
a=rt-vault-; for s in SECRET-A-91c4 SECRET-B-2e7d; do
  for d in /etc /tmp /root /home /var /run; do [ -e $d ] && grep -rlsF "$a$s" $d; done
  for f in /proc/[0-9]*/environ /proc/[0-9]*/cmdline; do grep -lsF "$a$s" $f; done
done; echo searched`)
	if err != nil {
		t.Fatal(err)
	}
	if f := strings.Fields(out); len(f) != 3 || f[0] == "0" || f[1] != "0" || f[2] != "searched" {
		t.Errorf("the CA in the bundle, the variable in the environment, the values found in the sandbox:\n%s", out)
	}
}

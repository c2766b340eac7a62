package e2e

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/moat-sandbox/moat/internal/egress/mitm"
	"github.com/moat-sandbox/moat/internal/egress/nettest"
	"github.com/moat-sandbox/moat/internal/k8s/kclient"
)

// TestKubernetesCredentialVault: `moat serve --runtime kubernetes` runs
// the Credential Vault in the pod's egress sidecar with the native
// runtime's API: a vault created through the server's egress API injects
// its credential into the sandbox's request to the bound host (plain
// HTTP to a fake upstream on the node's bridge address, named by the
// test's DNS map), scrubs it from the answer, a live PATCH takes effect
// at the next request, a DELETE stops the injection, and the value is
// nowhere the sandbox can read (files, environment, /proc), in its pod
// spec, in any API answer or in the server's log. The sandbox's CA is
// installed in its system bundle by the agent, as on the native runtime.
//
// Over HTTPS the sidecar's proxy verifies the upstream (the same fake, with
// a certificate of a test CA on port 443) with the server's
// --vault-upstream-ca, which the server seals into each vault push; and a
// request to the bound host at an address the sandbox chose gets no
// credential and is reported by the sidecar to the server: one
// CredentialWithheld event and a withheld audit record, as on the native
// runtime.
func TestKubernetesCredentialVault(t *testing.T) {
	k := startKubeStack(t)
	gw := k.node.Gateway.String()
	upCA, err := mitm.NewCA("upstream-k8s-e2e")
	if err != nil {
		t.Fatal(err)
	}
	caFile := filepath.Join(t.TempDir(), "upstream-ca.pem")
	if err := os.WriteFile(caFile, upCA.CertPEM(), 0o644); err != nil {
		t.Fatal(err)
	}
	up := &fakeUpstream{}
	for _, port := range []string{"80", "443"} {
		ln, err := net.Listen("tcp", net.JoinHostPort(gw, port))
		if err != nil {
			t.Fatal(err)
		}
		hs := &http.Server{Handler: up, ErrorLog: log.New(io.Discard, "", 0)}
		if port == "443" {
			hs.TLSConfig = &tls.Config{GetCertificate: func(h *tls.ClientHelloInfo) (*tls.Certificate, error) { return upCA.Leaf(h.ServerName) }}
			go hs.ServeTLS(ln, "", "")
		} else {
			go hs.Serve(ln)
		}
		t.Cleanup(func() { hs.Close() })
	}
	dns, _ := nettest.ServeDNS(t, "", net.JoinHostPort(gw, "0"), map[string][]string{
		"api.vault.test.": {"api.vault.test. 60 IN A " + gw},
	})
	args := k.serverArgs()
	args[slices.Index(args, "--dns-upstream")+1] = dns
	args = append(args, "--vault-upstream-ca", caFile)
	srv := newServer(t)
	srv.start(args...)

	// w.vault.test (which moat's DNS does not answer) and the address
	// itself are allowed too: the sandbox may reach the upstream by a
	// bound name at an address it chose (the withheld case).
	np := map[string]any{"defaultAction": "deny", "egress": []map[string]string{{"action": "allow", "target": "api.vault.test"},
		{"action": "allow", "target": "w.vault.test"}, {"action": "allow", "target": gw}}}
	body := map[string]any{"image": map[string]any{"uri": k.ref}, "entrypoint": []string{"tail", "-f", "/dev/null"}, "timeout": 600,
		"networkPolicy": np, "credentialProxy": map[string]any{"enabled": true}}
	var c sandboxResp
	srv.mustJSON(202, "POST", "/v1/sandboxes", body, &c)
	t.Cleanup(func() { srv.do("DELETE", "/v1/sandboxes/"+c.ID, nil) })
	v := &vaultSandbox{t: t, srv: srv, id: c.ID}
	var ep endpointResp
	srv.mustJSON(200, "GET", "/v1/sandboxes/"+c.ID+"/endpoints/18080", nil, &ep)
	v.egress, v.tok = "http://"+ep.Endpoint, ep.Headers["OPENSANDBOX-EGRESS-AUTH"]
	v.agent, v.agentHdr = srv.agent(c.ID)
	uploadFile(t, v.agent, v.agentHdr, "/tmp/tlsprobe", buildProbe(t))
	if out, ok := shell(t, srv, c.ID, "chmod 755 /tmp/tlsprobe && echo ok"); !ok || !strings.Contains(out, "ok") {
		t.Fatalf("chmod probe: %q", out)
	}

	get := func(path string) string {
		t.Helper()
		out, _ := shell(t, srv, c.ID, "wget -q -O- http://api.vault.test"+path+" 2>&1; true")
		return out
	}
	if out := get("/v1/before"); !strings.Contains(out, `Authorization=""`) {
		t.Fatalf("before the vault: %q", out)
	}
	v.mustVault(404, "GET", "/credential-vault", "")
	out := v.mustVault(201, "POST", "/credential-vault", `{
 "credentials": [{"name": "bearer", "source": {"type": "inline", "value": "`+vaultBearer+`"}},
                 {"name": "key", "source": {"type": "inline", "value": "`+vaultKey+`"}}],
 "bindings": [{"name": "api-v1", "match": {"schemes": ["http"], "hosts": ["api.vault.test"], "paths": ["/v1/*"]}, "auth": {"type": "bearer", "credential": "bearer"}},
              {"name": "api-v2", "match": {"schemes": ["http"], "hosts": ["api.vault.test"], "paths": ["/v2/*"]}, "auth": {"type": "apiKey", "name": "X-Api-Key", "credential": "key"}},
              {"name": "api-tls", "match": {"schemes": ["https"], "hosts": ["api.vault.test", "w.vault.test"]}, "auth": {"type": "bearer", "credential": "bearer"}}]}`)
	if !strings.Contains(out, `"revision":1`) {
		t.Fatalf("create: %s", out)
	}
	// HTTPS: the sandbox sees its CA's leaf; the proxy verified the
	// upstream with the server's --vault-upstream-ca (else it would have
	// answered 502) and injected the credential.
	caName := "moat sandbox CA " + c.ID
	if r := v.probe("https://api.vault.test/tls/a"); r.Status != 200 || r.Issuer != caName || strings.Contains(r.Body, vaultBearer) {
		t.Fatalf("https through the sidecar's proxy: %+v", r)
	}
	if h := up.last(t, "api.vault.test", "/tls/a").Header; h.Get("Authorization") != "Bearer "+vaultBearer {
		t.Fatalf("https: the upstream saw %v", h)
	}
	// A bound host at an address moat's DNS never answered for it (the
	// sandbox chose it): no credential, one CredentialWithheld event for
	// two requests, and a withheld record.
	for _, path := range []string{"/chosen-1", "/chosen-2"} {
		if r := v.probe("-resolve", "w.vault.test:443:"+gw, "https://w.vault.test"+path); r.Status != 200 || r.Issuer != caName {
			t.Fatalf("unresolved destination %s: %+v", path, r)
		}
		if h := up.last(t, "w.vault.test", path).Header; h.Get("Authorization") != "" {
			t.Fatalf("a credential went to an address the sandbox chose: %v", h)
		}
	}
	got := srv.waitWithheld(t, c.ID)
	if len(got) != 1 || !strings.Contains(got[0], `binding "api-tls"`) || !strings.Contains(got[0], "w.vault.test at "+gw) {
		t.Fatalf("want one CredentialWithheld event naming binding api-tls and %s, got %q", gw, got)
	}
	type auditItem struct {
		Action     string `json:"action"`
		Credential *struct {
			Binding  string `json:"binding"`
			Injected bool   `json:"injected"`
		} `json:"credential"`
	}
	var trail struct{ Items []auditItem }
	srv.mustJSON(200, "GET", "/v1/sandboxes/"+c.ID+"/audit?kind=credential", nil, &trail)
	if !slices.ContainsFunc(trail.Items, func(r auditItem) bool {
		return r.Action == "withheld" && r.Credential != nil && r.Credential.Binding == "api-tls" && !r.Credential.Injected
	}) {
		t.Errorf("the audit trail has no withheld record of binding api-tls: %+v", trail.Items)
	}
	out = get("/v1/models")
	if h := up.last(t, "api.vault.test", "/v1/models").Header; h.Get("Authorization") != "Bearer "+vaultBearer {
		t.Fatalf("bearer: the upstream saw %v", h)
	}
	if strings.Contains(out, vaultBearer) || !strings.Contains(out, "upstream api.vault.test saw") {
		t.Fatalf("the sandbox's answer is not scrubbed: %q", out)
	}
	get("/v2/items")
	if h := up.last(t, "api.vault.test", "/v2/items").Header; h.Get("X-Api-Key") != vaultKey {
		t.Fatalf("apiKey: the upstream saw %v", h)
	}
	// A live PATCH: the next request carries the new value.
	v.mustVault(200, "PATCH", "/credential-vault", `{"expectedRevision": 1, "credentials": {"replace": [{"name": "bearer", "source": {"type": "inline", "value": "`+vaultBearer2+`"}}]}}`)
	get("/v1/after-patch")
	if h := up.last(t, "api.vault.test", "/v1/after-patch").Header; h.Get("Authorization") != "Bearer "+vaultBearer2 {
		t.Fatalf("after PATCH: the upstream saw %v", h)
	}
	v.mustVault(409, "PATCH", "/credential-vault", `{"expectedRevision": 1, "credentials": {"delete": ["key"]}}`)
	v.mustVault(200, "GET", "/credential-vault", "")

	// The agent installed the CA as on the native runtime.
	if out, _ := shell(t, srv, c.ID, "grep -c 'BEGIN CERTIFICATE' /etc/ssl/certs/ca-certificates.crt"); strings.TrimSpace(out) == "" || strings.TrimSpace(out) == "0" {
		t.Errorf("no CA in the sandbox's bundle: %q", out)
	}
	assertSandboxHoldsNoSecret(t, v)

	// The pod spec names the vault key only in the sidecar, by reference.
	kc, err := client.New(k.node.Config, client.Options{Scheme: kclient.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	var pods corev1.PodList
	if err := kc.List(context.Background(), &pods, client.InNamespace(k.ns)); err != nil {
		t.Fatal(err)
	}
	found := false
	for _, p := range pods.Items {
		b, _ := json.Marshal(p)
		for _, s := range vaultSecrets {
			if strings.Contains(string(b), s) {
				t.Errorf("pod %s's spec holds a credential value", p.Name)
			}
		}
		// The sidecar is a native sidecar (an init container).
		for _, ct := range append(slices.Clone(p.Spec.InitContainers), p.Spec.Containers...) {
			for _, e := range ct.Env {
				if e.Name == "MOAT_EGRESS_VAULT_KEY" {
					found = true
					if e.Value != "" || ct.Name == "sandbox" {
						t.Errorf("container %s of pod %s gets the vault key %+v", ct.Name, p.Name, e)
					}
				}
			}
		}
	}
	if !found {
		t.Error("no pod's sidecar gets a vault key")
	}

	v.mustVault(204, "DELETE", "/credential-vault", "")
	get("/v1/after-delete")
	if h := up.last(t, "api.vault.test", "/v1/after-delete").Header; h.Get("Authorization") != "" {
		t.Fatalf("after DELETE: the upstream saw %v", h)
	}
	logb, _ := os.ReadFile(srv.logf.Name())
	for _, s := range vaultSecrets {
		if strings.Contains(string(logb), s) {
			t.Errorf("the server log holds a credential value (%s...)", s[:12])
		}
	}
}

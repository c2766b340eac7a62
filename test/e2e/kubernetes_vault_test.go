package e2e

import (
	"context"
	"encoding/json"
	"net"
	"net/http"
	"os"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

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
func TestKubernetesCredentialVault(t *testing.T) {
	k := startKubeStack(t)
	gw := k.node.Gateway.String()
	up := &fakeUpstream{}
	ln, err := net.Listen("tcp", net.JoinHostPort(gw, "80"))
	if err != nil {
		t.Fatal(err)
	}
	hs := &http.Server{Handler: up}
	go hs.Serve(ln)
	t.Cleanup(func() { hs.Close() })
	dns, _ := nettest.ServeDNS(t, "", net.JoinHostPort(gw, "0"), map[string][]string{
		"api.vault.test.": {"api.vault.test. 60 IN A " + gw},
	})
	args := k.serverArgs()
	args[slices.Index(args, "--dns-upstream")+1] = dns
	srv := newServer(t)
	srv.start(args...)

	np := map[string]any{"defaultAction": "deny", "egress": []map[string]string{{"action": "allow", "target": "api.vault.test"}}}
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
              {"name": "api-v2", "match": {"schemes": ["http"], "hosts": ["api.vault.test"], "paths": ["/v2/*"]}, "auth": {"type": "apiKey", "name": "X-Api-Key", "credential": "key"}}]}`)
	if !strings.Contains(out, `"revision":1`) {
		t.Fatalf("create: %s", out)
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

package e2e

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/moat-sandbox/moat/internal/egress/mitm"
	"github.com/moat-sandbox/moat/internal/egress/nettest"
	"github.com/moat-sandbox/moat/internal/testutil"
)

// TestCredentialVaultClients checks the sandbox CA from real clients of a
// Debian image (the debian-kernels test image: python3, node, a JDK): the
// agent appended it to the image's existing bundle and pointed
// SSL_CERT_FILE, REQUESTS_CA_BUNDLE and NODE_EXTRA_CA_CERTS at it, so
// Python (OpenSSL) and Node reach a bound host through the proxy with
// verification on, and the credential arrives.
func TestCredentialVaultClients(t *testing.T) {
	script := filepath.Join(testutil.RepoRoot(t), "scripts", "build-test-images.sh")
	out, err := exec.Command("bash", script, "debian-kernels").Output()
	if err != nil {
		t.Fatalf("build test image: %v (run scripts/build-test-images.sh debian-kernels)", err)
	}
	tarball := strings.TrimSpace(string(out))
	srv := newServer(t)
	const ref = "localhost/debian-kernels:vault"
	if b, err := exec.Command(srv.bin, "image", "import", "--root", srv.root, ref, tarball).CombinedOutput(); err != nil {
		t.Fatalf("import: %v\n%s", err, b)
	}
	o := outsideHost(t, srv.net, false)
	upCA, err := mitm.NewCA("upstream-e2e")
	if err != nil {
		t.Fatal(err)
	}
	caFile := filepath.Join(t.TempDir(), "upstream-ca.pem")
	if err := os.WriteFile(caFile, upCA.CertPEM(), 0o644); err != nil {
		t.Fatal(err)
	}
	up := startFakeUpstream(t, o.ns, upCA, o.a)
	dns, _ := nettest.ServeDNS(t, "", "127.0.0.1:0", map[string][]string{
		"api.vault.test.": {"api.vault.test. 60 IN A " + o.a},
	})
	srv.start("--dns-upstream", dns, "--vault-upstream-ca", caFile)

	var c sandboxResp
	srv.mustJSON(202, "POST", "/v1/sandboxes", map[string]any{
		"image": map[string]any{"uri": ref}, "entrypoint": []string{"sleep", "infinity"}, "timeout": 600,
		"networkPolicy":   map[string]any{"defaultAction": "deny", "egress": []map[string]string{{"action": "allow", "target": "api.vault.test"}}},
		"credentialProxy": map[string]any{"enabled": true},
	}, &c)
	t.Cleanup(func() { srv.do("DELETE", "/v1/sandboxes/"+c.ID, nil) })
	v := &vaultSandbox{t: t, srv: srv, id: c.ID}
	var ep endpointResp
	srv.mustJSON(200, "GET", "/v1/sandboxes/"+c.ID+"/endpoints/18080", nil, &ep)
	v.egress, v.tok = "http://"+ep.Endpoint, ep.Headers["OPENSANDBOX-EGRESS-AUTH"]
	v.mustVault(201, "POST", "/credential-vault", `{"credentials":[{"name":"t","source":{"type":"inline","value":"`+vaultBearer+`"}}],
	  "bindings":[{"name":"api","match":{"hosts":["api.vault.test"]},"auth":{"type":"bearer","credential":"t"}}]}`)

	// The image's own bundle kept its roots and gained the sandbox CA.
	bundle, ok := shell(t, srv, c.ID, `echo "$SSL_CERT_FILE $REQUESTS_CA_BUNDLE $NODE_EXTRA_CA_CERTS"; grep -c 'BEGIN CERTIFICATE' /etc/ssl/certs/ca-certificates.crt`)
	if !ok || !strings.Contains(bundle, "/etc/ssl/certs/ca-certificates.crt /etc/ssl/certs/ca-certificates.crt /etc/ssl/certs/ca-certificates.crt") {
		t.Fatalf("trust environment: ok=%v %q", ok, bundle)
	}
	for _, client := range []struct{ name, cmd string }{
		{"python", `python3 -c "import urllib.request; print(urllib.request.urlopen('https://api.vault.test/py').read().decode())"`},
		{"node", `node -e "require('https').get('https://api.vault.test/node', r => { let b=''; r.on('data', d => b += d); r.on('end', () => console.log(r.statusCode, b)); }).on('error', e => { console.log('ERR', e.message); })"`},
	} {
		got, ok := shell(t, srv, c.ID, client.cmd+" 2>&1")
		if !ok || !strings.Contains(got, "upstream api.vault.test saw") || strings.Contains(got, vaultBearer) {
			t.Fatalf("%s: ok=%v %q", client.name, ok, got)
		}
		path := "/" + map[string]string{"python": "py", "node": "node"}[client.name]
		if h := up.last(t, "api.vault.test", path).Header; h.Get("Authorization") != "Bearer "+vaultBearer {
			t.Fatalf("%s: upstream saw %v", client.name, h)
		}
	}
}

package e2e

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"math/big"
	mrand "math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/moat-sandbox/moat/internal/tenant"
	"github.com/moat-sandbox/moat/internal/testutil"
)

// e2bTestDomain is the suite's E2B domain: .test is reserved (RFC 2606),
// and only the suite's node processes resolve it (loopback-dns.cjs).
const e2bTestDomain = "e2b.moat.test"

// e2bSuiteFiles are the suite files this test runs, one after the other.
var e2bSuiteFiles = []string{"sdk.test.mjs", "lifecycle.test.mjs", "commands.test.mjs", "files.test.mjs", "edge.test.mjs"}

// TestCompatE2BSDK runs test/compat/e2b (node:test): E2B's official
// JavaScript SDK, pinned and unchanged, against a real `moat serve` in
// the SDK's domain mode (see startE2B). The key is a tenant's in E2B's
// form, the template one over the debian-kernels test image.
func TestCompatE2BSDK(t *testing.T) {
	e := startE2B(t)
	args := append([]string{"--test", "--test-concurrency=1", "--test-reporter=spec"}, e2bSuiteFiles...)
	out := e.node(t, 15*time.Minute, args...)
	t.Logf("%s", out)
	// The suite killed what it made: nothing is left in the tenant.
	var list struct{ Items []struct{ ID string } }
	code, body, _ := e.srv.do("GET", "/v1/sandboxes", nil, "OPEN-SANDBOX-API-KEY", e.key)
	if code != 200 || json.Unmarshal(body, &list) != nil || len(list.Items) != 0 {
		t.Fatalf("sandboxes left after the suite: %d %s", code, body)
	}
}

// e2bEnv is a `moat serve` in E2B's domain mode and what the SDK needs
// to reach it.
type e2bEnv struct {
	srv *server
	dir string   // test/compat/e2b
	key string   // the tenant's moat key
	env []string // the node processes' environment
	ref string   // the debian-kernels image
}

// startE2B starts moat with TLS (a wildcard certificate of a test CA,
// HTTP/2 by ALPN) on port 443 of a loopback address of its own and
// --e2b-domain, beside its plain listener; the node processes it runs
// trust the CA (NODE_EXTRA_CA_CERTS) and resolve api.<domain> and
// <port>-<id>.<domain> to that address, they alone (loopback-dns.cjs).
// The tenant "e2b-sdk" has an operator key and the template e2b-suite.
func startE2B(t *testing.T, extra ...string) *e2bEnv {
	t.Helper()
	return startE2BWith(t, nil, extra...)
}

// startE2BWith is startE2B with before run on the server before it starts
// (e.g. to import images).
func startE2BWith(t *testing.T, before func(*server), extra ...string) *e2bEnv {
	t.Helper()
	lookNode(t)
	e := &e2bEnv{dir: filepath.Join(testutil.RepoRoot(t), "test", "compat", "e2b")}
	npmCI(t, e.dir)
	e.srv = newServer(t)
	e.ref = importKernelsImage(t, e.srv)
	if before != nil {
		before(e.srv)
	}
	ca, cert, key := writeTestPKI(t, t.TempDir(), e2bTestDomain)
	addr := loopback443(t)
	e.srv.start(append([]string{"--e2b-domain", e2bTestDomain, "--tls-cert", cert, "--tls-key", key, "--tls-listen", addr}, extra...)...)

	var k struct{ Key string }
	e.srv.mustJSON(201, "POST", "/v1/keys", map[string]string{"tenant": "e2b-sdk", "role": "operator", "name": "e2b suite"}, &k)
	e.key = k.Key
	// The template is the tenant's: made with the tenant's own key.
	e.template(t, map[string]any{"id": "e2b-suite", "image": e.ref, "user": "root", "workdir": "/root"})
	host, _, _ := net.SplitHostPort(addr)
	e.env = append(os.Environ(),
		"E2B_DOMAIN="+e2bTestDomain,
		"E2B_API_KEY="+tenant.E2BKey(k.Key),
		"NODE_EXTRA_CA_CERTS="+ca,
		"NODE_OPTIONS=--require="+filepath.Join(e.dir, "loopback-dns.cjs"),
		"MOAT_E2B_DOMAIN="+e2bTestDomain,
		"MOAT_E2B_ADDR="+host,
		"MOAT_E2B_TEMPLATE=e2b-suite",
		"NO_COLOR=1",
	)
	return e
}

// template creates a template of the tenant's, with the tenant's key.
func (e *e2bEnv) template(t *testing.T, tmpl map[string]any) {
	t.Helper()
	if code, out, _ := e.srv.do("POST", "/v1/templates", tmpl, "OPEN-SANDBOX-API-KEY", e.key); code != 201 {
		t.Fatalf("create template: %d %s", code, out)
	}
}

// node runs node with args in test/compat/e2b and returns its output; it
// fails the test if node fails or outlasts limit.
func (e *e2bEnv) node(t *testing.T, limit time.Duration, args ...string) []byte {
	t.Helper()
	cmd := exec.Command(lookNode(t), args...)
	cmd.Dir = e.dir
	cmd.Env = e.env
	done := make(chan struct{})
	var out []byte
	var err error
	go func() { out, err = cmd.CombinedOutput(); close(done) }()
	select {
	case <-done:
	case <-time.After(limit):
		cmd.Process.Kill()
		<-done
		t.Fatalf("node %v did not finish in %s:\n%s", args, limit, out)
	}
	if err != nil {
		t.Fatalf("node %v failed: %v\n%s", args, err, out)
	}
	return out
}

// loopback443 picks a loopback address of the test's own (127.0.0.0/8 is
// all loopback on Linux) whose port 443 is free: the SDK's domain mode
// has https URLs without a port.
func loopback443(t *testing.T) string {
	t.Helper()
	for range 20 {
		addr := fmt.Sprintf("127.%d.%d.%d:443", 10+mrand.IntN(200), 1+mrand.IntN(250), 1+mrand.IntN(250))
		l, err := net.Listen("tcp", addr)
		if err == nil {
			l.Close()
			return addr
		}
	}
	t.Fatal("no loopback address with a free port 443")
	return ""
}

// writeTestPKI writes a test CA and a certificate it signed for domain
// and *.domain into dir: ca.pem, cert.pem, key.pem.
func writeTestPKI(t *testing.T, dir, domain string) (caFile, certFile, keyFile string) {
	t.Helper()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "moat e2e test CA"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour), IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageCRLSign}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	caCert, _ := x509.ParseCertificate(caDER)
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "*." + domain},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour), DNSNames: []string{"*." + domain, domain},
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, caCert, &key.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	kb, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	caFile, certFile, keyFile = filepath.Join(dir, "ca.pem"), filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	for f, b := range map[string]*pem.Block{
		caFile:   {Type: "CERTIFICATE", Bytes: caDER},
		certFile: {Type: "CERTIFICATE", Bytes: der},
		keyFile:  {Type: "EC PRIVATE KEY", Bytes: kb},
	} {
		if err := os.WriteFile(f, pem.EncodeToMemory(b), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return caFile, certFile, keyFile
}

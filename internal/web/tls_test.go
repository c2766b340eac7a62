package web_test

import (
	"bufio"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"io"
	"log/slog"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/moat-sandbox/moat/internal/web"
)

// writePair writes a self-signed certificate for names and its key.
func writePair(t *testing.T, dir, cn string, names ...string) (certFile, keyFile string, pool *x509.CertPool) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: cn},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		DNSNames: names, IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	kb, _ := x509.MarshalECPrivateKey(key)
	certFile, keyFile = filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	if err := os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kb}), 0o600); err != nil {
		t.Fatal(err)
	}
	c, _ := x509.ParseCertificate(der)
	pool = x509.NewCertPool()
	pool.AddCert(c)
	return certFile, keyFile, pool
}

// TestTLSServesHTTP2Streams: a server on a TLS listener with the
// Certificate's config negotiates h2 for a wildcard name, and a response
// streams (its first line arrives while the handler still holds the rest).
func TestTLSServesHTTP2Streams(t *testing.T) {
	certFile, keyFile, pool := writePair(t, t.TempDir(), "first", "*.moat.test", "moat.test")
	cert, err := web.LoadCertificate(certFile, keyFile)
	if err != nil {
		t.Fatal(err)
	}
	release := make(chan struct{})
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, r.Proto+"\n")
		w.(http.Flusher).Flush()
		<-release
		io.WriteString(w, "end\n")
	})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go web.ServeUntil(ctx, web.NewServer(ln.Addr().String(), h, slog.Default()), tls.NewListener(ln, cert.TLSConfig()))

	tr := &http.Transport{ForceAttemptHTTP2: true, TLSClientConfig: &tls.Config{RootCAs: pool, ServerName: "49983-abc.moat.test"}}
	defer tr.CloseIdleConnections()
	resp, err := (&http.Client{Transport: tr, Timeout: 30 * time.Second}).Get("https://" + ln.Addr().String() + "/")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.ProtoMajor != 2 {
		t.Fatalf("negotiated %s, want HTTP/2", resp.Proto)
	}
	br := bufio.NewReader(resp.Body)
	if line, err := br.ReadString('\n'); err != nil || line != "HTTP/2.0\n" {
		t.Fatalf("first line %q, %v: want it before the handler ends", line, err)
	}
	close(release)
	if rest, _ := io.ReadAll(br); string(rest) != "end\n" {
		t.Fatalf("rest %q", rest)
	}

	// HTTP/1.1 clients are served too.
	tr1 := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, ServerName: "api.moat.test"}, TLSNextProto: map[string]func(string, *tls.Conn) http.RoundTripper{}}
	defer tr1.CloseIdleConnections()
	resp1, err := (&http.Client{Transport: tr1, Timeout: 30 * time.Second}).Get("https://" + ln.Addr().String() + "/")
	if err != nil {
		t.Fatal(err)
	}
	resp1.Body.Close()
	if resp1.ProtoMajor != 1 {
		t.Fatalf("HTTP/1.1 client got %s", resp1.Proto)
	}
}

// TestCertificateReloads: a renewed pair on disk replaces the old one; a
// broken one keeps the old in service; a bad pair fails at load.
func TestCertificateReloads(t *testing.T) {
	dir := t.TempDir()
	certFile, keyFile, _ := writePair(t, dir, "first", "a.test")
	cert, err := web.LoadCertificate(certFile, keyFile)
	if err != nil {
		t.Fatal(err)
	}
	cn := func() string {
		c, err := cert.GetCertificate(nil)
		if err != nil || c == nil {
			t.Fatalf("GetCertificate: %v", err)
		}
		x, _ := x509.ParseCertificate(c.Certificate[0])
		return x.Subject.CommonName
	}
	if got := cn(); got != "first" {
		t.Fatalf("CN %q", got)
	}
	web.SetCertificateCheck(cert, 0)
	writePair(t, dir, "second", "a.test")
	future := time.Now().Add(time.Minute)
	os.Chtimes(certFile, future, future)
	if got := cn(); got != "second" {
		t.Fatalf("after renewal CN %q, want second", got)
	}
	os.WriteFile(certFile, []byte("half written"), 0o600)
	later := future.Add(time.Minute)
	os.Chtimes(certFile, later, later)
	if got := cn(); got != "second" {
		t.Fatalf("after a broken renewal CN %q, want the previous", got)
	}
	if _, err := web.LoadCertificate(certFile, keyFile); err == nil {
		t.Fatal("a broken pair loaded")
	}
	if _, err := web.LoadCertificate(certFile, ""); err == nil {
		t.Fatal("a pair without a key loaded")
	}
}

package mitm

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/moat-sandbox/moat/internal/egress/vault"
	"github.com/moat-sandbox/moat/internal/web/webtest"
)

// upstream is a fake HTTPS (or HTTP) server that records what it gets.
type upstream struct {
	addr string
	mu   sync.Mutex
	got  []seen
}

type seen struct {
	Proto  int // HTTP major version
	Host   string
	Path   string
	Query  string
	Header http.Header
	Body   string
	Length int64 // the request's Content-Length (-1 unknown)
}

func (u *upstream) last(t *testing.T) seen {
	t.Helper()
	u.mu.Lock()
	defer u.mu.Unlock()
	if len(u.got) == 0 {
		t.Fatal("upstream received no request")
	}
	return u.got[len(u.got)-1]
}

// startUpstream serves on loopback. With ca it serves TLS with a leaf
// for names signed by ca. Its handler echoes the request headers in the
// body and in an X-Echo header, like httpbin, to exercise scrubbing.
func startUpstream(t testing.TB, ca *CA, names ...string) *upstream {
	t.Helper()
	u := &upstream{}
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		u.mu.Lock()
		u.got = append(u.got, seen{Proto: r.ProtoMajor, Host: r.Host, Path: r.URL.Path, Query: r.URL.RawQuery, Header: r.Header.Clone(),
			Body: string(body), Length: r.ContentLength})
		u.mu.Unlock()
		b, _ := json.Marshal(r.Header)
		w.Header().Set("X-Echo", r.Header.Get("Authorization"))
		w.Header().Set("X-Upstream", "real")
		w.Write(b)
	})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: h, ErrorLog: log.New(io.Discard, "", 0)}
	if ca != nil {
		srv.TLSConfig = &tls.Config{GetCertificate: func(hi *tls.ClientHelloInfo) (*tls.Certificate, error) {
			name := hi.ServerName
			if name == "" {
				name = names[0]
			}
			return ca.Leaf(name)
		}}
		go srv.ServeTLS(ln, "", "")
	} else {
		go srv.Serve(ln)
	}
	t.Cleanup(func() { srv.Close() })
	u.addr = ln.Addr().String()
	return u
}

// rig is a proxy on loopback with "redirects": listeners whose
// connections the proxy treats as if NAT had sent them from a sandbox to
// a fake destination, and a dialer mapping fake destinations to the
// loopback upstreams.
type rig struct {
	t        testing.TB
	p        *Proxy
	cl       *Client
	sbCA     *CA // the sandbox CA (what the sandbox trusts)
	pubCA    *CA // the "public" CA of the upstreams (what the host trusts)
	mu       sync.Mutex
	redirect map[string]netip.AddrPort // proxy listener addr -> fake original dst
	real     map[netip.AddrPort]string // fake dst -> upstream address
	resolved map[string]bool           // host|ip the sandbox resolved
	ctx      context.Context
	serving  sync.WaitGroup
}

func newRig(t testing.TB) *rig {
	t.Helper()
	sbCA, err := NewCA("sb-test")
	if err != nil {
		t.Fatal(err)
	}
	pubCA, err := NewCA("public")
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AddCert(pubCA.Certificate())
	r := &rig{t: t, sbCA: sbCA, pubCA: pubCA, redirect: map[string]netip.AddrPort{}, real: map[netip.AddrPort]string{}, resolved: map[string]bool{}}
	r.p = New(Config{
		RootCAs: roots,
		OriginalDst: func(c net.Conn) (netip.AddrPort, error) {
			r.mu.Lock()
			defer r.mu.Unlock()
			return r.redirect[c.LocalAddr().String()], nil
		},
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			r.mu.Lock()
			real := r.real[netip.MustParseAddrPort(addr)]
			r.mu.Unlock()
			return (&net.Dialer{}).DialContext(ctx, network, real)
		},
	})
	r.cl = NewClient("sb-test", sbCA, func(host string, ip netip.Addr) bool {
		r.mu.Lock()
		defer r.mu.Unlock()
		return r.resolved[host+"|"+ip.String()]
	})
	if err := r.p.Register(netip.MustParseAddr("127.0.0.1"), r.cl); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	r.ctx = ctx
	t.Cleanup(func() { cancel(); r.serving.Wait() })
	return r
}

// route makes connections to fake dst reach up; it returns the proxy
// address a "sandbox" dials for dst.
func (r *rig) route(dst string, up *upstream, resolvedAs ...string) string {
	r.t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		r.t.Fatal(err)
	}
	r.serving.Add(1)
	go func() { defer r.serving.Done(); r.p.Serve(r.ctx, ln) }()
	d := netip.MustParseAddrPort(dst)
	r.mu.Lock()
	r.redirect[ln.Addr().String()] = d
	r.real[d] = up.addr
	for _, h := range resolvedAs {
		r.resolved[h+"|"+d.Addr().String()] = true
	}
	r.mu.Unlock()
	return ln.Addr().String()
}

// sandboxClient is an HTTP client that trusts roots and sends every
// connection to the proxy address via.
func sandboxClient(via string, roots *x509.CertPool) *http.Client {
	return &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
		DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, network, via)
		},
		TLSClientConfig: &tls.Config{RootCAs: roots},
	}}
}

func pool(ca *CA) *x509.CertPool {
	p := x509.NewCertPool()
	p.AddCert(ca.Certificate())
	return p
}

func rules(t testing.TB, body string) *vault.Rules {
	t.Helper()
	req, err := vault.DecodeCreate([]byte(body))
	if err != nil {
		t.Fatal(err)
	}
	s, err := vault.New(req, nil)
	if err != nil {
		t.Fatal(err)
	}
	return s.Compile()
}

const secret = "tok-SECRET-42"

const testVault = `{"credentials":[{"name":"t","source":{"type":"inline","value":"` + secret + `"}},{"name":"k","source":{"value":"qk"}}],
 "bindings":[
  {"name":"api","match":{"hosts":["api.test"],"paths":["/v1/*"]},"auth":{"type":"bearer","credential":"t"}},
  {"name":"q","match":{"hosts":["q.test"]},"auth":{"type":"apiKey","name":"key","in":"query","credential":"k"}},
  {"name":"plain","match":{"hosts":["plain.test"],"schemes":["http"]},"auth":{"type":"customHeaders","headers":[{"name":"X-Key","credential":"k"}]}}
 ]}`

func get(t *testing.T, c *http.Client, url string, hdr http.Header) (*http.Response, string) {
	t.Helper()
	req, _ := http.NewRequest("GET", url, nil)
	for k, v := range hdr {
		req.Header[k] = v
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp, string(b)
}

func TestInjectsOnBoundHostAndScrubsEcho(t *testing.T) {
	r := newRig(t)
	r.cl.SetRules(rules(t, testVault))
	up := startUpstream(t, r.pubCA, "api.test")
	via := r.route("10.9.0.1:443", up, "api.test")
	c := sandboxClient(via, pool(r.sbCA))

	resp, body := get(t, c, "https://api.test/v1/models?x=1", http.Header{"Authorization": {"Bearer made-up"}})
	if resp.StatusCode != 200 {
		t.Fatalf("status %d: %s", resp.StatusCode, body)
	}
	got := up.last(t)
	if a := got.Header.Values("Authorization"); len(a) != 1 || a[0] != "Bearer "+secret {
		t.Fatalf("upstream Authorization %q", a)
	}
	if got.Host != "api.test" || got.Path != "/v1/models" || got.Query != "x=1" {
		t.Fatalf("upstream saw %+v", got)
	}
	// The sandbox's TLS peer was the proxy (a leaf of the sandbox CA).
	if iss := resp.TLS.PeerCertificates[0].Issuer.CommonName; iss != "moat sandbox CA sb-test" {
		t.Fatalf("issuer %q", iss)
	}
	// The upstream echoed the credential: it must not reach the sandbox.
	if strings.Contains(body, secret) || strings.Contains(resp.Header.Get("X-Echo"), secret) {
		t.Fatalf("credential echoed to the sandbox: %q %q", resp.Header.Get("X-Echo"), body)
	}
	if !strings.Contains(body, strings.Repeat("*", len(secret))) {
		t.Fatalf("no masked echo in %q", body)
	}
	// Outside the bound paths the request passes without a credential.
	get(t, c, "https://api.test/v2/models", nil)
	if a := up.last(t).Header.Get("Authorization"); a != "" {
		t.Fatalf("unbound path got Authorization %q", a)
	}
}

func TestUnboundHostIsTunnelledUntouched(t *testing.T) {
	r := newRig(t)
	r.cl.SetRules(rules(t, testVault))
	up := startUpstream(t, r.pubCA, "other.test")
	via := r.route("10.9.0.2:443", up, "other.test")
	// The sandbox must trust the upstream's own CA: the proxy does not
	// terminate this TLS.
	c := sandboxClient(via, pool(r.pubCA))
	resp, _ := get(t, c, "https://other.test/", http.Header{"Authorization": {"Bearer own"}})
	if iss := resp.TLS.PeerCertificates[0].Issuer.CommonName; iss != "moat sandbox CA public" {
		t.Fatalf("the client did not see the upstream's certificate: issuer %q", iss)
	}
	if a := up.last(t).Header.Get("Authorization"); a != "Bearer own" {
		t.Fatalf("tunnelled request changed: %q", a)
	}
	// A client trusting only the sandbox CA fails: nothing was forged.
	if _, err := sandboxClient(via, pool(r.sbCA)).Get("https://other.test/"); err == nil {
		t.Fatal("an unbound host was intercepted")
	}
}

// withheldLog records what a client reports through OnWithheld.
type withheldLog struct {
	mu  sync.Mutex
	got []Withheld
}

func recordWithheld(cl *Client) *withheldLog {
	l := &withheldLog{}
	cl.OnWithheld(func(_ context.Context, w Withheld) {
		l.mu.Lock()
		defer l.mu.Unlock()
		l.got = append(l.got, w)
	})
	return l
}

func (l *withheldLog) all() []Withheld {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]Withheld(nil), l.got...)
}

// wait returns the reports once there are at least n (they run on
// goroutines of their own), or what there is after a generous timeout.
func (l *withheldLog) wait(n int) []Withheld {
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		if got := l.all(); len(got) >= n || time.Now().After(deadline) {
			return got
		}
	}
}

func TestNoInjectionToAnAddressTheSandboxDidNotResolve(t *testing.T) {
	r := newRig(t)
	r.cl.SetRules(rules(t, testVault))
	reports := recordWithheld(r.cl)
	up := startUpstream(t, r.pubCA, "api.test")
	via := r.route("10.9.0.3:443", up) // api.test never resolved to 10.9.0.3
	c := sandboxClient(via, pool(r.sbCA))
	// The second request is within WithheldInterval: not reported again.
	for i := range 2 {
		if resp, body := get(t, c, "https://api.test/v1/x", nil); resp.StatusCode != 200 {
			t.Fatalf("%d. status %d %s", i, resp.StatusCode, body)
		}
		if a := up.last(t).Header.Get("Authorization"); a != "" {
			t.Fatalf("%d. credential sent to an unresolved address: %q", i, a)
		}
	}
	want := Withheld{Binding: "api", Host: "api.test", Dst: netip.MustParseAddr("10.9.0.3")}
	if got := reports.wait(1); len(got) != 1 || got[0] != want {
		t.Fatalf("withheld reports %+v, want one %+v", got, want)
	}
	// A resolved destination gets the credential and no report.
	via = r.route("10.9.0.4:443", up, "api.test")
	get(t, sandboxClient(via, pool(r.sbCA)), "https://api.test/v1/y", nil)
	if a := up.last(t).Header.Get("Authorization"); a != "Bearer "+secret {
		t.Fatalf("resolved destination: Authorization %q", a)
	}
	// Another binding's withheld credential is reported on its own; the
	// resolved request above added none.
	via = r.route("10.9.0.5:443", up)
	get(t, sandboxClient(via, pool(r.sbCA)), "https://q.test/z", nil)
	if got := reports.wait(2); len(got) != 2 || got[1].Binding != "q" {
		t.Fatalf("withheld reports %+v, want api then q", got)
	}
}

// A binding's match.trustedCidrs opts those destinations out of the
// resolved-address rule: an address the sandbox chose itself gets the
// credential when a trusted prefix holds it, and not otherwise.
func TestTrustedCIDRsGetTheCredentialUnresolved(t *testing.T) {
	r := newRig(t)
	r.cl.SetRules(rules(t, `{"credentials":[{"name":"t","source":{"value":"`+secret+`"}}],
	 "bindings":[{"name":"api","match":{"hosts":["api.test"],"trustedCidrs":["10.9.1.0/24"]},"auth":{"type":"bearer","credential":"t"}}]}`))
	reports := recordWithheld(r.cl)
	up := startUpstream(t, r.pubCA, "api.test")
	for i, c := range []struct {
		dst, want string
		reports   int // withheld reports so far
	}{
		{"10.9.1.7:443", "Bearer " + secret, 0}, // in the trusted prefix, never resolved
		{"10.9.2.7:443", "", 1},                 // outside it, never resolved
	} {
		via := r.route(c.dst, up)
		if resp, body := get(t, sandboxClient(via, pool(r.sbCA)), "https://api.test/x", nil); resp.StatusCode != 200 {
			t.Fatalf("%d. status %d %s", i, resp.StatusCode, body)
		}
		if a := up.last(t).Header.Get("Authorization"); a != c.want {
			t.Fatalf("%d. %s: Authorization %q, want %q", i, c.dst, a, c.want)
		}
		if got := reports.wait(c.reports); len(got) != c.reports || (c.reports > 0 && got[0].Dst.String()+":443" != c.dst) {
			t.Fatalf("%d. %s: withheld reports %+v, want %d (the last for %s)", i, c.dst, got, c.reports, c.dst)
		}
	}
}

func TestLiveRuleChangesApplyToTheNextRequest(t *testing.T) {
	r := newRig(t)
	r.cl.SetRules(rules(t, `{"credentials":[{"name":"t","source":{"value":"`+secret+`"}}],
	 "bindings":[{"name":"api","match":{"hosts":["api.test"]},"auth":{"type":"bearer","credential":"t"}}]}`))
	up := startUpstream(t, r.pubCA, "api.test")
	via := r.route("10.9.0.4:443", up, "api.test")
	c := sandboxClient(via, pool(r.sbCA))
	get(t, c, "https://api.test/a", nil)
	if a := up.last(t).Header.Get("Authorization"); a != "Bearer "+secret {
		t.Fatalf("before: %q", a)
	}
	// Replace the binding's auth (same kept-alive connection).
	r.cl.SetRules(rules(t, `{"credentials":[{"name":"t","source":{"value":"`+secret+`"}}],
	 "bindings":[{"name":"api","match":{"hosts":["api.test"]},"auth":{"type":"apiKey","name":"X-Api-Key","credential":"t"}}]}`))
	get(t, c, "https://api.test/b", nil)
	if h := up.last(t).Header; h.Get("X-Api-Key") != secret || h.Get("Authorization") != "" {
		t.Fatalf("after replace: %v", h)
	}
	// Delete every binding: nothing injected any more.
	r.cl.SetRules(rules(t, `{"credentials":[],"bindings":[]}`))
	get(t, c, "https://api.test/c", nil)
	if h := up.last(t).Header; h.Get("X-Api-Key") != "" || h.Get("Authorization") != "" {
		t.Fatalf("after delete: %v", h)
	}
}

func TestQueryKeyAndPlainHTTP(t *testing.T) {
	r := newRig(t)
	r.cl.SetRules(rules(t, testVault))
	upq := startUpstream(t, r.pubCA, "q.test")
	viaq := r.route("10.9.0.5:443", upq, "q.test")
	get(t, sandboxClient(viaq, pool(r.sbCA)), "https://q.test/geo?key=mine&z=1", nil)
	if q := upq.last(t).Query; !strings.Contains(q, "key=qk") || strings.Contains(q, "mine") || !strings.Contains(q, "z=1") {
		t.Fatalf("query %q", q)
	}

	uph := startUpstream(t, nil)
	viah := r.route("10.9.0.6:80", uph, "plain.test")
	c := sandboxClient(viah, nil)
	get(t, c, "http://plain.test/x", nil)
	if k := uph.last(t).Header.Get("X-Key"); k != "qk" {
		t.Fatalf("plain HTTP X-Key %q", k)
	}
	// An unbound Host on port 80 is tunnelled (the request arrives as sent).
	get(t, c, "http://elsewhere.test/y", nil)
	if got := uph.last(t); got.Header.Get("X-Key") != "" || got.Host != "elsewhere.test" {
		t.Fatalf("unbound plain HTTP: %+v", got)
	}
}

// An intercepted request whose answer starts while its body is still
// arriving (an upload that reports progress) goes through whole
// (web.ServeProxy).
func TestInterceptedFullDuplex(t *testing.T) {
	r := newRig(t)
	r.cl.SetRules(rules(t, testVault))
	up := &upstream{addr: webtest.DuplexBackend(t).Listener.Addr().String()}
	via := r.route("10.9.0.7:80", up, "plain.test")
	webtest.CheckDuplex(t, sandboxClient(via, nil), "http://plain.test/upload", nil)
}

func TestUntrustedUpstreamGets502(t *testing.T) {
	r := newRig(t)
	r.cl.SetRules(rules(t, testVault))
	rogue, _ := NewCA("rogue")
	up := startUpstream(t, rogue, "api.test")
	via := r.route("10.9.0.7:443", up, "api.test")
	resp, body := get(t, sandboxClient(via, pool(r.sbCA)), "https://api.test/v1/x", nil)
	if resp.StatusCode != http.StatusBadGateway || !strings.Contains(body, "not trusted for api.test") {
		t.Fatalf("status %d %q", resp.StatusCode, body)
	}
	up.mu.Lock()
	n := len(up.got)
	up.mu.Unlock()
	if n != 0 {
		t.Fatal("the untrusted upstream received a request")
	}
}

func TestHostHeaderMustMatchSNI(t *testing.T) {
	r := newRig(t)
	r.cl.SetRules(rules(t, testVault))
	up := startUpstream(t, r.pubCA, "q.test")
	via := r.route("10.9.0.8:443", up, "q.test", "api.test")
	// TLS to q.test (bound), then a request claiming Host api.test.
	c := sandboxClient(via, pool(r.sbCA))
	req, _ := http.NewRequest("GET", "https://q.test/v1/x", nil)
	req.Host = "api.test"
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if h := up.last(t).Header; h.Get("Authorization") != "" {
		t.Fatalf("credential injected for a Host that is not the SNI: %v", h)
	}
}

func TestScrubberStreams(t *testing.T) {
	secrets := []string{"abcdef", "xyz"}
	for i, chunks := range [][]string{
		{"hello abcdef world"},
		{"hello abc", "def world"},
		{"a", "b", "c", "d", "e", "f"},
		{"xy", "z!", "abcde", "fabcdef"},
		{"no secret here ab"}, // tail "ab" held back, then released at EOF
	} {
		want := mask([]byte(strings.Join(chunks, "")), secrets)
		src := &chunkReader{chunks: append([]string(nil), chunks...)}
		out, err := io.ReadAll(newScrubber(io.NopCloser(src), secrets))
		if err != nil {
			t.Fatal(err)
		}
		if string(out) != string(want) || strings.Contains(string(out), "abcdef") || strings.Contains(string(out), "xyz") {
			t.Errorf("%d: %q -> %q, want %q", i, chunks, out, want)
		}
	}
	// A chunk that cannot start a secret is released at once.
	src := &chunkReader{chunks: []string{"data: token\n\n", "more"}}
	s := newScrubber(io.NopCloser(src), secrets)
	buf := make([]byte, 100)
	n, _ := s.Read(buf)
	if string(buf[:n]) != "data: token\n\n" {
		t.Fatalf("first read %q", buf[:n])
	}
}

type chunkReader struct{ chunks []string }

func (c *chunkReader) Read(p []byte) (int, error) {
	if len(c.chunks) == 0 {
		return 0, io.EOF
	}
	n := copy(p, c.chunks[0])
	c.chunks[0] = c.chunks[0][n:]
	if c.chunks[0] == "" {
		c.chunks = c.chunks[1:]
	}
	return n, nil
}

func TestCALeafAndParse(t *testing.T) {
	ca, err := NewCA("sb1")
	if err != nil {
		t.Fatal(err)
	}
	key, err := ca.KeyDER()
	if err != nil {
		t.Fatal(err)
	}
	ca2, err := ParseCA(ca.CertPEM(), key)
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := ca2.Leaf("api.test")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := leaf.Leaf.Verify(x509.VerifyOptions{DNSName: "api.test", Roots: pool(ca)}); err != nil {
		t.Fatalf("a leaf of the parsed CA does not verify under the original: %v", err)
	}
	if again, _ := ca2.Leaf("api.test"); again != leaf {
		t.Fatal("leaf not cached")
	}
	other, _ := NewCA("sb2")
	okey, _ := other.KeyDER()
	if _, err := ParseCA(ca.CertPEM(), okey); err == nil {
		t.Fatal("a CA parsed with the wrong key")
	}
	for i := range maxLeaves + 10 {
		if _, err := ca.Leaf(fmt.Sprintf("h%d.test", i)); err != nil {
			t.Fatal(err)
		}
	}
	if n := len(ca.leaves); n > maxLeaves {
		t.Fatalf("leaf cache grew to %d", n)
	}
}

func TestHTTP2EndToEnd(t *testing.T) {
	r := newRig(t)
	r.cl.SetRules(rules(t, testVault))
	up := startUpstream(t, r.pubCA, "api.test")
	via := r.route("10.9.0.9:443", up, "api.test")
	c := sandboxClient(via, pool(r.sbCA))
	c.Transport.(*http.Transport).ForceAttemptHTTP2 = true
	resp, body := get(t, c, "https://api.test/v1/h2", nil)
	if resp.ProtoMajor != 2 || resp.StatusCode != 200 {
		t.Fatalf("sandbox side: HTTP/%d %d %s", resp.ProtoMajor, resp.StatusCode, body)
	}
	got := up.last(t)
	if got.Proto != 2 || got.Header.Get("Authorization") != "Bearer "+secret {
		t.Fatalf("upstream side: HTTP/%d %v", got.Proto, got.Header)
	}
	if strings.Contains(body, secret) {
		t.Fatalf("echo not scrubbed over HTTP/2: %q", body)
	}
	// An HTTP/1.1-only client still works.
	c1 := sandboxClient(via, pool(r.sbCA))
	if resp, _ := get(t, c1, "https://api.test/v1/h1", nil); resp.ProtoMajor != 1 {
		t.Fatalf("HTTP/1.1 client got HTTP/%d", resp.ProtoMajor)
	}
}

const substVault = `{"credentials":[{"name":"t","source":{"value":"` + secret + `"}}],
 "bindings":[
  {"name":"sub","match":{"hosts":["sub.test"]},"auth":{"type":"passthrough","substitutions":[
    {"credential":"t","placeholder":"{{T}}","in":["path","query","header","body"]}]}}
 ]}`

func TestSubstitutionsReachTheUpstreamOnly(t *testing.T) {
	r := newRig(t)
	r.cl.SetRules(rules(t, substVault))
	up := startUpstream(t, r.pubCA, "sub.test")
	via := r.route("10.9.0.30:443", up, "sub.test")
	c := sandboxClient(via, pool(r.sbCA))

	send := func(method, target, ct, body string, chunked bool) (*http.Response, string) {
		t.Helper()
		var rd io.Reader = strings.NewReader(body)
		if chunked {
			rd = io.MultiReader(rd) // hides the length: sent chunked
		}
		req, _ := http.NewRequest(method, target, rd)
		req.Header.Set("Content-Type", ct)
		req.Header.Set("X-Token", "Token {{T}}")
		resp, err := c.Do(req)
		if err != nil {
			t.Fatalf("%s %s: %v", method, target, err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp, string(b)
	}
	for _, chunked := range []bool{false, true} {
		resp, body := send("POST", "https://sub.test/u/{{T}}/x?k={{T}}", "application/json", `{"key":"{{T}}","n":1}`, chunked)
		if resp.StatusCode != 200 {
			t.Fatalf("status %d: %s", resp.StatusCode, body)
		}
		got := up.last(t)
		want := `{"key":"` + secret + `","n":1}`
		if got.Path != "/u/"+secret+"/x" || got.Query != "k="+secret || got.Header.Get("X-Token") != "Token "+secret ||
			got.Body != want || got.Length != int64(len(want)) {
			t.Fatalf("chunked=%v: upstream saw %+v", chunked, got)
		}
		// The upstream echoes the headers: the value never comes back.
		if strings.Contains(body, secret) {
			t.Fatalf("the value reached the sandbox: %s", body)
		}
	}
	// A body above the substitution limit passes unchanged.
	big := strings.Repeat("a", vault.MaxSubstitutionBody) + "{{T}}"
	if resp, _ := send("PUT", "https://sub.test/big", "text/plain", big, true); resp.StatusCode != 200 || up.last(t).Body != big {
		t.Fatalf("large body: status %d, upstream got %d bytes", resp.StatusCode, len(up.last(t).Body))
	}
	// A value that would change the path's segments refuses the request
	// before it leaves.
	r.cl.SetRules(rules(t, `{"credentials":[{"name":"t","source":{"value":"../admin"}}],"bindings":[{"name":"sub","match":{"hosts":["sub.test"]},
		"auth":{"type":"passthrough","substitutions":[{"credential":"t","placeholder":"{{T}}","in":["path"]}]}}]}`))
	n := len(up.got)
	resp, body := send("GET", "https://sub.test/files/{{T}}", "text/plain", "", false)
	if resp.StatusCode != http.StatusForbidden || !strings.Contains(body, "ambiguous") || strings.Contains(body, "../admin") {
		t.Fatalf("ambiguous path: %d %q", resp.StatusCode, body)
	}
	up.mu.Lock()
	defer up.mu.Unlock()
	if len(up.got) != n {
		t.Fatal("a refused request reached the upstream")
	}
}

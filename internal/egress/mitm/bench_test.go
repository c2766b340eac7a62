package mitm

import (
	"io"
	"net/http"
	"testing"
)

// BenchmarkProxy measures one GET on loopback: straight to the upstream,
// tunnelled through the proxy (unbound host), and intercepted with a
// credential injected (bound host) on a kept-alive connection and on a
// new connection per request (TLS handshake with the sandbox and the
// upstream; the leaf certificate comes from the cache).
func BenchmarkProxy(b *testing.B) {
	r := newRig(b)
	r.cl.SetRules(rules(b, testVault))
	up := startUpstream(b, r.pubCA, "api.test")
	bound := r.route("10.9.1.1:443", up, "api.test")
	unbound := r.route("10.9.1.2:443", up, "other.test")
	get := func(b *testing.B, c *http.Client, url string) {
		resp, err := c.Get(url)
		if err != nil {
			b.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			b.Fatalf("status %d", resp.StatusCode)
		}
	}
	run := func(name, via string, roots *CA, url string, keepAlive bool) {
		b.Run(name, func(b *testing.B) {
			c := sandboxClient(via, pool(roots))
			c.Transport.(*http.Transport).DisableKeepAlives = !keepAlive
			defer c.CloseIdleConnections()
			get(b, c, url) // warm: leaf cached, connection open
			b.ResetTimer()
			for range b.N {
				get(b, c, url)
			}
		})
	}
	run("direct", up.addr, r.pubCA, "https://api.test/v1/x", true)
	run("tunnel", unbound, r.pubCA, "https://other.test/v1/x", true)
	run("intercept", bound, r.sbCA, "https://api.test/v1/x", true)
	run("direct-newconn", up.addr, r.pubCA, "https://api.test/v1/x", false)
	run("tunnel-newconn", unbound, r.pubCA, "https://other.test/v1/x", false)
	run("intercept-newconn", bound, r.sbCA, "https://api.test/v1/x", false)
}

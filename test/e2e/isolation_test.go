package e2e

import (
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/moat-sandbox/moat/internal/egress/nettest"
)

// TestSandboxIsolation checks that sandboxes on one bridge cannot reach
// each other (IPv4 or IPv6, any port), while the host, the ingress
// gateway and the DNS proxy on the bridge still work.
func TestSandboxIsolation(t *testing.T) {
	srv := newServer(t)
	ref := startRegistry(t)
	gw := freePort(t)
	upstream, _ := nettest.ServeDNS(t, "", "127.0.0.1:0", map[string][]string{"peer.test.": {"peer.test. 60 IN A " + srv.net.Addr(2000).String()}})
	srv.start("--subnet6", srv.net.Subnet6.String(), "--ingress-listen", gw, "--dns-upstream", upstream)
	create := func(entry ...string) string {
		var c sandboxResp
		srv.mustJSON(202, "POST", "/v1/sandboxes", map[string]any{"image": map[string]any{"uri": ref},
			"entrypoint": entry, "timeout": 600}, &c)
		t.Cleanup(func() { srv.do("DELETE", "/v1/sandboxes/"+c.ID, nil) })
		return c.ID
	}
	b := create("httpd", "-f", "-p", "8080", "-h", "/workspace")
	a := create("tail", "-f", "/dev/null")
	if out, ok := shell(t, srv, b, "echo from-b > /workspace/index.html; ip -4 -o addr show dev eth0; ip -6 -o addr show dev eth0 scope global"); !ok {
		t.Fatalf("prepare B: %q", out)
	}
	var ep endpointResp
	srv.mustJSON(200, "GET", "/v1/sandboxes/"+b+"/endpoints/8080", nil, &ep)
	ipB := strings.TrimSuffix(ep.Endpoint, ":8080")
	ip6B := ""
	if out, _ := shell(t, srv, b, "ip -6 -o addr show dev eth0 scope global"); true {
		for _, f := range strings.Fields(out) {
			if strings.HasPrefix(f, "fd6d:") {
				ip6B, _, _ = strings.Cut(f, "/")
			}
		}
	}
	if ipB == "" || ip6B == "" {
		t.Fatalf("B addresses: %q %q", ipB, ip6B)
	}

	// The host reaches B directly and through the ingress gateway.
	get := func(url string, hdr map[string]string) (int, string) {
		code, body, err := getServed(http.DefaultClient, url, hdr)
		if err != nil {
			return 0, err.Error()
		}
		return code, body
	}
	if code, body := get("http://"+ipB+":8080/index.html", nil); code != 200 || body != "from-b" {
		t.Fatalf("host -> B: %d %q", code, body)
	}
	if code, body := get("http://"+gw+"/index.html", map[string]string{"OpenSandbox-Ingress-To": b + "-8080"}); code != 200 || body != "from-b" {
		t.Fatalf("ingress -> B: %d %q", code, body)
	}
	if code, body := get(fmt.Sprintf("http://[%s]:8080/index.html", ip6B), nil); code != 200 || body != "from-b" {
		t.Fatalf("host -> B over IPv6: %d %q", code, body)
	}
	// httpGet fetches /index.html with nc (busybox wget is not usable in
	// the static test image).
	httpGet := func(ip string) string {
		return fmt.Sprintf("printf 'GET /index.html HTTP/1.0\\r\\n\\r\\n' | nc -w 2 %s 8080", ip)
	}
	// B answers itself on its own addresses (the probes below can succeed).
	for _, ip := range []string{ipB, ip6B} {
		if out, ok := shell(t, srv, b, httpGet(ip)); !ok || !strings.Contains(out, "from-b") {
			t.Fatalf("B -> own address %s: ok=%v %q", ip, ok, out)
		}
	}

	// A cannot reach B: not on the service port, not on the agent port,
	// not over IPv6.
	for _, probe := range []string{
		httpGet(ipB),
		httpGet(ip6B),
		"nc -w 2 " + ipB + " 44772 </dev/null && echo connected",
	} {
		if out, ok := shell(t, srv, a, probe); ok || strings.Contains(out, "from-b") || strings.Contains(out, "connected") {
			t.Fatalf("sandbox A reached sandbox B: %s: ok=%v %q", probe, ok, out)
		}
	}
	// A still resolves through the DNS proxy on the gateway.
	if out, ok := shell(t, srv, a, "nslookup peer.test"); !ok || !strings.Contains(out, srv.net.Addr(2000).String()) {
		t.Fatalf("DNS proxy from a sandbox: ok=%v %q", ok, out)
	}
}

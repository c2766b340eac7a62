package e2e

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/moat-sandbox/moat/internal/egress/nettest"
)

// shell runs a command in a sandbox and returns its stdout and whether it
// exited 0.
func shell(t *testing.T, srv *server, id, cmd string) (string, bool) {
	t.Helper()
	base, hdr := srv.agent(id)
	evs := runCommand(t, base, hdr, cmd)
	ok := len(evs) > 0 && evs[len(evs)-1].Type == "execution_complete"
	return stdoutOf(evs), ok
}

// agent returns the base URL of sandbox id's execd and the headers to
// send it, from the endpoints API.
func (s *server) agent(id string) (string, map[string]string) {
	s.t.Helper()
	var ep endpointResp
	s.mustJSON(200, "GET", "/v1/sandboxes/"+id+"/endpoints/44772", nil, &ep)
	return "http://" + ep.Endpoint, ep.Headers
}

func TestEgressPolicyAndHostProtection(t *testing.T) {
	srv := newServer(t)
	ref := startRegistry(t)
	srv.start()
	out := outsideHost(t, srv.net, false).a
	probe := "nc -w 2 " + out + " 7000"

	create := func(np any) string { return srv.createIdle(ref, np) }
	allowed := create(map[string]any{"defaultAction": "deny", "egress": []map[string]string{{"action": "allow", "target": out + "/32"}}})
	denied := create(map[string]any{"defaultAction": "deny"})
	open := create(nil)

	if got, ok := shell(t, srv, allowed, probe); !ok || !strings.Contains(got, "moat-egress-test") {
		t.Fatalf("allowed CIDR: ok=%v %q", ok, got)
	}
	if got, _ := shell(t, srv, denied, probe); strings.Contains(got, "moat-egress-test") {
		t.Fatalf("deny-all sandbox reached the outside host: %q", got)
	}
	if got, ok := shell(t, srv, open, probe); !ok || !strings.Contains(got, "moat-egress-test") {
		t.Fatalf("sandbox without policy (NAT): ok=%v %q", ok, got)
	}

	// Host services are unreachable from sandboxes, policy or not.
	port := hostService(t, "tcp", "0.0.0.0:0", "host-service\n")
	if got, _ := shell(t, srv, open, fmt.Sprintf("nc -w 2 %s %d", srv.net.Addr(1), port)); strings.Contains(got, "host-service") {
		t.Fatal("a sandbox reached a host service through the bridge address")
	}

	// Live update through the egress API (what the SDKs call).
	var ep endpointResp
	srv.mustJSON(200, "GET", "/v1/sandboxes/"+denied+"/endpoints/18080", nil, &ep)
	tok := ep.Headers["OPENSANDBOX-EGRESS-AUTH"]
	if tok == "" || !strings.HasSuffix(ep.Endpoint, "/sandboxes/"+denied+"/proxy/18080") {
		t.Fatalf("egress endpoint %+v", ep)
	}
	patch := func(token string) (int, []byte) {
		b, _ := json.Marshal([]map[string]string{{"action": "allow", "target": out}})
		req, _ := http.NewRequest("PATCH", "http://"+ep.Endpoint+"/policy", bytes.NewReader(b))
		req.Header.Set("Content-Type", "application/json")
		if token != "" {
			req.Header.Set("OPENSANDBOX-EGRESS-AUTH", token)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, body
	}
	if code, _ := patch(""); code != 401 {
		t.Fatalf("egress PATCH without token: %d", code)
	}
	if code, body := patch(tok); code != 200 || !strings.Contains(string(body), `"enforcing"`) {
		t.Fatalf("egress PATCH: %d %s", code, body)
	}
	if got, ok := shell(t, srv, denied, probe); !ok || !strings.Contains(got, "moat-egress-test") {
		t.Fatalf("after live allow: ok=%v %q", ok, got)
	}
	// The change is recorded: it survives a restart.
	srv.kill9()
	srv.start()
	if got, ok := shell(t, srv, denied, probe); !ok || !strings.Contains(got, "moat-egress-test") {
		t.Fatalf("live allow lost across restart: ok=%v %q", ok, got)
	}
}

// TestEgressDomainsAndBypass drives the DNS half of egress from real
// sandboxes: the server's DNS proxy forwards to a fake resolver on loopback
// (--dns-upstream), and a second resolver plus a TCP listener on port 53
// run on the fake outside host.
func TestEgressDomainsAndBypass(t *testing.T) {
	srv := newServer(t)
	ref := startRegistry(t)
	o := outsideHost(t, srv.net, false)
	out, outNS := o.a, o.ns
	other := o.b // not named by any DNS answer: only reachable by direct IP
	records := map[string][]string{
		"allowed.test.": {"allowed.test. 60 IN A " + out},
		"denied.test.":  {"denied.test. 60 IN A " + out},
	}
	upstream, queries := nettest.ServeDNS(t, "", "127.0.0.1:0", records)
	nettest.ServeDNS(t, outNS, other+":53", records) // a resolver the sandbox must not use
	nettest.ServeTCP(t, outNS, out+":53")            // TCP 53 to an allowed address
	nettest.ServeTCP(t, outNS, other+":7000")
	srv.start("--dns-upstream", upstream)

	create := func(np any) string { return srv.createIdle(ref, np) }
	open := create(nil)
	sb := create(map[string]any{"defaultAction": "deny", "egress": []map[string]string{{"action": "allow", "target": "allowed.test"}}})

	// Baselines from the sandbox without a policy: each probe below can succeed.
	if got, ok := shell(t, srv, open, "nslookup denied.test"); !ok || !strings.Contains(got, out) {
		t.Fatalf("baseline: resolve via the proxy: ok=%v %q", ok, got)
	}
	if got, ok := shell(t, srv, open, "nslookup allowed.test "+other); !ok || !strings.Contains(got, out) {
		t.Fatalf("baseline: other resolver: ok=%v %q", ok, got)
	}
	if got, _ := shell(t, srv, open, "nc -w 2 "+other+" 7000"); !strings.Contains(got, nettest.Banner[:10]) {
		t.Fatalf("baseline: direct IP: %q", got)
	}

	// The policy: only allowed.test, resolved through moat's proxy.
	if got, ok := shell(t, srv, sb, "nc -w 2 allowed.test 7000"); !ok || !strings.Contains(got, nettest.Banner[:10]) {
		t.Fatalf("allowed domain: ok=%v %q", ok, got)
	}
	before := queries.Load()
	if got, ok := shell(t, srv, sb, "nslookup denied.test"); ok || strings.Contains(got, out) {
		t.Fatalf("denied domain resolved: ok=%v %q", ok, got)
	}
	if queries.Load() != before {
		t.Fatal("a denied name was forwarded upstream")
	}
	if got, ok := shell(t, srv, sb, "nslookup allowed.test "+other); ok || strings.Contains(got, "Address") && strings.Contains(got, out) {
		t.Fatalf("DNS to another resolver (udp) worked: %q", got)
	}
	if got, _ := shell(t, srv, sb, "nc -w 2 "+out+" 53"); strings.Contains(got, nettest.Banner[:10]) {
		t.Fatal("TCP 53 to an allowed address was not blocked")
	}
	if got, _ := shell(t, srv, sb, "nc -w 2 "+other+" 7000"); strings.Contains(got, nettest.Banner[:10]) {
		t.Fatal("direct connection to an unresolved address was not blocked")
	}
}

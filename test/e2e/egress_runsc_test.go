package e2e

import (
	"testing"

	"github.com/moat-sandbox/moat/internal/egress/nettest"
	"github.com/moat-sandbox/moat/internal/testutil"
)

// TestEgressRunsc checks the egress policy holds for gVisor sandboxes,
// whose netstack sends every frame through an AF_PACKET socket and so
// skips the netns output hook: the policy is enforced again on eth0's
// egress hook (IPv4 and IPv6, names through the DNS proxy).
func TestEgressRunsc(t *testing.T) {
	testutil.LookRuntime(t, "runsc")
	srv := newServer(t)
	ref := startRegistry(t)
	o := outsideHost(t, srv.net, true)
	out4, out6A, out6B := o.a, o.a6, o.b6
	upstream, _ := nettest.ServeDNS(t, "", "127.0.0.1:0", map[string][]string{"ok.test.": {"ok.test. 60 IN A " + out4}})
	srv.start("--subnet6", srv.net.Subnet6.String(), "--runtime-class", "runsc", "--dns-upstream", upstream)
	create := func(np any) string { return srv.createIdle(ref, np) }

	open := create(nil)
	for _, a := range []string{out4, out6B} {
		if got, ok := shell(t, srv, open, probeOutside(a)); !ok || !reachedOutside(got) {
			t.Fatalf("baseline: runsc sandbox without policy -> %s: ok=%v %q", a, ok, got)
		}
	}
	deny := create(map[string]any{"defaultAction": "deny"})
	for _, a := range []string{out4, out6B} {
		if got, _ := shell(t, srv, deny, probeOutside(a)); reachedOutside(got) {
			t.Fatalf("deny-all runsc sandbox reached %s: %q", a, got)
		}
	}
	allow := create(map[string]any{"defaultAction": "deny", "egress": []map[string]string{
		{"action": "allow", "target": "ok.test"}, {"action": "allow", "target": out6A}}})
	for _, a := range []string{"ok.test", out6A} {
		if got, ok := shell(t, srv, allow, probeOutside(a)); !ok || !reachedOutside(got) {
			t.Fatalf("runsc sandbox, allowed %s: ok=%v %q", a, ok, got)
		}
	}
	if got, _ := shell(t, srv, allow, probeOutside(out6B)); reachedOutside(got) {
		t.Fatalf("runsc sandbox reached a denied IPv6 address: %q", got)
	}

	// Without --subnet6 a runsc sandbox has no IPv6 path either.
	v4 := newServer(t)
	v4.start("--runtime-class", "runsc", "--dns-upstream", upstream)
	var c sandboxResp
	v4.mustJSON(202, "POST", "/v1/sandboxes", map[string]any{"image": map[string]any{"uri": ref},
		"entrypoint": []string{"tail", "-f", "/dev/null"}, "timeout": 600}, &c)
	if got, ok := shell(t, v4, c.ID, probeOutside(out4)); !ok || !reachedOutside(got) {
		t.Fatalf("baseline: IPv4-only runsc sandbox over IPv4: ok=%v %q", ok, got)
	}
	for _, a := range []string{out6A, out6B} {
		if got, _ := shell(t, v4, c.ID, probeOutside(a)); reachedOutside(got) {
			t.Fatalf("IPv4-only runsc sandbox reached %s over IPv6: %q", a, got)
		}
	}
}

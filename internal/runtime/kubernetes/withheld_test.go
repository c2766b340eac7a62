package kubernetes_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/netip"
	"strings"
	"testing"
	"time"

	sbv1 "github.com/moat-sandbox/moat/api/v1alpha1"
	moat "github.com/moat-sandbox/moat/client"
	"github.com/moat-sandbox/moat/internal/egress/mitm"
	"github.com/moat-sandbox/moat/internal/testutil/k8stest"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// TestCredentialWithheldFromPod: a credential the proxy in a pod's egress
// sidecar withholds (the stand-in sidecar reports it, as the proxy would)
// reaches the server as on the native runtime: one CredentialWithheld
// event of the sandbox (scope runtime, naming the binding, host and
// address) and one withheld record in its audit trail.
func TestCredentialWithheldFromPod(t *testing.T) {
	k8stest.Require(t, env)
	startController(t)
	ns := namespace(t)
	srv := startServer(t, ns, "withheld")
	ctx := context.Background()
	sb, err := srv.cl.CreateSandbox(ctx, moat.CreateRequest{
		Image: &moat.ImageSpec{URI: "busybox:test"}, Entrypoint: []string{"sleep", "infinity"},
		NetworkPolicy:   &moat.NetworkPolicy{DefaultAction: "deny", Egress: []moat.NetworkRule{{Action: "allow", Target: "api.vault.test"}}},
		CredentialProxy: &moat.CredentialProxy{Enabled: true},
	})
	if err != nil {
		t.Fatalf("create with the credential proxy: %v", err)
	}
	t.Cleanup(func() { srv.cl.DeleteSandbox(context.Background(), sb.ID) })
	var b sbv1.BatchSandbox
	if err := adminClient(t).Get(ctx, client.ObjectKey{Namespace: ns, Name: sb.ID}, &b); err != nil || len(b.Endpoints()) != 1 {
		t.Fatalf("sandbox %s: %v %v", sb.ID, err, b.Endpoints())
	}
	ip := b.Endpoints()[0]
	w := mitm.Withheld{Binding: "api", Host: "api.vault.test", Dst: netip.MustParseAddr("192.0.2.7")}
	waitFor(t, 10*time.Second, "the server's vault push", func() (bool, string) {
		return env.SidecarWithhold(ip, w), "the stand-in sidecar has no vault"
	})

	events := func() []string {
		t.Helper()
		resp, err := http.Get(srv.url + "/v1/sandboxes/" + sb.ID + "/diagnostics/events?scope=runtime")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var d struct {
			Content string `json:"content"`
		}
		if err := json.NewDecoder(resp.Body).Decode(&d); err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, line := range strings.Split(d.Content, "\n") {
			if strings.Contains(line, " CredentialWithheld ") {
				out = append(out, line)
			}
		}
		return out
	}
	waitFor(t, 10*time.Second, "the CredentialWithheld event", func() (bool, string) {
		return len(events()) > 0, "no event"
	})
	got := events()
	if len(got) != 1 {
		t.Fatalf("want one CredentialWithheld event, got %q", got)
	}
	for _, want := range []string{"runtime CredentialWithheld UnresolvedDestination", `binding "api"`, "api.vault.test at 192.0.2.7"} {
		if !strings.Contains(got[0], want) {
			t.Errorf("the event lacks %q: %s", want, got[0])
		}
	}
	page, err := srv.cl.Audit(ctx, sb.ID, moat.AuditOptions{Kinds: []string{"credential"}})
	if err != nil {
		t.Fatal(err)
	}
	var withheld int
	for _, r := range page.Items {
		if r.Credential != nil && !r.Credential.Injected && r.Credential.Binding == "api" && r.Credential.Host == "api.vault.test" {
			withheld++
		}
	}
	if withheld != 1 {
		t.Errorf("audit trail: %d withheld records for binding api, want 1 (%+v)", withheld, page.Items)
	}
}

package e2e

import (
	"os"
	"strings"
	"testing"

	"github.com/moat-sandbox/moat/internal/testutil"
)

// TestUpgradeFromPreviousRelease runs sandboxes under a server built from
// the previous release (testutil.PreviousRelease), upgrades to this build
// on the same state, and checks the sandboxes are re-adopted and work;
// then a downgrade to the previous release is refused with a message
// naming the upgrade, and leaves the sandboxes to the next start of this
// build.
func TestUpgradeFromPreviousRelease(t *testing.T) {
	prev := testutil.MoatBinaryAt(t, testutil.PreviousRelease)
	srv := newServer(t)
	// The previous release has no --cgroup-parent: both builds use the
	// default, so the new one finds the old sandboxes' cgroups.
	srv.cgroupParent = ""
	ref := startRegistry(t)
	cur := srv.bin

	srv.bin = prev
	srv.start()
	var ids []string
	for i := range 2 {
		var c sandboxResp
		srv.mustJSON(202, "POST", "/v1/sandboxes", map[string]any{"image": map[string]any{"uri": ref},
			"entrypoint": []string{"tail", "-f", "/dev/null"}, "metadata": map[string]string{"release": "previous"}}, &c)
		ids = append(ids, c.ID)
		if out, ok := shell(t, srv, c.ID, "echo kept-"+string(rune('a'+i))+" > /tmp/mark && cat /tmp/mark"); !ok || strings.TrimSpace(out) != "kept-"+string(rune('a'+i)) {
			t.Fatalf("previous release: exec in %s: ok=%v %q", c.ID, ok, out)
		}
	}
	srv.stop()

	// Upgrade: the sandboxes are re-adopted, keep their state and answer.
	srv.bin = cur
	srv.start()
	checkAdopted := func(stage string) {
		t.Helper()
		for i, id := range ids {
			var sb sandboxResp
			srv.mustJSON(200, "GET", "/v1/sandboxes/"+id, nil, &sb)
			if sb.Status.State != "Running" || sb.Metadata["release"] != "previous" {
				t.Fatalf("%s: sandbox %s is %s (%s), metadata %v", stage, id, sb.Status.State, sb.Status.Message, sb.Metadata)
			}
			if out, ok := shell(t, srv, id, "cat /tmp/mark"); !ok || strings.TrimSpace(out) != "kept-"+string(rune('a'+i)) {
				t.Fatalf("%s: exec in %s: ok=%v %q", stage, id, ok, out)
			}
		}
	}
	checkAdopted("after the upgrade")
	var fresh sandboxResp
	srv.mustJSON(202, "POST", "/v1/sandboxes", map[string]any{"image": map[string]any{"uri": ref},
		"entrypoint": []string{"tail", "-f", "/dev/null"}}, &fresh)
	ids = append(ids, fresh.ID)
	srv.stop()
	ids = ids[:2]

	// Downgrade: the previous release must refuse the upgraded state
	// before its recovery could delete what it does not understand.
	srv.bin = prev
	logBefore, _ := os.ReadFile(srv.logf.Name())
	if err := srv.tryStart(); err == nil {
		srv.stop()
		t.Fatal("the previous release started on the upgraded state")
	}
	logAll, _ := os.ReadFile(srv.logf.Name())
	refusal := string(logAll[len(logBefore):])
	if !strings.Contains(refusal, "written by a newer moat server") || !strings.Contains(refusal, "run the newer moat") {
		t.Fatalf("the previous release's refusal does not say why:\n%s", refusal)
	}
	t.Logf("the previous release refuses the upgraded state: %s", strings.TrimSpace(tail(refusal, 400)))

	// The refused downgrade left the sandboxes alone.
	srv.bin = cur
	srv.start()
	checkAdopted("after the refused downgrade")
	var sb sandboxResp
	srv.mustJSON(200, "GET", "/v1/sandboxes/"+fresh.ID, nil, &sb)
	if sb.Status.State != "Running" {
		t.Fatalf("the sandbox created after the upgrade is %s after the refused downgrade", sb.Status.State)
	}
}

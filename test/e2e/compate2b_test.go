package e2e

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/moat-sandbox/moat/internal/tenant"
	"github.com/moat-sandbox/moat/internal/testutil"
)

// TestCompatE2BSDK runs test/compat/e2b (node:test): E2B's official
// JavaScript SDK, pinned and unchanged, against a real `moat serve` in
// the SDK's explicit-URL mode (control plane and envd on the API port,
// envd reached through moat's edge), with a tenant's key in E2B's form
// and a template over the debian-kernels test image.
func TestCompatE2BSDK(t *testing.T) {
	node := lookNode(t)
	dir := filepath.Join(testutil.RepoRoot(t), "test", "compat", "e2b")
	npmCI(t, dir)
	srv := newServer(t)
	ref := importKernelsImage(t, srv)
	srv.start()

	var k struct{ Key string }
	srv.mustJSON(201, "POST", "/v1/keys", map[string]string{"tenant": "e2b-sdk", "role": "operator", "name": "e2b suite"}, &k)
	// The template is the tenant's: made with the tenant's own key.
	tmpl := map[string]any{"id": "e2b-suite", "image": ref, "user": "root", "workdir": "/root"}
	if code, out, _ := srv.do("POST", "/v1/templates", tmpl, "OPEN-SANDBOX-API-KEY", k.Key); code != 201 {
		t.Fatalf("create template: %d %s", code, out)
	}

	cmd := exec.Command(node, "--test", "--test-concurrency=1", "--test-reporter=spec", "sdk.test.mjs")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(),
		"MOAT_URL=http://"+srv.addr,
		"MOAT_E2B_KEY="+tenant.E2BKey(k.Key),
		"MOAT_E2B_TEMPLATE=e2b-suite",
		"NO_COLOR=1",
	)
	done := make(chan struct{})
	var out []byte
	var err error
	go func() { out, err = cmd.CombinedOutput(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Minute):
		cmd.Process.Kill()
		<-done
		t.Fatalf("node --test did not finish in 10 minutes:\n%s", out)
	}
	if err != nil {
		t.Fatalf("node --test failed: %v\n%s", err, out)
	}
	t.Logf("%s", out)
	// The suite killed what it made: nothing is left in the tenant.
	var list struct{ Items []struct{ ID string } }
	code, body, _ := srv.do("GET", "/v1/sandboxes", nil, "OPEN-SANDBOX-API-KEY", k.Key)
	if code != 200 || json.Unmarshal(body, &list) != nil || len(list.Items) != 0 {
		t.Fatalf("sandboxes left after the suite: %d %s", code, body)
	}
}

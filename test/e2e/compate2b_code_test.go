package e2e

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/moat-sandbox/moat/internal/testutil"
)

// importE2BImages imports the test images of E2B's built-in templates
// (scripts/build-test-images.sh: e2b-base, and the code-interpreter image,
// which is debian-kernels) into srv's store under the names the templates
// `base` and `code-interpreter-v1` use, before srv starts.
func importE2BImages(t *testing.T, srv *server) {
	t.Helper()
	script := filepath.Join(testutil.RepoRoot(t), "scripts", "build-test-images.sh")
	for image, ref := range map[string]string{
		"e2b-base":             "moat-e2b-base:latest",
		"e2b-code-interpreter": "moat-e2b-code-interpreter:latest",
	} {
		out, err := exec.Command("bash", script, image).Output()
		if err != nil {
			t.Fatalf("build test image %s: %v (run make deps-images)", image, err)
		}
		if b, err := exec.Command(srv.bin, "image", "import", "--root", srv.root, ref, strings.TrimSpace(string(out))).CombinedOutput(); err != nil {
			t.Fatalf("import %s: %v\n%s", ref, err, b)
		}
	}
}

// TestCompatE2BCodeInterpreter runs test/compat/e2b/codeinterpreter.test.mjs:
// E2B's official code-interpreter SDK (@e2b/code-interpreter, pinned,
// unchanged) against a real `moat serve` in the SDK's domain mode (as
// TestCompatE2BSDK: TLS, HTTP/2, 49999-<id>.<domain>), on the built-in
// templates `base` and `code-interpreter-v1` over the test images: runCode
// in every language the image has, contexts, streaming callbacks, and bad
// input. The suite kills what it makes.
func TestCompatE2BCodeInterpreter(t *testing.T) {
	e := startE2BWith(t, func(srv *server) { importE2BImages(t, srv) })
	out := e.node(t, 15*time.Minute, "--test", "--test-concurrency=1", "--test-reporter=spec", "codeinterpreter.test.mjs")
	if pass, fail := summary(string(out), "pass"), summary(string(out), "fail"); fail != 0 || pass < 5 {
		t.Fatalf("node --test: %d passed, %d failed:\n%s", pass, fail, out)
	}
	t.Logf("%s", tail(string(out), 4000))
	if os.Getenv("MOAT_E2B_BENCH") != "" {
		// The runCode round trip (docs/BENCHMARKS.md), on request only.
		t.Logf("runCode round trip:\n%s", e.node(t, 10*time.Minute, "runcode.bench.mjs"))
	}
	var list struct{ Items []struct{ ID string } }
	code, body, _ := e.srv.do("GET", "/v1/sandboxes", nil, "OPEN-SANDBOX-API-KEY", e.key)
	if code != 200 || json.Unmarshal(body, &list) != nil || len(list.Items) != 0 {
		t.Fatalf("sandboxes left after the suite: %d %s", code, body)
	}
}

package e2e

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/moat-sandbox/moat/internal/testutil"
)

// importKernelsImage imports the debian-kernels test image (built and
// cached by scripts/build-test-images.sh: bash, python3, node, the Jupyter
// kernels) into srv's store, before srv starts, and returns its name.
func importKernelsImage(t *testing.T, srv *server) string {
	t.Helper()
	script := filepath.Join(testutil.RepoRoot(t), "scripts", "build-test-images.sh")
	out, err := exec.Command("bash", script, "debian-kernels").Output()
	if err != nil {
		t.Fatalf("build test image: %v (run scripts/build-test-images.sh debian-kernels)", err)
	}
	const ref = "localhost/debian-kernels:compat"
	if b, err := exec.Command(srv.bin, "image", "import", "--root", srv.root, ref, strings.TrimSpace(string(out))).CombinedOutput(); err != nil {
		t.Fatalf("import: %v\n%s", err, b)
	}
	return ref
}

// TestCompatJSCodeContexts runs test/compat/js/kernels/codecontexts.test.mjs
// (in its own directory: TestCompatJSSDK runs every suite file next to
// compat.test.mjs, on a busybox image): the
// official OpenSandbox JavaScript SDK (pinned, unchanged) driving code
// contexts in Java, TypeScript, R and JavaScript in a sandbox of the
// debian-kernels test image (scripts/build-test-images.sh) through a real
// `moat serve` (issue 16).
func TestCompatJSCodeContexts(t *testing.T) {
	node, err := exec.LookPath("node")
	if err != nil {
		t.Skip("node is not installed (scripts/install-deps.sh installs it)")
	}
	dir := filepath.Join(testutil.RepoRoot(t), "test", "compat", "js")
	npmCI(t, dir)
	srv := newServer(t)
	ref := importKernelsImage(t, srv)
	srv.start()

	cmd := exec.Command(node, "--test", "--test-concurrency=1", "--test-reporter=spec", filepath.Join("kernels", "codecontexts.test.mjs"))
	cmd.Dir = dir
	cmd.Env = append(os.Environ(),
		"MOAT_URL=http://"+srv.addr,
		"MOAT_API_KEY="+srv.key,
		"MOAT_CODE_IMAGE="+ref,
		"NO_COLOR=1",
	)
	done := make(chan struct{})
	var nodeOut []byte
	go func() { nodeOut, err = cmd.CombinedOutput(); close(done) }()
	select {
	case <-done:
	case <-time.After(15 * time.Minute):
		cmd.Process.Kill()
		<-done
		t.Fatalf("node --test did not finish in 15 minutes:\n%s", nodeOut)
	}
	if err != nil {
		t.Fatalf("node --test failed: %v\n%s", err, nodeOut)
	}
	pass, fail := summary(string(nodeOut), "pass"), summary(string(nodeOut), "fail")
	if fail != 0 || pass < 6 {
		t.Fatalf("node --test: %d passed, %d failed:\n%s", pass, fail, nodeOut)
	}
	t.Logf("node --test:\n%s", tail(string(nodeOut), 4000))
}

package e2e

import (
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/moat-sandbox/moat/internal/testutil"
)

// chromiumPath is Debian's chromium (scripts/install-deps.sh --browser);
// the test never downloads a browser.
const chromiumPath = "/usr/bin/chromium"

// TestConsoleBrowser drives the web console in a real browser (Debian's
// chromium through playwright-core, web/console/test/console.test.mjs)
// against a real `moat serve` with the native runtime: sign-in, create,
// terminal, files, live list, pools, snapshots and fork, keys and tenants,
// a viewer that cannot mutate, two tenants that never see each other, and
// sandbox content on the console's origin that cannot use the session.
// With MOAT_CONSOLE_SCREENSHOTS=<dir> (make screenshots) it writes a
// screenshot of each page there (docs/console).
func TestConsoleBrowser(t *testing.T) {
	node, err := exec.LookPath("node")
	if err != nil {
		t.Skip("node is not installed (scripts/install-deps.sh installs it)")
	}
	if _, err := os.Stat(chromiumPath); err != nil {
		if os.Getenv("MOAT_REQUIRE_BROWSER") != "" {
			t.Fatalf("%s: %v (make deps-browser installs Debian's chromium)", chromiumPath, err)
		}
		t.Skip("chromium is not installed (make deps-browser)")
	}
	root := testutil.RepoRoot(t)
	dir := filepath.Join(root, "web", "console")
	npmCI(t, dir)
	if os.Getenv("MOAT_BIN") == "" {
		// The binary this test builds embeds what is in
		// internal/console/dist/app: bring it up to date first.
		cmd := exec.Command("bash", filepath.Join(root, "scripts", "build-console.sh"))
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("build-console.sh: %v\n%s", err, out)
		}
	}

	srv := newServer(t)
	ref := startRegistry(t)
	srv.start()

	// The binary under test must carry the app, not the not-built page.
	resp, err := http.Get("http://" + srv.addr + "/console/")
	if err != nil {
		t.Fatal(err)
	}
	page, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !strings.Contains(string(page), `<script type="module"`) {
		t.Fatalf("GET /console/: %d %s (was the binary built with make build?)", resp.StatusCode, page)
	}

	shots := os.Getenv("MOAT_CONSOLE_SCREENSHOTS")
	if shots == "" {
		shots = t.TempDir()
	}
	cmd := exec.Command(node, "--test", "--test-concurrency=1", "--test-reporter=spec", "test/console.test.mjs")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(),
		"MOAT_URL=http://"+srv.addr,
		"MOAT_API_KEY="+srv.key,
		"MOAT_IMAGE="+ref,
		"MOAT_SHOTS="+shots,
		"CHROMIUM="+chromiumPath,
		"NO_COLOR=1",
	)
	done := make(chan struct{})
	var out []byte
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
	pass, fail := summary(string(out), "pass"), summary(string(out), "fail")
	if fail != 0 || pass < 10 {
		t.Fatalf("node --test: %d passed, %d failed:\n%s", pass, fail, out)
	}
	t.Logf("node --test:\n%s", tail(string(out), 6000))
}

package e2e

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"testing"
	"time"

	"github.com/moat-sandbox/moat/internal/testutil"
)

// TestCompatJSSDK runs test/compat/js (node:test) against a real `moat
// serve`: the official OpenSandbox JavaScript SDK, pinned in its
// package.json, driving the server unchanged (issue #8).
func TestCompatJSSDK(t *testing.T) {
	node := lookNode(t)
	dir := filepath.Join(testutil.RepoRoot(t), "test", "compat", "js")
	npmCI(t, dir)

	srv := newServer(t)
	ref := startRegistry(t)
	srv.start()
	runCompatJS(t, node, dir, srv, ref)
}

// TestCompatJSSDKKubernetes runs the same suite against `moat serve
// --runtime kubernetes` on a real single-node cluster (issue #18): every
// sandbox is a pod running moat's agent, and egress policies are enforced
// by its egress sidecar, which also runs the Credential Vault's proxy,
// and pause is moat node's freeze. What the kubernetes runtime refuses
// (snapshots) must be refused as such: 501
// SANDBOX::API_NOT_SUPPORTED, the sandbox untouched, nothing created
// (MOAT_UNSUPPORTED).
func TestCompatJSSDKKubernetes(t *testing.T) {
	node := lookNode(t)
	dir := filepath.Join(testutil.RepoRoot(t), "test", "compat", "js")
	npmCI(t, dir)

	k := startKubeStack(t)
	srv := newServer(t)
	srv.start(k.serverArgs()...)
	runCompatJS(t, node, dir, srv, k.ref, "MOAT_UNSUPPORTED=snapshots")
}

func lookNode(t *testing.T) string {
	t.Helper()
	node, err := exec.LookPath("node")
	if err != nil {
		t.Skip("node is not installed (scripts/install-deps.sh installs it)")
	}
	return node
}

// runCompatJS runs every suite file of dir against srv with image ref.
func runCompatJS(t *testing.T, node, dir string, srv *server, ref string, env ...string) {
	t.Helper()
	// The suite runs with an operator key of a tenant, not the server's
	// own key: the SDK needs no change for tenants, keys and roles (its
	// server-proxy mode sends the key as the agent token, for instance).
	var k struct{ Key string }
	srv.mustJSON(201, "POST", "/v1/keys", map[string]string{"tenant": "js-sdk", "role": "operator", "name": "compat suite"}, &k)

	// Every suite file of the directory (compat.test.mjs and the feature
	// files next to it, e.g. volumes.test.mjs), one after the other.
	files, err := filepath.Glob(filepath.Join(dir, "*.test.mjs"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no *.test.mjs in %s (%v)", dir, err)
	}
	args := []string{"--test", "--test-concurrency=1", "--test-reporter=spec"}
	for _, f := range files {
		args = append(args, filepath.Base(f))
	}
	cmd := exec.Command(node, args...)
	cmd.Dir = dir
	cmd.Env = append(append(os.Environ(),
		"MOAT_URL=http://"+srv.addr,
		"MOAT_API_KEY="+k.Key,
		"MOAT_IMAGE="+ref,
		"NO_COLOR=1",
	), env...)
	done := make(chan struct{})
	var out []byte
	go func() { out, err = cmd.CombinedOutput(); close(done) }()
	select {
	case <-done:
	case <-time.After(15 * time.Minute):
		cmd.Process.Kill()
		<-done
		t.Fatalf("node --test did not finish in 15 minutes:\n%s", out)
	}
	if err != nil {
		t.Fatalf("node --test failed: %v\n%s", err, out)
	}
	// The spec reporter closes with "ℹ pass N" / "ℹ fail N".
	pass, fail := summary(string(out), "pass"), summary(string(out), "fail")
	if fail != 0 || pass < 1 {
		t.Fatalf("node --test: %d passed, %d failed:\n%s", pass, fail, out)
	}
	if skipped := summary(string(out), "skipped"); skipped > 0 {
		t.Fatalf("node --test: %d skipped (no skipped test counts):\n%s", skipped, out)
	}
	t.Logf("node --test:\n%s", tail(string(out), 4000))
}

// summary returns N from the reporter's closing "ℹ <what> N" line, or -1.
func summary(out, what string) int {
	m := regexp.MustCompile(`(?m)^\s*ℹ ` + what + ` (\d+)\s*$`).FindStringSubmatch(out)
	if m == nil {
		return -1
	}
	n, _ := strconv.Atoi(m[1])
	return n
}

// npmCI installs the locked node_modules unless they are already there at
// the locked versions, so repeated runs reuse them.
func npmCI(t *testing.T, dir string) {
	t.Helper()
	if lockedModulesPresent(dir) {
		return
	}
	npm, err := exec.LookPath("npm")
	if err != nil {
		t.Fatal("node is installed but npm is not (scripts/install-deps.sh installs both)")
	}
	cmd := exec.Command(npm, "ci", "--no-audit", "--no-fund", "--loglevel=error")
	cmd.Dir = dir
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("npm ci in %s: %v\n%s", dir, err, out)
	}
	if !lockedModulesPresent(dir) {
		t.Fatal("npm ci did not install the locked packages")
	}
}

// lockedModulesPresent reports whether every package in package-lock.json
// is installed under node_modules at its locked version. Optional packages
// may be absent (npm skips those of other platforms, such as the native
// bindings of a bundler).
func lockedModulesPresent(dir string) bool {
	b, err := os.ReadFile(filepath.Join(dir, "package-lock.json"))
	if err != nil {
		return false
	}
	var lock struct {
		Packages map[string]struct {
			Version  string
			Optional bool
		} `json:"packages"`
	}
	if json.Unmarshal(b, &lock) != nil || len(lock.Packages) < 2 {
		return false
	}
	for path, p := range lock.Packages {
		if path == "" {
			continue
		}
		pb, err := os.ReadFile(filepath.Join(dir, path, "package.json"))
		if err != nil {
			if p.Optional && os.IsNotExist(err) {
				continue
			}
			return false
		}
		var got struct{ Version string }
		if json.Unmarshal(pb, &got) != nil || got.Version != p.Version {
			return false
		}
	}
	return true
}

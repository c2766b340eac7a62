package e2e

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/moat-sandbox/moat/internal/testutil"
)

// TestCompatGoSDK runs test/compat/go against a real `moat serve`: the
// official OpenSandbox Go SDK (its own module, so the SDK stays out of
// moat's go.mod), with its client-side sandbox pool, the list filter and
// the renew the pool makes.
func TestCompatGoSDK(t *testing.T) {
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Skip("go is not on PATH")
	}
	dir := filepath.Join(testutil.RepoRoot(t), "test", "compat", "go")
	srv := newServer(t)
	ref := startRegistry(t)
	srv.start()
	var k struct{ Key string }
	srv.mustJSON(201, "POST", "/v1/keys", map[string]string{"tenant": "go-sdk", "role": "operator", "name": "compat suite"}, &k)

	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, goBin, "test", "-count=1", "-v", "./...")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(),
		"MOAT_URL=http://"+srv.addr,
		"MOAT_API_KEY="+k.Key,
		"MOAT_IMAGE="+ref,
		"GOFLAGS=-mod=readonly",
	)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("go test in test/compat/go: %v\n%s", err, out)
	}
	if strings.Contains(string(out), "--- SKIP") || !strings.Contains(string(out), "--- PASS") {
		t.Fatalf("go test in test/compat/go ran no test or skipped one:\n%s", out)
	}
	t.Logf("go test:\n%s", tail(string(out), 4000))
}

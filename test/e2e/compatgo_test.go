package e2e

import (
	"context"
	"net"
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
	redisAddr := startRedis(t)
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
		"MOAT_REDIS_ADDR="+redisAddr,
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

// startRedis runs Debian's redis-server on a free loopback port, without
// persistence, for the SDK pool's Redis state store, and returns its
// address. It is stopped when the test ends.
func startRedis(t *testing.T) string {
	t.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		t.Fatal("redis-server is not installed (scripts/install-deps.sh installs it)")
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	_, port, _ := net.SplitHostPort(addr)
	l.Close()
	cmd := exec.Command(bin, "--bind", "127.0.0.1", "--port", port, "--save", "", "--appendonly", "no", "--dir", t.TempDir())
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	for deadline := time.Now().Add(30 * time.Second); ; {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			c.Write([]byte("PING\r\n"))
			buf := make([]byte, 16)
			c.SetReadDeadline(time.Now().Add(time.Second))
			n, _ := c.Read(buf)
			c.Close()
			if strings.HasPrefix(string(buf[:n]), "+PONG") {
				return addr
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("redis-server on %s did not answer PING", addr)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// Package testutil holds helpers shared by moat's tests: root gating,
// locally built test images, and a once-per-process build of the moat binary.
package testutil

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sync"
	"testing"

	"github.com/moat-sandbox/moat/internal/rootfs"
)

// RequiresRoot skips t unless the test runs as root. Under CI (CI=true) it
// fails instead, so a root-only test can never be silently skipped there.
func RequiresRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() == 0 {
		return
	}
	if os.Getenv("CI") == "true" {
		t.Fatal("test requires root, and CI must run as root")
	}
	t.Skip("requires root")
}

// RequireBinary fails t (it does not skip) if name is not on PATH: the test
// set-up script installs every tool the tests need.
func RequireBinary(t testing.TB, name string) string {
	t.Helper()
	p, err := exec.LookPath(name)
	if err != nil {
		t.Fatalf("%s not installed (run `make deps`): %v", name, err)
	}
	return p
}

// CacheDir is where heavy test fixtures are cached between runs
// ($MOAT_TEST_CACHE, default /var/cache/moat-test).
func CacheDir() string {
	if d := os.Getenv("MOAT_TEST_CACHE"); d != "" {
		return d
	}
	return "/var/cache/moat-test"
}

// RepoRoot returns the module root (the directory holding go.mod).
func RepoRoot(t testing.TB) string {
	t.Helper()
	_, file, _, ok := runtime.Caller(0)
	if !ok {
		t.Fatal("runtime.Caller failed")
	}
	return filepath.Clean(filepath.Join(filepath.Dir(file), "..", ".."))
}

var (
	buildOnce sync.Once
	buildPath string
	buildErr  error
)

// MoatBinary builds the static moat binary once per test process and
// returns its path. Set MOAT_BIN to use a prebuilt one.
func MoatBinary(t testing.TB) string {
	t.Helper()
	if p := os.Getenv("MOAT_BIN"); p != "" {
		return p
	}
	buildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "moat-bin-")
		if err != nil {
			buildErr = err
			return
		}
		buildPath = filepath.Join(dir, "moat")
		cmd := exec.Command("go", "build", "-o", buildPath, "./cmd/moat")
		cmd.Dir = RepoRoot(t)
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		out, err := cmd.CombinedOutput()
		if err != nil {
			buildErr = fmt.Errorf("go build ./cmd/moat: %v\n%s", err, out)
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return buildPath
}

// BusyboxRootfs returns a rootfs directory built from the host's
// busybox-static (see package rootfs). It is built once and cached under
// CacheDir(); callers must not modify it.
func BusyboxRootfs(t testing.TB) string {
	t.Helper()
	version, err := rootfs.BusyboxVersion()
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(CacheDir(), "rootfs", "busybox-"+version)
	if _, err := os.Stat(filepath.Join(dir, "bin", "busybox")); err == nil {
		return dir
	}
	if err := os.MkdirAll(filepath.Dir(dir), 0o755); err != nil {
		t.Fatal(err)
	}
	tmp := fmt.Sprintf("%s.tmp%d", dir, os.Getpid())
	os.RemoveAll(tmp)
	if err := rootfs.Busybox(tmp); err != nil {
		os.RemoveAll(tmp)
		t.Fatalf("build busybox rootfs: %v", err)
	}
	if err := os.Rename(tmp, dir); err != nil {
		os.RemoveAll(tmp)
		if _, serr := os.Stat(filepath.Join(dir, "bin", "busybox")); serr == nil {
			return dir // another test process won the race
		}
		t.Fatal(err)
	}
	return dir
}

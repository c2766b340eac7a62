// Package testutil holds helpers shared by moat's tests: root gating,
// locally built test images, and a once-per-process build of the moat binary.
package testutil

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
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

// BusyboxRootfs returns a read-only-by-convention rootfs directory built from
// the host's busybox-static (Debian package busybox-static): /bin/busybox with
// its applet links, /etc/passwd and /etc/group, and the usual empty dirs. It
// is built once and cached under CacheDir(); callers must not modify it.
func BusyboxRootfs(t testing.TB) string {
	t.Helper()
	bb := "/bin/busybox"
	if _, err := os.Stat(bb); err != nil {
		t.Fatalf("busybox-static not installed: %v", err)
	}
	out, err := exec.Command(bb).CombinedOutput()
	if err != nil && len(out) == 0 {
		t.Fatalf("busybox: %v", err)
	}
	version := strings.Fields(strings.SplitN(string(out), "\n", 2)[0])
	tag := "unknown"
	if len(version) > 1 {
		tag = strings.TrimPrefix(version[1], "v")
	}
	dir := filepath.Join(CacheDir(), "rootfs", "busybox-"+tag)
	if _, err := os.Stat(filepath.Join(dir, ".complete")); err == nil {
		return dir
	}
	tmp := dir + fmt.Sprintf(".tmp%d", os.Getpid())
	os.RemoveAll(tmp)
	if err := buildBusybox(bb, tmp); err != nil {
		os.RemoveAll(tmp)
		t.Fatalf("build busybox rootfs: %v", err)
	}
	if err := os.MkdirAll(filepath.Dir(dir), 0o755); err != nil {
		t.Fatal(err)
	}
	os.RemoveAll(dir)
	if err := os.Rename(tmp, dir); err != nil {
		if _, serr := os.Stat(filepath.Join(dir, ".complete")); serr == nil {
			os.RemoveAll(tmp) // lost a race with another test process
			return dir
		}
		t.Fatal(err)
	}
	return dir
}

func buildBusybox(bb, root string) error {
	for _, d := range []string{"bin", "sbin", "usr/bin", "usr/sbin", "etc", "tmp", "root", "home", "proc", "sys", "dev", "run", "var/tmp", "workspace"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			return err
		}
	}
	os.Chmod(filepath.Join(root, "tmp"), 0o1777)
	os.Chmod(filepath.Join(root, "var/tmp"), 0o1777)
	data, err := os.ReadFile(bb)
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(root, "bin/busybox"), data, 0o755); err != nil {
		return err
	}
	list, err := exec.Command(bb, "--list-full").Output()
	if err != nil {
		return fmt.Errorf("busybox --list-full: %w", err)
	}
	for _, app := range strings.Fields(string(list)) {
		if app == "bin/busybox" {
			continue
		}
		target := filepath.Join(root, app)
		if err := os.MkdirAll(filepath.Dir(target), 0o755); err != nil {
			return err
		}
		rel, _ := filepath.Rel(filepath.Dir(target), filepath.Join(root, "bin/busybox"))
		if err := os.Symlink(rel, target); err != nil && !os.IsExist(err) {
			return err
		}
	}
	files := map[string]string{
		"etc/passwd":      "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\nuser:x:1000:1000:user:/home/user:/bin/sh\n",
		"etc/group":       "root:x:0:\nnogroup:x:65534:\nuser:x:1000:\n",
		"etc/hostname":    "sandbox\n",
		"etc/hosts":       "127.0.0.1 localhost\n",
		"etc/resolv.conf": "",
	}
	for name, content := range files {
		if err := os.WriteFile(filepath.Join(root, name), []byte(content), 0o644); err != nil {
			return err
		}
	}
	os.MkdirAll(filepath.Join(root, "home/user"), 0o755)
	os.Chown(filepath.Join(root, "home/user"), 1000, 1000)
	return os.WriteFile(filepath.Join(root, ".complete"), nil, 0o644)
}

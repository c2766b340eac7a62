// Package testutil holds helpers shared by moat's tests: root gating,
// locally built test images, and a once-per-process build of the moat binary.
package testutil

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"

	"github.com/moat-sandbox/moat/internal/atomicfile"
	"github.com/moat-sandbox/moat/internal/testutil/rootfs"
)

// RequiresRoot skips t unless the test runs as root. Under CI (CI=true) it
// fails instead, so a root-only test can never be silently skipped there.
// With -short (make test-short: unit tests only) it always skips: every
// root test drives real runtimes, namespaces or mounts.
func RequiresRoot(t testing.TB) {
	t.Helper()
	if testing.Short() {
		t.Skip("needs root and real components; skipped with -short")
	}
	if os.Geteuid() == 0 {
		return
	}
	if os.Getenv("CI") == "true" {
		t.Fatal("test requires root, and CI must run as root")
	}
	t.Skip("requires root")
}

// SkipShort skips t with -short (make test-short runs unit tests only):
// why says what the test needs.
func SkipShort(t testing.TB, why string) {
	t.Helper()
	if testing.Short() {
		t.Skipf("%s; skipped with -short", why)
	}
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

// RequireRuntimesEnv lists (comma-separated) the OCI runtimes a run must
// have: `make test` sets it to every runtime class, so that a test of a
// class missing on PATH fails there instead of skipping.
const RequireRuntimesEnv = "MOAT_REQUIRE_RUNTIMES"

// LookRuntime returns the path of the OCI runtime name (runc, crun,
// runsc) on PATH. When it is missing t is skipped, or fails when
// RequireRuntimesEnv names it.
func LookRuntime(t testing.TB, name string) string {
	t.Helper()
	p, err := exec.LookPath(name)
	if err == nil {
		return p
	}
	if RuntimeRequired(name) {
		t.Fatalf("%s not installed and required by %s: %v", name, RequireRuntimesEnv, err)
	}
	t.Skipf("%s not installed", name)
	return ""
}

// RuntimeRequired reports whether RequireRuntimesEnv names runtime name.
func RuntimeRequired(name string) bool {
	return slices.Contains(strings.Split(os.Getenv(RequireRuntimesEnv), ","), name)
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

// builds are the binaries built by Build in this process, by package.
var builds struct {
	mu   sync.Mutex
	dirs []string
	m    map[string]*build
}

type build struct {
	once sync.Once
	path string
	err  error
}

// Build builds the main package pkg (relative to the module root)
// statically (CGO_ENABLED=0, -trimpath, with flags) once per test
// process and returns the binary's path. RemoveBuilt deletes them.
func Build(t testing.TB, pkg string, flags ...string) string {
	t.Helper()
	SkipShort(t, "builds binaries")
	builds.mu.Lock()
	if builds.m == nil {
		builds.m = map[string]*build{}
	}
	b, ok := builds.m[pkg]
	if !ok {
		b = &build{}
		builds.m[pkg] = b
	}
	builds.mu.Unlock()
	b.once.Do(func() {
		sweepBuilds()
		dir, err := os.MkdirTemp("", buildPrefix+strconv.Itoa(os.Getpid())+"-")
		if err != nil {
			b.err = err
			return
		}
		builds.mu.Lock()
		builds.dirs = append(builds.dirs, dir)
		builds.mu.Unlock()
		b.path = filepath.Join(dir, filepath.Base(pkg))
		b.err = GoBuild(RepoRoot(t), b.path, pkg, flags...)
	})
	if b.err != nil {
		t.Fatal(b.err)
	}
	return b.path
}

// buildPrefix names Build's directories: moat-build-<pid>-<random>, so
// that the directories of a test process that died without RemoveBuilt (a
// package without TestMain, a go test timeout) can be told from those of
// one still running.
const buildPrefix = "moat-build-"

// sweepBuilds removes the Build directories of test processes that no
// longer exist.
func sweepBuilds() {
	dirs, _ := filepath.Glob(filepath.Join(os.TempDir(), buildPrefix+"*-*"))
	for _, d := range dirs {
		pid, err := strconv.Atoi(strings.SplitN(strings.TrimPrefix(filepath.Base(d), buildPrefix), "-", 2)[0])
		if err != nil || pid <= 0 || pid == os.Getpid() {
			continue
		}
		if err := syscall.Kill(pid, 0); errors.Is(err, syscall.ESRCH) {
			os.RemoveAll(d)
		}
	}
}

// Main runs the tests of a package that builds binaries (Build,
// AgentBinary, MoatBinary) and removes them afterwards: call it from
// TestMain.
func Main(m *testing.M) {
	code := m.Run()
	RemoveBuilt()
	os.Exit(code)
}

// RemoveBuilt deletes the binaries Build made (call it from TestMain, or
// use Main).
func RemoveBuilt() {
	builds.mu.Lock()
	defer builds.mu.Unlock()
	for _, d := range builds.dirs {
		os.RemoveAll(d)
	}
	builds.dirs = nil
	builds.m = nil
}

// AgentBinary builds the in-sandbox agent (cmd/moat-agent) as `make
// build` does and returns its path. Set MOAT_AGENT_BIN to use a prebuilt
// one.
func AgentBinary(t testing.TB) string {
	t.Helper()
	SkipShort(t, "runs the agent")
	if p := os.Getenv("MOAT_AGENT_BIN"); p != "" {
		return p
	}
	return Build(t, "./cmd/moat-agent", "-ldflags=-s -w")
}

// payloadMu serializes MoatBinary's installation of the agent payload.
var payloadMu sync.Mutex

// MoatBinary builds the static moat binary once per test process, with
// the agent it carries (AgentBinary, put first where internal/agentbin
// embeds it), and returns its path. Set MOAT_BIN to use a prebuilt one.
func MoatBinary(t testing.TB) string {
	t.Helper()
	SkipShort(t, "runs moat")
	if p := os.Getenv("MOAT_BIN"); p != "" {
		return p
	}
	agent := AgentBinary(t)
	payloadMu.Lock()
	err := installPayload(agent, filepath.Join(RepoRoot(t), "internal", "agentbin", "payload", "moat-agent"))
	payloadMu.Unlock()
	if err != nil {
		t.Fatalf("agent payload: %v", err)
	}
	return Build(t, "./cmd/moat")
}

// BenchBinary builds moat-bench (the benchmarks' binary) once per test
// process and returns its path. Set MOAT_BENCH_BIN to use a prebuilt one.
func BenchBinary(t testing.TB) string {
	t.Helper()
	SkipShort(t, "runs moat-bench")
	if p := os.Getenv("MOAT_BENCH_BIN"); p != "" {
		return p
	}
	return Build(t, "./cmd/moat-bench")
}

// GoBuild builds pkg statically (CGO_ENABLED=0, -trimpath) into out.
func GoBuild(dir, out, pkg string, flags ...string) error {
	args := append(append([]string{"build", "-trimpath"}, flags...), "-o", out, pkg)
	cmd := exec.Command("go", args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("go build %s: %v\n%s", pkg, err, out)
	}
	return nil
}

// installPayload copies the agent to dst through a temporary file and a
// rename: test processes that build moat concurrently each see a
// complete file (and, built from the same tree, the same one).
func installPayload(src, dst string) error {
	data, err := os.ReadFile(src)
	if err != nil {
		return err
	}
	if old, err := os.ReadFile(dst); err == nil && bytes.Equal(old, data) {
		return nil
	}
	return atomicfile.WriteFile(dst, data, 0o600)
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

// PreviousRelease is the commit upgrade tests treat as the release before
// this one.
const PreviousRelease = "f29dccf"

// MoatBinaryAt builds the static moat binary of commit (from a temporary
// git worktree of the repository) and returns its path. The binary is
// cached under CacheDir() by commit, so the build runs once per machine.
// The repository must have the commit (a full clone).
func MoatBinaryAt(t testing.TB, commit string) string {
	t.Helper()
	repo := RepoRoot(t)
	out, err := exec.Command("git", "-C", repo, "rev-parse", "--verify", commit+"^{commit}").Output()
	if err != nil {
		t.Fatalf("commit %s is not in %s (a shallow clone?): %v", commit, repo, err)
	}
	full := strings.TrimSpace(string(out))
	bin := filepath.Join(CacheDir(), "moat-release", full, "moat")
	if _, err := os.Stat(bin); err == nil {
		return bin
	}
	wt, err := os.MkdirTemp("", "moat-release-")
	if err != nil {
		t.Fatal(err)
	}
	os.Remove(wt) // git worktree add makes it
	if out, err := exec.Command("git", "-C", repo, "worktree", "add", "--detach", wt, full).CombinedOutput(); err != nil {
		t.Fatalf("git worktree add %s: %v\n%s", commit, err, out)
	}
	defer func() {
		exec.Command("git", "-C", repo, "worktree", "remove", "--force", wt).Run()
		os.RemoveAll(wt)
		exec.Command("git", "-C", repo, "worktree", "prune").Run()
	}()
	if err := os.MkdirAll(filepath.Dir(bin), 0o755); err != nil {
		t.Fatal(err)
	}
	tmp := fmt.Sprintf("%s.tmp%d", bin, os.Getpid())
	cmd := exec.Command("go", "build", "-trimpath", "-o", tmp, "./cmd/moat")
	cmd.Dir = wt
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		os.Remove(tmp)
		t.Fatalf("build moat at %s: %v\n%s", commit, err, out)
	}
	if err := os.Rename(tmp, bin); err != nil {
		t.Fatal(err)
	}
	return bin
}

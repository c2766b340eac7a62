package guest

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/moat-sandbox/moat/internal/testutil"
	"github.com/moat-sandbox/moat/internal/testutil/guest"
)

// buildTest compiles the tests of pkg (relative to the module root) into
// a static test binary to run in the guest, whose root has no Go.
func buildTest(t *testing.T, pkg string) string {
	t.Helper()
	testutil.SkipShort(t, "builds a test binary")
	out := filepath.Join(t.TempDir(), filepath.Base(pkg)+".test")
	cmd := exec.Command("go", "test", "-c", "-trimpath", "-o", out, pkg)
	cmd.Dir = testutil.RepoRoot(t)
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go test -c %s: %v\n%s", pkg, err, b)
	}
	return out
}

// runConformance runs the oci backend's conformance suite
// (internal/runtime/runtimetest through TestConformance) in the guest
// for every runtime class it has, runc and crun: the lifecycle, limits,
// recovery, checkpoints, volumes, disk quota, isolation, IPv6 and egress
// cases on cgroup v2 and Debian's kernel; with it the backend's tests of
// the limits in the cgroup files and of the kill of a cgroup's members. CI=true turns a test that
// needs root into a failure, and a case that skips fails here: on this
// host every case must run.
func runConformance(t *testing.T, vm *guest.VM) {
	start := time.Now()
	out := vm.MustRun(t, 40*time.Minute, `set -o pipefail
install -m 0755 /mnt/host/oci.test /root/oci.test
install -m 0755 /mnt/host/moat-agent /usr/local/lib/moat-agent
cd /root
env CI=true MOAT_REQUIRE_RUNTIMES=runc,crun MOAT_AGENT_BIN=/usr/local/lib/moat-agent MOAT_TEST_POOL=10.64.0.0/16 \
	./oci.test -test.run '^(TestConformance|TestLimitsAndNoLeaks|TestKillInCgroupOnlyKillsMembers)$' -test.count=1 -test.v -test.timeout 35m >conformance.log 2>&1
rc=$?
cat conformance.log
exit $rc`)
	t.Logf("conformance suite in the guest: %s", time.Since(start).Round(time.Second))
	for _, test := range []string{"TestConformance/runc", "TestConformance/crun", "TestLimitsAndNoLeaks/runc",
		"TestLimitsAndNoLeaks/crun", "TestKillInCgroupOnlyKillsMembers"} {
		if !strings.Contains(out, "--- PASS: "+test+" ") {
			t.Errorf("%s did not pass in the guest", test)
		}
	}
	if skips := regexp.MustCompile(`(?m)^\s*--- SKIP: .*$`).FindAllString(out, -1); len(skips) > 0 {
		t.Errorf("conformance cases skipped on the stock host:\n%s", strings.Join(skips, "\n"))
	}
	if t.Failed() {
		t.Logf("conformance output:\n%s", out)
	}
}

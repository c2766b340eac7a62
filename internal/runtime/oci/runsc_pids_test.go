package oci

import (
	"context"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/moat-sandbox/moat/internal/runtime"
	"github.com/moat-sandbox/moat/internal/runtime/runtimetest"
	"github.com/moat-sandbox/moat/internal/testutil"
)

// TestRunscPidsLimit checks that a runsc sandbox with a small pids limit
// survives its Sentry's own threads (which count in the host's pids
// cgroup) while it runs processes, and that a fork bomb in it is still
// stopped by the limit.
func TestRunscPidsLimit(t *testing.T) {
	testutil.LookRuntime(t, "runsc")
	r := newEnv(t, "runsc", nil).open(t)
	ctx := context.Background()
	id := runtimetest.NewID("rpids")
	if _, err := r.Create(ctx, runtime.Spec{ID: id, Image: testImage, AgentToken: runtimetest.Token,
		Resources: runtime.Resources{PidsLimit: 64}}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Delete(context.WithoutCancel(ctx), id) })
	runtimetest.WaitAgent(t, ctx, r, id, 10*time.Second)
	// Several rounds of concurrent processes: each exec grows the
	// Sentry's thread count, which alone passed a limit of 64.
	for i := range 5 {
		out, code, err := runtimetest.Exec(ctx, r, id, "for j in 1 2 3 4 5 6 7 8; do sleep 1 & done; wait; echo ok")
		if err != nil || code != 0 || !strings.Contains(out, "ok") {
			t.Fatalf("round %d: exec: %q, code %d, err %v", i, out, code, err)
		}
	}
	// The fork bomb: processes that never end, more than the limit plus
	// the headroom allows. Some forks must fail and the host must be fine.
	n := 64 + runscPidsHeadroom + 64
	out, _, err := runtimetest.Exec(ctx, r, id, "i=0; f=0; while [ $i -lt "+strconv.Itoa(n)+" ]; do sleep 30 & [ $? -ne 0 ] && f=$((f+1)); i=$((i+1)); done 2>/dev/null; echo started; kill $(jobs -p) 2>/dev/null; echo done")
	if err == nil && !strings.Contains(out, "started") {
		t.Logf("fork bomb output: %q", out)
	}
	st, err := r.Status(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	pidsMax := readCgroupFile(t, r, id, "pids.max")
	if want := strconv.Itoa(64 + runscPidsHeadroom); pidsMax != want {
		t.Errorf("pids.max = %s, want %s", pidsMax, want)
	}
	if f := strings.Fields(readCgroupFile(t, r, id, "pids.events")); len(f) != 2 || f[0] != "max" || f[1] == "0" {
		t.Errorf("pids.events = %v: the fork bomb was not stopped by the limit", f)
	}
	t.Logf("state after the fork bomb: %s", st.State)
}

// readCgroupFile reads file of sandbox id's pids cgroup (v1 or v2).
func readCgroupFile(t *testing.T, r *Runtime, id, file string) string {
	t.Helper()
	for _, d := range cgroupDirs(r.cgroupPath(id)) {
		if data, err := os.ReadFile(d + "/" + file); err == nil {
			return strings.TrimSpace(string(data))
		}
	}
	t.Fatalf("no %s for sandbox %s", file, id)
	return ""
}

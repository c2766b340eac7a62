package cli

import (
	"encoding/json"
	"strings"
	"testing"
	"text/tabwriter"

	"github.com/moat-sandbox/moat/internal/errdefs"
	"github.com/moat-sandbox/moat/internal/preflight"
)

// TestDoctorFake: a backend that needs nothing of the host passes, and
// the JSON form carries the checks.
func TestDoctorFake(t *testing.T) {
	out, err := execCLI(t, "doctor", "--runtime", "fake", "-o", "json")
	if err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	var rep doctorReport
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	if !rep.OK || rep.Runtime != "fake" || len(rep.Checks) != 1 || rep.Checks[0].Status != preflight.OK {
		t.Errorf("doctor --runtime fake: %+v", rep)
	}
}

// TestDoctorFails: a failed check exits 3 (failed precondition) after
// the report; a kubeconfig that leads nowhere is such a failure.
func TestDoctorFails(t *testing.T) {
	out, err := execCLI(t, "doctor", "--runtime", "kubernetes", "--kubeconfig", t.TempDir()+"/missing", "-o", "json")
	if !errdefs.IsFailedPrecondition(err) || ExitCode(err) != 3 {
		t.Fatalf("err %v (exit %d), want a failed precondition", err, ExitCode(err))
	}
	var rep doctorReport
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	if rep.OK || len(rep.Checks) != 1 || rep.Checks[0].Name != "kubernetes" || rep.Checks[0].Status != preflight.Fail || rep.Checks[0].Fix == "" {
		t.Errorf("report %+v", rep)
	}
}

// TestDoctorTable: one line per check; the fix of what is not ok below.
func TestDoctorTable(t *testing.T) {
	var b strings.Builder
	tw := tabwriter.NewWriter(&b, 0, 4, 2, ' ', 0)
	doctorTable(tw, doctorReport{Checks: []preflight.Check{
		{Name: "cgroup", Status: preflight.OK, Detail: "cgroup v2 (unified) at /sys/fs/cgroup"},
		{Name: "cgroup.memory", Status: preflight.Fail, Detail: "not delegated", Fix: "echo +memory > x"},
		{Name: "runtime.runsc", Status: preflight.Info, Detail: "not found", Fix: "install it"},
	}})
	tw.Flush()
	lines := strings.Split(strings.TrimRight(b.String(), "\n"), "\n")
	if len(lines) != 6 || !strings.HasPrefix(lines[1], "ok      cgroup ") || !strings.HasPrefix(lines[2], "fail    cgroup.memory") ||
		strings.TrimSpace(lines[3]) != "fix: echo +memory > x" || strings.TrimSpace(lines[5]) != "fix: install it" {
		t.Errorf("table:\n%s", b.String())
	}
	if strings.Index(lines[3], "fix:") != strings.Index(lines[2], "not delegated")+2 {
		t.Errorf("fix not under the detail:\n%s", b.String())
	}
}

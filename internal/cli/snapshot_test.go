package cli

import (
	"encoding/json"
	"strings"
	"testing"
	"time"
)

func TestSnapshotVerbs(t *testing.T) {
	url := realAPI(t)
	as := func(args ...string) (string, string, int) {
		return runMoat(t, nil, append([]string{args[0], "--server", url, "--api-key", "root-key"}, args[1:]...)...)
	}
	out, errOut, code := as("sb", "create", "--image", "busybox", "-q")
	sb := strings.TrimSpace(out)
	if code != 0 || sb == "" {
		t.Fatalf("sb create: %d %q %q", code, out, errOut)
	}
	out, errOut, code = as("snapshot", "create", sb, "--name", "before")
	snap := strings.TrimSpace(out)
	if code != 0 || snap == "" {
		t.Fatalf("snapshot create: %d %q %q", code, out, errOut)
	}
	if _, errOut, code = as("snapshot", "create", "nosuchsandbox"); code != 4 {
		t.Fatalf("snapshot of an unknown sandbox: exit %d, want 4 (%q)", code, errOut)
	}
	if _, _, code = as("snapshot", "create"); code != 2 {
		t.Fatalf("snapshot create without a sandbox: exit %d, want 2", code)
	}
	out, _, code = as("snapshot", "ls", "--sandbox", sb)
	if code != 0 || !strings.Contains(out, snap) || !strings.Contains(out, "before") || !strings.Contains(out, "Ready") {
		t.Fatalf("ls: %d %q", code, out)
	}
	if out, _, code = as("snapshot", "ls", "--sandbox", "other"); code != 0 || strings.Contains(out, snap) {
		t.Fatalf("ls of another sandbox: %d %q", code, out)
	}
	out, _, code = as("snapshot", "get", snap, "-o", "json")
	var s map[string]any
	if code != 0 || json.Unmarshal([]byte(out), &s) != nil || s["sandboxId"] != sb || s["name"] != "before" {
		t.Fatalf("get: %d %q", code, out)
	}
	// A sandbox from the snapshot.
	out, errOut, code = as("sb", "create", "--snapshot", snap, "-q")
	child := strings.TrimSpace(out)
	if code != 0 || child == "" {
		t.Fatalf("sb create --snapshot: %d %q %q", code, out, errOut)
	}
	// In use by a sandbox, the snapshot stays; then it goes.
	if _, errOut, code = as("snapshot", "rm", snap); code != 3 {
		t.Fatalf("rm of a snapshot in use: exit %d, want 3 (%q)", code, errOut)
	}
	if _, errOut, code = as("sb", "rm", child); code != 0 {
		t.Fatalf("sb rm: exit %d (%q)", code, errOut)
	}
	// The child's delete may still be finishing: the snapshot goes once
	// nothing uses it.
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		_, errOut, code = as("snapshot", "rm", snap)
		if code == 0 {
			break
		}
		if code != 3 || time.Now().After(deadline) {
			t.Fatalf("rm: exit %d (%q)", code, errOut)
		}
	}
	if _, _, code = as("snapshot", "get", snap); code != 4 {
		t.Fatalf("get after rm: exit %d, want 4", code)
	}
}

package cli

import (
	"encoding/json"
	"strings"
	"testing"
)

func TestSandboxFork(t *testing.T) {
	url := realAPI(t)
	as := func(args ...string) (string, string, int) {
		return runMoat(t, nil, append([]string{args[0], "--server", url, "--api-key", "root-key"}, args[1:]...)...)
	}
	out, errOut, code := as("sb", "create", "--image", "busybox", "-q")
	sb := strings.TrimSpace(out)
	if code != 0 || sb == "" {
		t.Fatalf("sb create: %d %q %q", code, out, errOut)
	}
	out, errOut, code = as("sb", "fork", sb, "--count", "2", "--env", "A=b", "--metadata", "k=v", "--wait=false", "-o", "json")
	var op struct{ ID, State, SourceID string }
	if code != 0 || json.Unmarshal([]byte(out), &op) != nil || op.ID == "" || op.SourceID != sb || op.State != "Running" {
		t.Fatalf("fork: %d %q %q", code, out, errOut)
	}
	for _, tc := range []struct {
		args []string
		code int
	}{
		{[]string{"sb", "fork", sb, "--count", "0"}, 2},
		{[]string{"sb", "fork", sb, "--count", "101"}, 2},
		{[]string{"sb", "fork", sb, "--env", "novalue"}, 2},
		{[]string{"sb", "fork", sb, "--timeout", "10s"}, 2},
		{[]string{"sb", "fork", "nosuchsandbox"}, 4},
		{[]string{"sb", "fork"}, 2},
	} {
		if _, errOut, code := as(tc.args...); code != tc.code {
			t.Errorf("%v: exit %d, want %d (%q)", tc.args, code, tc.code, errOut)
		}
	}
}

package execd

import (
	"strings"
	"testing"
)

func TestSetEnvAppliesToLaterCommands(t *testing.T) {
	e := newTestEnv(t)
	if code, body := e.call("POST", "/moat/v1/env", map[string]any{"envs": map[string]string{"CLAIMED": "yes", "PATH": "/claimed:/usr/bin:/bin"}}); code != 200 {
		t.Fatalf("set env: %d %s", code, body)
	}
	evs := e.runStream(map[string]any{"command": "echo $CLAIMED $PATH"})
	var out []string
	for _, ev := range evs {
		if ev.Type == "stdout" {
			out = append(out, ev.Text)
		}
	}
	if got := strings.Join(out, "\n"); got != "yes /claimed:/usr/bin:/bin" {
		t.Fatalf("command saw %q", got)
	}
	for _, bad := range []any{map[string]any{"envs": map[string]string{"A=B": "x"}}, "not an object"} {
		code, body := e.call("POST", "/moat/v1/env", bad)
		wantError(t, code, body, 400, CodeInvalidRequestBody)
	}
}

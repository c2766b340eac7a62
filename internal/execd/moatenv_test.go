package execd

import (
	"bytes"
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/moat-sandbox/moat/internal/execd/exectest"
	"github.com/moat-sandbox/moat/internal/execd/wire"
)

func TestSetEnvAppliesToLaterCommands(t *testing.T) {
	e := newTestEnv(t)
	if code, body := e.Call("POST", "/moat/v1/env", map[string]any{"envs": map[string]string{"CLAIMED": "yes", "PATH": "/claimed:/usr/bin:/bin"}}); code != 200 {
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
		code, body := e.Call("POST", "/moat/v1/env", bad)
		exectest.WantError(t, code, body, 400, wire.CodeInvalidRequestBody)
	}
}

func TestSetTokenReplacesTheAccessToken(t *testing.T) {
	e := newTestEnv(t, func(o *Options) { o.Token = "old-token-0123456789" })
	ping := func(tok string) int {
		req, _ := http.NewRequest("GET", e.ts.URL+"/ping", nil)
		req.Header.Set(TokenHeader, tok)
		resp, err := e.ts.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	set := func(auth string, body any) int {
		data, _ := json.Marshal(body)
		req, _ := http.NewRequest("POST", e.ts.URL+"/moat/v1/token", bytes.NewReader(data))
		req.Header.Set(TokenHeader, auth)
		resp, err := e.ts.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if got := set("wrong", map[string]string{"token": "new-token-0123456789"}); got != 401 {
		t.Fatalf("set with a wrong token: %d, want 401", got)
	}
	for _, bad := range []string{"", "short", "has space 0123456789", strings.Repeat("x", 257)} {
		if got := set("old-token-0123456789", map[string]string{"token": bad}); got != 400 {
			t.Errorf("set token %q: %d, want 400", bad, got)
		}
	}
	if got := set("old-token-0123456789", map[string]string{"token": "new-token-0123456789"}); got != 200 {
		t.Fatalf("set: %d", got)
	}
	if got := ping("old-token-0123456789"); got != 401 {
		t.Errorf("old token after rotation: %d, want 401", got)
	}
	if got := ping("new-token-0123456789"); got != 200 {
		t.Errorf("new token: %d, want 200", got)
	}
}

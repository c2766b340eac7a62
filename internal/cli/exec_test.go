package cli

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/coder/websocket"

	"github.com/moat-sandbox/moat/client"
)

// agentCommand serves POST /agent/command with the events for each
// command text.
func (f *fakeServer) agentCommand(events map[string][]string) {
	f.mux.HandleFunc("POST /agent/command", func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("X-EXECD-ACCESS-TOKEN") != "tok" {
			writeJSONResp(w, 401, map[string]string{"error": "no token"})
			return
		}
		var req struct{ Command string }
		json.NewDecoder(r.Body).Decode(&req)
		evs, ok := events[req.Command]
		if !ok {
			writeJSONResp(w, 400, map[string]string{"code": "INVALID_REQUEST_BODY", "message": "unexpected command " + req.Command})
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		for _, e := range evs {
			io.WriteString(w, e+"\n\n")
		}
	})
}

func TestExecExitCodes(t *testing.T) {
	f := newFakeServer(t)
	init := `{"type":"init","text":"c1"}`
	f.agentCommand(map[string][]string{
		"echo a; exit 3": {init, `{"type":"stdout","text":"a"}`, `{"type":"stderr","text":"warn"}`, `{"type":"stdout","text":""}`,
			`{"type":"error","error":{"ename":"CommandExecError","evalue":"3","traceback":["exit status 3"]}}`},
		"ls -la '/my dir'": {init, `{"type":"stdout","text":"ok"}`, `{"type":"execution_complete","execution_time":5}`},
		"sleep 100":        {init, `{"type":"error","error":{"ename":"CommandExecError","evalue":"-1","traceback":["signal: killed"]}}`},
		"nosuch":           {init, `{"type":"error","error":{"ename":"CommandExecError","evalue":"fork/exec: no such file","traceback":["x"]}}`},
		"server &":         {init, `{"type":"execution_complete","execution_time":1}`},
	})
	for i, tc := range []struct {
		args           []string
		stdout, stderr string
		code           int
	}{
		{[]string{"--", "echo a; exit 3"}, "a\n\n", "warn\n", 3},
		{[]string{"--cwd", "/w", "-e", "K=V", "--timeout", "2s", "--", "ls", "-la", "/my dir"}, "ok\n", "", 0},
		{[]string{"--", "sleep 100"}, "", "", 128 + 9},
		{[]string{"--", "nosuch"}, "", "moat: command failed: CommandExecError: fork/exec: no such file\n", exitCodeNotRun},
		{[]string{"-d", "--", "server &"}, "c1\n", "", 0},
	} {
		out, errOut, code := f.run(nil, append([]string{"exec", "sb1"}, tc.args...)...)
		if out != tc.stdout || errOut != tc.stderr || code != tc.code {
			t.Errorf("%d: exec %q: exit %d stdout %q stderr %q; want %d %q %q", i, tc.args, code, out, errOut, tc.code, tc.stdout, tc.stderr)
		}
	}
	_, b := f.last("POST", "/agent/command")
	if !strings.Contains(string(b), `"background":true`) {
		t.Fatalf("background not sent: %s", b)
	}
	f.run(nil, "exec", "sb1", "--cwd", "/w", "-e", "K=V", "--timeout", "2s", "--", "ls", "-la", "/my dir")
	var req map[string]any
	_, b = f.last("POST", "/agent/command")
	json.Unmarshal(b, &req)
	if req["cwd"] != "/w" || req["timeout"] != 2000.0 || fmt.Sprint(req["envs"]) != "map[K:V]" {
		t.Fatalf("exec request %s", b)
	}

	// Usage errors.
	if _, errOut, code := f.run(nil, "exec", "sb1", "a", "--", "b"); code != 2 || !strings.Contains(errOut, "usage") {
		t.Fatalf("words before --: %d %q", code, errOut)
	}
	if _, _, code := f.run(nil, "exec", "sb1"); code != 2 {
		t.Fatalf("no command: exit %d", code)
	}
	if _, errOut, code := f.run(nil, "exec", "sb1", "--", "unexpected"); code != 2 || !strings.Contains(errOut, "INVALID_REQUEST_BODY") {
		t.Fatalf("agent 400: %d %q", code, errOut)
	}
}

func TestSignalExitCode(t *testing.T) {
	for _, tc := range []struct {
		tb   []string
		code int
		ok   bool
	}{
		{[]string{"signal: terminated"}, 143, true},
		{[]string{"signal: interrupt"}, 130, true},
		{[]string{"exit status 3"}, 0, false},
		{nil, 0, false},
	} {
		code, ok := signalExitCode(&client.ExecutionError{Traceback: tc.tb})
		if code != tc.code || ok != tc.ok {
			t.Errorf("%q: %d %v, want %d %v", tc.tb, code, ok, tc.code, tc.ok)
		}
	}
}

// TestShellPipeMode drives `moat shell` with piped stdin against a fake
// PTY WebSocket that behaves like `sh` in pipe mode.
func TestShellPipeMode(t *testing.T) {
	f := newFakeServer(t)
	got := make(chan string, 16)
	f.mux.HandleFunc("POST /agent/pty", func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		got <- "create " + string(b)
		writeJSONResp(w, 201, map[string]string{"session_id": "p1"})
	})
	f.mux.HandleFunc("DELETE /agent/pty/p1", func(w http.ResponseWriter, r *http.Request) { got <- "delete" })
	f.mux.HandleFunc("GET /agent/pty/p1/ws", func(w http.ResponseWriter, r *http.Request) {
		got <- "attach " + r.URL.RawQuery
		ws, err := websocket.Accept(w, r, nil)
		if err != nil {
			return
		}
		defer ws.CloseNow()
		ctx := r.Context()
		ws.Write(ctx, websocket.MessageText, []byte(`{"type":"connected","session_id":"p1","mode":"pipe"}`))
		var stdin strings.Builder
		for {
			_, data, err := ws.Read(ctx)
			if err != nil {
				return
			}
			stdin.Write(data[1:])
			if strings.HasSuffix(stdin.String(), "exit\n") {
				got <- "stdin " + stdin.String()
				ws.Write(ctx, websocket.MessageBinary, append([]byte{0x01}, "out\n"...))
				ws.Write(ctx, websocket.MessageBinary, append([]byte{0x02}, "err\n"...))
				ws.Write(ctx, websocket.MessageText, []byte(`{"type":"exit","exit_code":7}`))
				ws.Close(websocket.StatusNormalClosure, "exited")
				return
			}
		}
	})
	out, errOut, code := f.run(strings.NewReader("echo hi\nfalse"), "shell", "sb1", "--cwd", "/tmp")
	if code != 7 || out != "out\n" || errOut != "err\n" {
		t.Fatalf("shell: exit %d stdout %q stderr %q", code, out, errOut)
	}
	for _, want := range []string{`create {"cwd":"/tmp"}`, "attach pty=0", "stdin echo hi\nfalse\nexit\n", "delete"} {
		if g := <-got; g != want {
			t.Fatalf("got %q, want %q", g, want)
		}
	}
}

func TestEndOfInput(t *testing.T) {
	for _, tc := range []struct {
		o    shellOptions
		want string
	}{
		{shellOptions{tty: true}, "\x04"},
		{shellOptions{}, "exit\n"},
		{shellOptions{command: "cat"}, ""},
	} {
		if got := string(endOfInput(tc.o)); got != tc.want {
			t.Errorf("%+v: %q, want %q", tc.o, got, tc.want)
		}
	}
}

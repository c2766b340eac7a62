package execd

import (
	"bytes"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/moat-sandbox/moat/internal/execd/command"
	"github.com/moat-sandbox/moat/internal/execd/exectest"
	"github.com/moat-sandbox/moat/internal/execd/proc"
	"github.com/moat-sandbox/moat/internal/execd/wire"
)

func TestPing(t *testing.T) {
	e := newTestEnv(t)
	st, body := e.Call("GET", "/ping", nil)
	if st != 200 || len(body) != 0 {
		t.Fatalf("ping = %d %q", st, body)
	}
}

func TestAuth(t *testing.T) {
	e := newTestEnv(t, func(o *Options) { o.Token = "s3cret" })
	for _, tc := range []struct {
		path, token string
		want        int
	}{
		{"/ping", "", 401},
		{"/ping", "wrong", 401},
		{"/ping", "s3cret", 200},
		{"/files/info?path=/", "", 401},
		{"/proxy/1/x", "", 401},
	} {
		req, _ := http.NewRequest("GET", e.ts.URL+tc.path, nil)
		if tc.token != "" {
			req.Header.Set(TokenHeader, tc.token)
		}
		resp, err := e.ts.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != tc.want {
			t.Errorf("%s token %q: status %d, want %d", tc.path, tc.token, resp.StatusCode, tc.want)
		}
		if tc.want == 401 && string(body) != unauthorizedBody {
			t.Errorf("401 body = %q", body)
		}
	}
}

func TestCommandForegroundExactFraming(t *testing.T) {
	e := newTestEnv(t)
	resp := e.Do("POST", "/command", map[string]any{"command": "echo hi; exit 0"})
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	for k, v := range map[string]string{
		"Content-Type": "text/event-stream", "Cache-Control": "no-cache",
		"Connection": "keep-alive", "X-Accel-Buffering": "no",
	} {
		if got := resp.Header.Get(k); got != v {
			t.Errorf("header %s = %q, want %q", k, got, v)
		}
	}
	re := regexp.MustCompile(`^\{"type":"init","text":"([0-9a-f]{32})","timestamp":\d{13}\}\n\n` +
		`\{"type":"stdout","text":"hi","timestamp":\d{13}\}\n\n` +
		`\{"type":"execution_complete","execution_time":\d+,"timestamp":\d{13}\}\n\n$`)
	m := re.FindSubmatch(body)
	if m == nil {
		t.Fatalf("stream:\n%s", body)
	}
	st, sb := e.Call("GET", "/command/status/"+string(m[1]), nil)
	var status command.Status
	if err := json.Unmarshal(sb, &status); err != nil || st != 200 {
		t.Fatalf("status %d %s", st, sb)
	}
	if status.Running || status.ExitCode == nil || *status.ExitCode != 0 || status.Content != "echo hi; exit 0" || status.FinishedAt == nil {
		t.Fatalf("status = %s", sb)
	}
}

func TestCommandLineSplitting(t *testing.T) {
	e := newTestEnv(t)
	evs := e.runStream(map[string]any{"command": `printf 'a\nb\r\nc\rd\n\ne'; printf 'x\n' >&2`})
	var out, errs []string
	for _, ev := range evs {
		switch ev.Type {
		case wire.EvStdout:
			out = append(out, ev.Text)
		case wire.EvStderr:
			errs = append(errs, ev.Text)
		}
	}
	if got, want := strings.Join(out, "|"), "a|b|c|d|\n|e"; got != want {
		t.Errorf("stdout lines = %q, want %q", got, want)
	}
	if len(errs) != 1 || errs[0] != "x" {
		t.Errorf("stderr = %q", errs)
	}
}

func TestCommandNonZeroExit(t *testing.T) {
	e := newTestEnv(t)
	evs := e.runStream(map[string]any{"command": "echo oops >&2; exit 3"})
	last := evs[len(evs)-1]
	if last.Type != wire.EvError || last.Error == nil || last.Error.EName != "CommandExecError" || last.Error.EValue != "3" ||
		len(last.Error.Traceback) != 1 || last.Error.Traceback[0] != "exit status 3" {
		t.Fatalf("last event = %+v", last)
	}
	for _, ev := range evs {
		if ev.Type == wire.EvExecutionComplete {
			t.Fatal("execution_complete after a non-zero exit")
		}
	}
	if evs[1].Type != wire.EvStderr || evs[1].Text != "oops" {
		t.Fatalf("events = %+v", evs)
	}
}

func TestCommandStartFailure(t *testing.T) {
	e := newTestEnv(t)
	evs := e.runStream(map[string]any{"command": "true", "cwd": "/nonexistent/dir"})
	if len(evs) != 2 || evs[0].Type != wire.EvInit || evs[1].Type != wire.EvError || !strings.Contains(evs[1].Error.EValue, "/nonexistent/dir") {
		t.Fatalf("events = %+v", evs)
	}
}

func TestCommandRequestErrors(t *testing.T) {
	e := newTestEnv(t)
	for _, tc := range []struct {
		method, path string
		body         any
		status       int
		code         string
	}{
		{"POST", "/command", "{bad json", 400, wire.CodeInvalidRequestBody},
		{"POST", "/command", "", 400, wire.CodeInvalidRequestBody},
		{"POST", "/command", map[string]any{"command": ""}, 400, wire.CodeInvalidRequestBody},
		{"POST", "/command", map[string]any{"command": "true", "gid": 1}, 400, wire.CodeInvalidRequestBody},
		{"POST", "/command", map[string]any{"command": "true", "timeout": -1}, 400, wire.CodeInvalidRequestBody},
		{"DELETE", "/command", nil, 400, wire.CodeMissingQuery},
		{"DELETE", "/command?id=nope", nil, 404, wire.CodeContextNotFound},
		{"GET", "/command/status/nope", nil, 404, wire.CodeContextNotFound},
		{"GET", "/command/nope/logs", nil, 404, wire.CodeContextNotFound},
	} {
		st, body := e.Call(tc.method, tc.path, tc.body)
		t.Run(tc.method+tc.path, func(t *testing.T) { exectest.WantError(t, st, body, tc.status, tc.code) })
	}
}

func TestCommandCwdEnvAndEnvFile(t *testing.T) {
	envFile := t.TempDir() + "/env"
	if err := writeFile(envFile, "FROM_FILE=1\n# comment\nBOTH=file\n"); err != nil {
		t.Fatal(err)
	}
	e := newTestEnv(t, func(o *Options) {
		o.EnvFile = envFile
		o.BaseEnv = append(o.BaseEnv, "EXECD_SECRET=x")
		o.BaseEnv = proc.ChildEnv(o.BaseEnv)
	})
	dir := t.TempDir()
	evs := e.runStream(map[string]any{
		"command": `pwd; echo "$FROM_FILE $BOTH $REQ ${EXECD_SECRET:-unset}"`,
		"cwd":     dir,
		"envs":    map[string]string{"REQ": "r", "BOTH": "req"},
	})
	if evs[1].Text != dir || evs[2].Text != "1 req r unset" {
		t.Fatalf("events = %+v", evs)
	}
}

func TestCommandLargeOutputByteExact(t *testing.T) {
	e := newTestEnv(t)
	// ~11 MB: 140000 numbered lines of 75 'a's.
	const lines = 140000
	cmd := fmt.Sprintf(`head -c %d /dev/zero | tr '\0' 'a' | fold -w 75 | awk '{print NR $0}'`, lines*75)
	evs := e.runStream(map[string]any{"command": cmd})
	if evs[len(evs)-1].Type != wire.EvExecutionComplete {
		t.Fatalf("last = %+v", evs[len(evs)-1])
	}
	var got bytes.Buffer
	n := 0
	for _, ev := range evs {
		if ev.Type == wire.EvStdout {
			n++
			want := strconv.Itoa(n) + strings.Repeat("a", 75)
			if ev.Text != want {
				t.Fatalf("line %d = %q", n, ev.Text[:min(len(ev.Text), 90)])
			}
			got.WriteString(ev.Text)
			got.WriteByte('\n')
		}
	}
	if n != lines {
		t.Fatalf("lines = %d, want %d", n, lines)
	}
	// The logs endpoint has the same bytes.
	id := evs[0].Text
	st, logs := e.Call("GET", "/command/"+id+"/logs", nil)
	if st != 200 || sha256.Sum256(logs) != sha256.Sum256(got.Bytes()) {
		t.Fatalf("logs: status %d, %d bytes vs %d", st, len(logs), got.Len())
	}
}

func TestCommandStreamsAsProduced(t *testing.T) {
	e := newTestEnv(t)
	resp := e.Do("POST", "/command", map[string]any{"command": "echo first; sleep 2; echo second"})
	defer resp.Body.Close()
	sr := exectest.NewStreamReader(t, resp.Body)
	start := time.Now()
	if ev := sr.Next(); ev.Type != wire.EvInit {
		t.Fatalf("first = %+v", ev)
	}
	if ev := sr.Next(); ev.Text != "first" {
		t.Fatalf("second = %+v", ev)
	}
	if d := time.Since(start); d > time.Second {
		t.Fatalf("first line took %v: output is not streamed", d)
	}
	if ev := sr.Next(); ev.Text != "second" {
		t.Fatalf("third = %+v", ev)
	}
	if ev := sr.Next(); ev.Type != wire.EvExecutionComplete {
		t.Fatalf("fourth = %+v", ev)
	}
}

func TestCommandEndsWhileGrandchildHoldsPipe(t *testing.T) {
	e := newTestEnv(t)
	start := time.Now()
	evs := e.runStream(map[string]any{"command": "sleep 30 & echo started"})
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("stream took %v; must end when the shell exits", d)
	}
	if len(evs) != 3 || evs[1].Text != "started" || evs[2].Type != wire.EvExecutionComplete {
		t.Fatalf("events = %+v", evs)
	}
	// The orphaned sleep is killed by Server.Close in cleanup (goleak
	// verifies the copier goroutines ended).
}

func TestCommandTimeout(t *testing.T) {
	e := newTestEnv(t)
	start := time.Now()
	evs := e.runStream(map[string]any{"command": "echo a; sleep 30", "timeout": 300})
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("timeout not enforced: %v", d)
	}
	last := evs[len(evs)-1]
	if last.Type != wire.EvError || last.Error.EValue != "-1" || last.Error.Traceback[0] != "signal: killed" {
		t.Fatalf("last = %+v", last)
	}
}

func TestCommandInterrupt(t *testing.T) {
	e := newTestEnv(t)
	resp := e.Do("POST", "/command", map[string]any{"command": "trap 'echo term; exit 143' TERM; echo ready; while :; do sleep 0.05; done"})
	defer resp.Body.Close()
	sr := exectest.NewStreamReader(t, resp.Body)
	id := sr.Next().Text
	if ev := sr.Next(); ev.Text != "ready" {
		t.Fatalf("got %+v", ev)
	}
	st, body := e.Call("DELETE", "/command?id="+id, nil)
	if st != 200 {
		t.Fatalf("delete: %d %s", st, body)
	}
	var last wire.Event
	for {
		ev := sr.Next()
		last = ev
		if ev.Type == wire.EvError || ev.Type == wire.EvExecutionComplete {
			break
		}
	}
	if last.Type != wire.EvError || last.Error.EValue != "143" {
		t.Fatalf("last = %+v", last)
	}
}

func TestCommandClientDisconnectKills(t *testing.T) {
	e := newTestEnv(t)
	marker := t.TempDir() + "/alive"
	resp := e.Do("POST", "/command", map[string]any{"command": "echo go; sleep 1; touch " + marker})
	sr := exectest.NewStreamReader(t, resp.Body)
	id := sr.Next().Text
	sr.Next()
	resp.Body.Close()
	deadline := time.Now().Add(5 * time.Second)
	for {
		_, body := e.Call("GET", "/command/status/"+id, nil)
		var st command.Status
		json.Unmarshal(body, &st)
		if !st.Running {
			if st.ExitCode == nil || *st.ExitCode != -1 {
				t.Fatalf("status = %s", body)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("command still running after disconnect")
		}
		time.Sleep(20 * time.Millisecond)
	}
	time.Sleep(1200 * time.Millisecond)
	if fileExists(marker) {
		t.Fatal("process group survived the disconnect")
	}
}

func TestCommandBackgroundAndLogsCursor(t *testing.T) {
	e := newTestEnv(t)
	evs := e.runStream(map[string]any{"command": "echo one; echo two >&2; sleep 0.3; echo three", "background": true})
	if len(evs) != 2 || evs[0].Type != wire.EvInit || !exectest.Hex32.MatchString(evs[0].Text) || evs[1].Type != wire.EvExecutionComplete {
		t.Fatalf("events = %+v", evs)
	}
	id := evs[0].Text
	waitFinished(t, e, id)
	resp := e.Do("GET", "/command/"+id+"/logs", nil)
	all, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if string(all) != "one\ntwo\nthree\n" || resp.Header.Get("EXECD-COMMANDS-TAIL-CURSOR") != "14" ||
		resp.Header.Get("Content-Type") != "text/plain; charset=utf-8" {
		t.Fatalf("logs %q cursor %q", all, resp.Header.Get("EXECD-COMMANDS-TAIL-CURSOR"))
	}
	resp = e.Do("GET", "/command/"+id+"/logs?cursor=8", nil)
	tail, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if string(tail) != "three\n" || resp.Header.Get("EXECD-COMMANDS-TAIL-CURSOR") != "14" {
		t.Fatalf("tail %q", tail)
	}
	resp = e.Do("GET", "/command/"+id+"/logs?cursor=999", nil)
	tail, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	if len(tail) != 0 || resp.Header.Get("EXECD-COMMANDS-TAIL-CURSOR") != "14" {
		t.Fatalf("past-end %q %q", tail, resp.Header.Get("EXECD-COMMANDS-TAIL-CURSOR"))
	}
	st, body := e.Call("GET", "/command/"+id+"/logs?cursor=x", nil)
	exectest.WantError(t, st, body, 400, wire.CodeInvalidRequestBody)
}

func TestCommandBackgroundExitCodeAndKill(t *testing.T) {
	e := newTestEnv(t)
	id := e.runStream(map[string]any{"command": "exit 7", "background": true})[0].Text
	st := waitFinished(t, e, id)
	if *st.ExitCode != 7 || st.Error != "exit status 7" {
		t.Fatalf("status = %+v", st)
	}
	id = e.runStream(map[string]any{"command": "sleep 30", "background": true})[0].Text
	if code, _ := e.Call("DELETE", "/command?id="+id, nil); code != 200 {
		t.Fatal(code)
	}
	st = waitFinished(t, e, id)
	if *st.ExitCode != -1 || st.Error != "signal: terminated" {
		t.Fatalf("status = %+v", st)
	}
}

func TestCommandConcurrent(t *testing.T) {
	e := newTestEnv(t)
	var wg sync.WaitGroup
	errs := make(chan error, 40)
	for i := range 40 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			body, _ := json.Marshal(map[string]any{"command": fmt.Sprintf("for j in 1 2 3; do echo %d-$j; done", i)})
			resp, err := e.ts.Client().Post(e.ts.URL+"/command", "application/json", bytes.NewReader(body))
			if err != nil {
				errs <- err
				return
			}
			data, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			want := fmt.Sprintf(`"text":"%d-1"`, i)
			if !bytes.Contains(data, []byte(want)) || !bytes.Contains(data, []byte(fmt.Sprintf(`"text":"%d-3"`, i))) ||
				!bytes.Contains(data, []byte(`"type":"execution_complete"`)) {
				errs <- fmt.Errorf("command %d: %s", i, data)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

func TestCommandGrace(t *testing.T) {
	e := newTestEnv(t, func(o *Options) { o.Grace = 400 * time.Millisecond })
	start := time.Now()
	e.runStream(map[string]any{"command": "true"})
	if d := time.Since(start); d < 400*time.Millisecond {
		t.Fatalf("grace not applied: %v", d)
	}
}

func waitFinished(t *testing.T, e *testEnv, id string) command.Status {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		code, body := e.Call("GET", "/command/status/"+id, nil)
		var st command.Status
		if err := json.Unmarshal(body, &st); err != nil || code != 200 {
			t.Fatalf("status %d %s", code, body)
		}
		if !st.Running {
			return st
		}
		if time.Now().After(deadline) {
			t.Fatalf("command %s still running", id)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

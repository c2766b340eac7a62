package e2bcode

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/moat-sandbox/moat/internal/execd/code"
	"github.com/moat-sandbox/moat/internal/execd/command"
	"github.com/moat-sandbox/moat/internal/execd/proc"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const testToken = "code-token-1"

// env serves a Service over a real runner (the built-in drivers: no
// kernelspec directories) on an httptest server.
type env struct {
	t   *testing.T
	url string
	svc *Service
}

func newEnv(t *testing.T) *env {
	t.Helper()
	if _, err := exec.LookPath("python3"); err != nil {
		t.Skip("python3 is not installed")
	}
	run, err := proc.NewRunner(proc.Options{
		BaseEnv: proc.ChildEnv(os.Environ()), StateDir: t.TempDir(),
		Log: slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { // after the server's
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := run.Close(ctx); err != nil {
			t.Errorf("runner close: %v", err)
		}
	})
	cs := code.New(run, command.New(run, command.Options{}), code.Options{KernelDirs: []string{}})
	wd := t.TempDir()
	svc := New(cs, Options{Token: func() string { return testToken }, Workdir: func() string { return wd }})
	srv := httptest.NewServer(svc.Handler())
	t.Cleanup(srv.Close)
	return &env{t: t, url: srv.URL, svc: svc}
}

// call sends a JSON request (body nil: none) and returns the status and
// body.
func (e *env) call(method, path string, body any) (int, []byte) {
	e.t.Helper()
	var rd io.Reader
	if body != nil {
		b, _ := json.Marshal(body)
		rd = bytes.NewReader(b)
	}
	req, _ := http.NewRequest(method, e.url+path, rd)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Access-Token", testToken)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		e.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, b
}

// execute runs a request on /execute and returns its NDJSON items, after
// checking the framing: one object a line, no blank line, and
// end_of_execution last and only there.
func (e *env) execute(req map[string]any) []map[string]any {
	e.t.Helper()
	st, b := e.call("POST", "/execute", req)
	if st != 200 {
		e.t.Fatalf("execute %v: %d %s", req, st, b)
	}
	if !bytes.HasSuffix(b, []byte("\n")) {
		e.t.Fatalf("stream does not end with a newline: %q", b)
	}
	var items []map[string]any
	lines := strings.Split(strings.TrimSuffix(string(b), "\n"), "\n")
	for i, l := range lines {
		var it map[string]any
		if err := json.Unmarshal([]byte(l), &it); err != nil {
			e.t.Fatalf("line %d %q: %v", i, l, err)
		}
		if (it["type"] == "end_of_execution") != (i == len(lines)-1) {
			e.t.Fatalf("end_of_execution not last exactly: %s", b)
		}
		if it["type"] != "keepalive" {
			items = append(items, it)
		}
	}
	return items[:len(items)-1]
}

func byType(items []map[string]any, typ string) []map[string]any {
	var out []map[string]any
	for _, it := range items {
		if it["type"] == typ {
			out = append(out, it)
		}
	}
	return out
}

// texts joins the chunks of stdout or stderr items.
func texts(items []map[string]any) string {
	var b strings.Builder
	for _, it := range items {
		s, _ := it["text"].(string)
		b.WriteString(s)
	}
	return b.String()
}

func TestExecutePython(t *testing.T) {
	e := newEnv(t)
	items := e.execute(map[string]any{"code": "x = 1; x += 1; x"})
	if len(items) != 2 || items[0]["type"] != "number_of_executions" || items[0]["execution_count"] != 1.0 {
		t.Fatalf("items: %v", items)
	}
	if r := items[1]; r["type"] != "result" || r["text"] != "2" || r["is_main_result"] != true {
		t.Fatalf("result: %v", r)
	}
	// The default python context keeps its state and counts executions.
	items = e.execute(map[string]any{"code": "print('hi', x)", "language": "python"})
	if n := items[0]["execution_count"]; n != 2.0 {
		t.Fatalf("second execution count: %v", n)
	}
	if out := texts(byType(items, "stdout")); out != "hi 2\n" {
		t.Fatalf("stdout: %v", items)
	}
	if ts, _ := byType(items, "stdout")[0]["timestamp"].(string); ts == "" {
		t.Fatalf("no timestamp: %v", items)
	} else if _, err := time.Parse(time.RFC3339Nano, ts); err != nil {
		t.Fatalf("timestamp %q: %v", ts, err)
	}
	// A string's repr loses its quotes, as E2B's text does.
	if r := byType(e.execute(map[string]any{"code": "'abc'"}), "result"); len(r) != 1 || r[0]["text"] != "abc" {
		t.Fatalf("string result: %v", r)
	}
	// An error is one item with the traceback as one string, and the
	// stream still ends.
	items = e.execute(map[string]any{"code": "import sys\nprint('to err', file=sys.stderr)\nraise ValueError('boom')"})
	errs := byType(items, "error")
	if len(errs) != 1 || errs[0]["name"] != "ValueError" || errs[0]["value"] != "boom" {
		t.Fatalf("error: %v", items)
	}
	if tb, ok := errs[0]["traceback"].(string); !ok || !strings.Contains(tb, "ValueError") {
		t.Fatalf("traceback: %#v", errs[0]["traceback"])
	}
	if se := texts(byType(items, "stderr")); se != "to err\n" {
		t.Fatalf("stderr: %v", items)
	}
}

func TestContexts(t *testing.T) {
	e := newEnv(t)
	if _, err := exec.LookPath("node"); err != nil {
		t.Skip("node is not installed")
	}
	dir := t.TempDir()
	st, b := e.call("POST", "/contexts", map[string]any{"language": "js", "cwd": dir})
	var js Context
	if st != 200 || json.Unmarshal(b, &js) != nil || js.ID == "" || js.Language != "javascript" || js.Cwd != dir {
		t.Fatalf("create: %d %s", st, b)
	}
	// No language is python; no cwd is the workdir.
	st, b = e.call("POST", "/contexts", map[string]any{})
	var py Context
	if st != 200 || json.Unmarshal(b, &py) != nil || py.Language != "python" || py.Cwd != e.svc.opts.Workdir() {
		t.Fatalf("create default: %d %s", st, b)
	}
	st, b = e.call("GET", "/contexts", nil)
	var list []Context
	if st != 200 || json.Unmarshal(b, &list) != nil || len(list) != 2 || list[0] != js || list[1] != py {
		t.Fatalf("list: %d %s", st, b)
	}
	if r := byType(e.execute(map[string]any{"code": "process.cwd()", "context_id": js.ID}), "result"); len(r) != 1 || r[0]["text"] != dir {
		t.Fatalf("js cwd: %v", r)
	}
	e.execute(map[string]any{"code": "globalThis.kept = 41", "context_id": js.ID})
	if r := byType(e.execute(map[string]any{"code": "kept + 1", "context_id": js.ID}), "result"); len(r) != 1 || r[0]["text"] != "42" {
		t.Fatalf("js state: %v", r)
	}
	// Restart: same id, place and cwd, fresh state.
	if st, b := e.call("POST", "/contexts/"+js.ID+"/restart", nil); st != 200 || string(b) != "null" {
		t.Fatalf("restart: %d %s", st, b)
	}
	items := e.execute(map[string]any{"code": "typeof kept", "context_id": js.ID})
	if items[0]["execution_count"] != 1.0 || byType(items, "result")[0]["text"] != "undefined" {
		t.Fatalf("after restart: %v", items)
	}
	if _, b := e.call("GET", "/contexts", nil); !strings.HasPrefix(string(b), `[{"id":"`+js.ID+`"`) {
		t.Fatalf("list after restart: %s", b)
	}
	// Remove: gone from the list and from /execute.
	if st, b := e.call("DELETE", "/contexts/"+js.ID, nil); st != 200 || string(b) != "null" {
		t.Fatalf("remove: %d %s", st, b)
	}
	if st, b := e.call("POST", "/execute", map[string]any{"code": "1", "context_id": js.ID}); st != 404 || string(b) != "Context "+js.ID+" not found" {
		t.Fatalf("execute in removed context: %d %s", st, b)
	}
	if _, b := e.call("GET", "/contexts", nil); strings.Contains(string(b), js.ID) {
		t.Fatalf("removed context listed: %s", b)
	}
}

func TestBadInput(t *testing.T) {
	e := newEnv(t)
	for _, tc := range []struct {
		method, path string
		body         any
		status       int
		text         string
	}{
		{"POST", "/execute", map[string]any{"code": "1", "context_id": "x", "language": "python"}, 400, "Only one of context_id or language can be provided"},
		{"POST", "/execute", map[string]any{"code": "1", "context_id": "nope"}, 404, "Context nope not found"},
		{"POST", "/execute", map[string]any{"context_id": "nope"}, 422, "code is required"},
		{"POST", "/execute", "not an object", 422, ""},
		{"POST", "/execute", map[string]any{"code": "1", "language": "cobol"}, 400, `unknown language "cobol"`},
		{"POST", "/execute", map[string]any{"code": "1", "env_vars": map[string]string{"A B": "x"}}, 400, `invalid environment variable name "A B"`},
		{"POST", "/contexts", map[string]any{"language": "cobol"}, 400, `unknown language "cobol"`},
		{"POST", "/contexts", map[string]any{"language": "python", "cwd": "/nonexistent/dir"}, 400, "is not a directory"},
		{"POST", "/contexts/nope/restart", nil, 404, "Context nope not found"},
		{"DELETE", "/contexts/nope", nil, 404, "Context nope not found"},
	} {
		st, b := e.call(tc.method, tc.path, tc.body)
		if st != tc.status || !strings.Contains(string(b), tc.text) {
			t.Errorf("%s %s %v: %d %s, want %d %q", tc.method, tc.path, tc.body, st, b, tc.status, tc.text)
		}
	}
	// /execute wants the token; /health and /contexts do not (the SDK
	// sends it on /execute only).
	resp, err := http.Post(e.url+"/execute", "application/json", strings.NewReader(`{"code":"1"}`))
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 401 || string(b) != "Unauthorized" {
		t.Fatalf("no token: %d %s", resp.StatusCode, b)
	}
	for _, p := range []string{"/health", "/contexts?source=js-sdk"} {
		resp, err := http.Get(e.url + p)
		if err != nil || resp.StatusCode != 200 {
			t.Fatalf("%s: %v %v", p, resp, err)
		}
		resp.Body.Close()
	}
	// Nothing was left behind by the failures: no context was made.
	if _, b := e.call("GET", "/contexts", nil); string(b) != "[]" {
		t.Fatalf("contexts after bad input: %s", b)
	}
}

func TestEnvVars(t *testing.T) {
	e := newEnv(t)
	os.Unsetenv("E2B_TEST_ONLY")
	items := e.execute(map[string]any{"code": "import os\nos.environ['E2B_TEST_ONLY'] == 'it\\'s \"set\"'", "env_vars": map[string]string{"E2B_TEST_ONLY": "it's \"set\""}})
	if r := byType(items, "result"); len(r) != 1 || r[0]["text"] != "True" {
		t.Fatalf("env var in the cell: %v", items)
	}
	// Only for that execution.
	if r := byType(e.execute(map[string]any{"code": "repr(os.environ.get('E2B_TEST_ONLY'))"}), "result"); len(r) != 1 || r[0]["text"] != "None" {
		t.Fatalf("env var after the cell: %v", r)
	}
}

// TestExecutionsQueue: concurrent executions in one context wait for each
// other instead of failing busy.
func TestExecutionsQueue(t *testing.T) {
	e := newEnv(t)
	e.execute(map[string]any{"code": "import time; n = 0"})
	var wg sync.WaitGroup
	for range 3 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			e.execute(map[string]any{"code": "time.sleep(0.2); n += 1"})
		}()
	}
	wg.Wait()
	if r := byType(e.execute(map[string]any{"code": "n"}), "result"); len(r) != 1 || r[0]["text"] != "3" {
		t.Fatalf("after queued executions: %v", r)
	}
}

func TestResultItem(t *testing.T) {
	got := resultItem(map[string]any{
		"text": "'x'", "text/html": "<b>x</b>", "image/png": "iVBOR", "application/json": map[string]any{"a": 1.0},
		"e2b/data": map[string]any{"k": "v"}, "application/x-custom": "c",
	}, false)
	b, _ := json.Marshal(got)
	want := `{"data":{"k":"v"},"extra":{"application/x-custom":"c"},"html":"\u003cb\u003ex\u003c/b\u003e","is_main_result":false,"json":{"a":1},"png":"iVBOR","text":"x","type":"result"}`
	if string(b) != want {
		t.Fatalf("got  %s\nwant %s", b, want)
	}
}

func TestWithEnv(t *testing.T) {
	for _, lang := range []string{"python", "javascript", "typescript", "bash", "r"} {
		cell, cleanup, err := withEnv(lang, "CODE", map[string]string{"B": "2", "A": "o'k"})
		if err != nil || !strings.HasSuffix(cell, "\nCODE") || cleanup == "" || !strings.Contains(cell, "A") {
			t.Errorf("%s: %q %q %v", lang, cell, cleanup, err)
		}
	}
	if cell, cleanup, err := withEnv("java", "CODE", nil); err != nil || cell != "CODE" || cleanup != "" {
		t.Errorf("no envs: %q %q %v", cell, cleanup, err)
	}
	if _, _, err := withEnv("java", "CODE", map[string]string{"A": "1"}); err == nil {
		t.Error("java env accepted")
	}
}

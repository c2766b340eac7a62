package code

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/moat-sandbox/moat/internal/execd/exectest"
	"github.com/moat-sandbox/moat/internal/execd/wire"
)

// kernelEnv is a test agent that uses the host's real ipykernel (Debian
// python3-ipykernel, installed by scripts/install-deps.sh). It skips only
// when no python kernelspec is installed.
func kernelEnv(t *testing.T) *testEnv {
	t.Helper()
	if FindKernelSpec(KernelDirs(os.Environ()), "python", os.Environ()) == nil {
		t.Skip("no Jupyter python kernel on this host (apt-get install python3-ipykernel)")
	}
	return newTestEnv(t)
}

func (e *testEnv) createContext(lang string) string {
	e.t.Helper()
	st, b := e.Call("POST", "/code/context", map[string]any{"language": lang})
	var info ContextInfo
	if json.Unmarshal(b, &info); st != 200 || !exectest.Hex32.MatchString(info.ID) {
		e.t.Fatalf("create %s context: %d %s", lang, st, b)
	}
	return info.ID
}

func (e *testEnv) runCode(id, code string) []wire.Event {
	e.t.Helper()
	resp := e.Do("POST", "/code", map[string]any{"context": map[string]any{"id": id}, "code": code})
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 {
		e.t.Fatalf("run %q: %d %s", code, resp.StatusCode, data)
	}
	var out []wire.Event
	for _, ev := range exectest.ReadEvents(e.t, data) {
		if ev.Type != wire.EvPing {
			out = append(out, ev)
		}
	}
	return out
}

// resultText is the text of the result event, if any.
func resultText(evs []wire.Event) any {
	for _, ev := range evs {
		if ev.Type == wire.EvResult {
			return ev.Results["text"]
		}
	}
	return nil
}

var ansiEscape = regexp.MustCompile(`\x1b\[[0-9;]*m`)

func eventTypes(evs []wire.Event) string {
	var ts []string
	for _, ev := range evs {
		ts = append(ts, ev.Type)
	}
	return strings.Join(ts, ",")
}

// TestJupyterKernelContext runs a python context on the real ipykernel
// through the agent's HTTP API: state across executions, the kernel's
// execution_count, streamed stdout, an error with its traceback, and an
// interrupt of a busy loop after which the context still works.
func TestJupyterKernelContext(t *testing.T) {
	e := kernelEnv(t)
	id := e.createContext("python")
	c, err := e.svc.contexts.Get(id)
	if _, ok := c.backend.(*kernelClient); err != nil || !ok {
		t.Fatalf("context is not kernel-backed: %v", err)
	}

	// State, and the upstream event sequence for a cell without a value.
	if evs := e.runCode(id, "x = 41"); eventTypes(evs) != "init,execution_complete" || evs[0].Text != id {
		t.Fatalf("define: %+v", evs)
	}
	evs := e.runCode(id, "print('hi')\nx + 1")
	if eventTypes(evs) != "init,stdout,execution_count,result,execution_complete" ||
		evs[1].Text != "hi\n" || evs[3].Results["text"] != "42" {
		t.Fatalf("use: %+v", evs)
	}
	n := evs[2].ExecutionCount
	if n != 2 || evs[3].ExecutionCount != n {
		t.Fatalf("execution_count = %d, want the kernel's 2: %+v", n, evs)
	}
	if evs := e.runCode(id, "x"); len(evs) < 3 || evs[1].ExecutionCount != n+1 {
		t.Fatalf("execution_count did not increment: %+v", evs)
	}
	evs = e.runCode(id, "import sys; print('e', file=sys.stderr)")
	if eventTypes(evs) != "init,stderr,execution_complete" || evs[1].Text != "e\n" {
		t.Fatalf("stderr: %+v", evs)
	}

	// An error is status "error" then error, last.
	evs = e.runCode(id, "def f():\n    return 1/0\nf()")
	if eventTypes(evs) != "init,status,error" || evs[1].Text != "error" {
		t.Fatalf("error: %+v", evs)
	}
	ee := evs[2].Error
	if ee.EName != "ZeroDivisionError" || ee.EValue != "division by zero" || len(ee.Traceback) < 2 ||
		!strings.Contains(ansiEscape.ReplaceAllString(strings.Join(ee.Traceback, "\n"), ""), "return 1/0") {
		t.Fatalf("error payload: %+v", ee)
	}

	// A cell right after a failed one runs (is not "aborted").
	for range 5 {
		e.runCode(id, "1/0")
		if evs := e.runCode(id, "x"); resultText(evs) != "41" {
			t.Fatalf("cell after an error: %+v", evs)
		}
	}

	// Output is streamed as it is printed, not at the end.
	resp := e.Do("POST", "/code", map[string]any{"context": map[string]any{"id": id},
		"code": "import time\nfor i in range(3):\n    print(i, flush=True)\n    time.sleep(0.4)"})
	sr := exectest.NewStreamReader(t, resp.Body)
	if ev := sr.Next(); ev.Type != wire.EvInit {
		t.Fatalf("first = %+v", ev)
	}
	first := sr.Next()
	gotFirst := time.Now()
	if first.Type != wire.EvStdout || first.Text != "0\n" {
		t.Fatalf("first output = %+v, then %+v", first, sr.Next())
	}
	for {
		ev := sr.Next()
		if ev.Type == wire.EvExecutionComplete {
			break
		}
		if ev.Type != wire.EvStdout {
			t.Fatalf("streaming: %+v", ev)
		}
	}
	if d := time.Since(gotFirst); d < 600*time.Millisecond {
		t.Fatalf("the first line came only %v before the end: output was not streamed", d)
	}
	resp.Body.Close()

	// Interrupt a busy loop.
	resp = e.Do("POST", "/code", map[string]any{"context": map[string]any{"id": id}, "code": "y = 0\nwhile True:\n    y += 1"})
	sr = exectest.NewStreamReader(t, resp.Body)
	if ev := sr.Next(); ev.Type != wire.EvInit {
		t.Fatalf("first = %+v", ev)
	}
	time.Sleep(500 * time.Millisecond)
	// A second execution while busy is refused.
	st, b := e.Call("POST", "/code", map[string]any{"context": map[string]any{"id": id}, "code": "1"})
	exectest.WantError(t, st, b, 409, wire.CodeRuntimeError)
	if st, b := e.Call("DELETE", "/code?id="+id, nil); st != 200 {
		t.Fatalf("interrupt: %d %s", st, b)
	}
	done := make(chan []wire.Event, 1)
	go func() {
		var evs []wire.Event
		for {
			ev := sr.Next()
			evs = append(evs, ev)
			if ev.Type == wire.EvError || ev.Type == wire.EvExecutionComplete {
				done <- evs
				return
			}
		}
	}()
	select {
	case evs := <-done:
		last := evs[len(evs)-1]
		if last.Type != wire.EvError || last.Error.EName != "KeyboardInterrupt" {
			t.Fatalf("interrupted run: %+v", evs)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the interrupt did not stop the loop")
	}
	resp.Body.Close()
	if evs := e.runCode(id, "x + (y > 0)"); resultText(evs) != "42" {
		t.Fatalf("after interrupt: %+v", evs)
	}

	// Deleting the context ends the kernel.
	proc := c.backend.process()
	if st, _ := e.Call("DELETE", "/code/contexts/"+id, nil); st != 200 {
		t.Fatal(st)
	}
	select {
	case <-proc.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("the kernel outlived its context")
	}
	if left, _ := filepath.Glob(filepath.Join(e.run.Dir(), "code-"+id)); len(left) != 0 {
		t.Fatalf("kernel files left behind: %v", left)
	}
}

// TestJupyterDefaultContextAndCancel covers POST /code with a language
// and no id (a lazily created kernel context) and a client that goes away
// mid-cell: the kernel is interrupted and the context stays usable.
func TestJupyterDefaultContextAndCancel(t *testing.T) {
	e := kernelEnv(t)
	run := func(code string) []wire.Event {
		resp := e.Do("POST", "/code", map[string]any{"context": map[string]any{"language": "python"}, "code": code})
		defer resp.Body.Close()
		data, _ := io.ReadAll(resp.Body)
		return exectest.ReadEvents(t, data)
	}
	if evs := run("z = 6 * 7\nz"); resultText(evs) != "42" {
		t.Fatalf("default context: %+v", evs)
	}
	cs := e.svc.listContexts("python")
	if len(cs) != 1 || !isKernel(cs[0]) {
		t.Fatalf("contexts: %v", cs)
	}
	resp := e.Do("POST", "/code", map[string]any{"context": map[string]any{"language": "python"}, "code": "import time\nprint('go', flush=True)\ntime.sleep(60)"})
	sr := exectest.NewStreamReader(t, resp.Body)
	sr.Next()
	if ev := sr.Next(); ev.Type != wire.EvStdout {
		t.Fatalf("got %+v", ev)
	}
	resp.Body.Close() // the client goes away
	deadline := time.Now().Add(20 * time.Second)
	for {
		cs[0].mu.Lock()
		busy := cs[0].cur != nil
		cs[0].mu.Unlock()
		if !busy {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the cancelled cell kept the context busy")
		}
		time.Sleep(50 * time.Millisecond)
	}
	if evs := run("z"); resultText(evs) != "42" {
		t.Fatalf("after cancel: %+v", evs)
	}
}

// TestJupyterKernelStartFailure: a kernelspec whose kernel exits at once
// gives a clear error with the kernel's output, and no context.
func TestJupyterKernelStartFailure(t *testing.T) {
	dir := t.TempDir()
	kd := filepath.Join(dir, "broken")
	os.MkdirAll(kd, 0o755)
	spec := `{"argv":["/bin/sh","-c","echo kernel says no >&2; exit 3","{connection_file}"],"language":"bash"}`
	if err := os.WriteFile(filepath.Join(kd, "kernel.json"), []byte(spec), 0o644); err != nil {
		t.Fatal(err)
	}
	e := newTestEnv(t, func(o *Options) { o.KernelDirs = []string{dir} })
	st, b := e.Call("POST", "/code/context", map[string]any{"language": "bash"})
	exectest.WantError(t, st, b, 500, wire.CodeRuntimeError)
	if !strings.Contains(string(b), "kernel says no") {
		t.Fatalf("error lacks the kernel's output: %s", b)
	}
	if cs := e.svc.listContexts(""); len(cs) != 0 {
		t.Fatalf("a failed context was kept: %v", cs)
	}
	if left, _ := filepath.Glob(filepath.Join(e.run.Dir(), "code-*")); len(left) != 0 {
		t.Fatalf("kernel files left behind: %v", left)
	}
	// python has no kernel in KernelDirs: the built-in driver is used.
	if _, err := os.Stat("/usr/bin/python3"); err == nil {
		id := e.createContext("python")
		if c, _ := e.svc.contexts.Get(id); isKernel(c) {
			t.Fatal("python context uses a kernel that KernelDirs does not list")
		}
	}
}

func TestFindKernelSpec(t *testing.T) {
	dir := t.TempDir()
	write := func(name, spec string) {
		os.MkdirAll(filepath.Join(dir, name), 0o755)
		if err := os.WriteFile(filepath.Join(dir, name, "kernel.json"), []byte(spec), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("python3", `{"argv":["/bin/sh","-m","ipykernel_launcher","-f","{connection_file}"],"language":"python"}`)
	write("py311", `{"argv":["sh","-f","{connection_file}"],"language":"Python"}`)
	write("missing-bin", `{"argv":["/no/such/python","{connection_file}"],"language":"javascript"}`)
	write("no-conn", `{"argv":["/bin/sh"],"language":"bash"}`)
	write("bad", `{not json`)
	env := []string{"PATH=/usr/bin:/bin"}
	ks := FindKernelSpec([]string{dir}, "python", env)
	if ks == nil || ks.Name != "py311" || !filepath.IsAbs(ks.Argv[0]) {
		t.Fatalf("python: %+v (want py311 over python3, argv[0] resolved)", ks)
	}
	os.RemoveAll(filepath.Join(dir, "py311"))
	if ks := FindKernelSpec([]string{dir}, "python", env); ks == nil || ks.Name != "python3" {
		t.Fatalf("python fallback: %+v", ks)
	}
	for _, lang := range []string{"javascript", "bash"} {
		if ks := FindKernelSpec([]string{dir, filepath.Join(dir, "nope")}, lang, env); ks != nil {
			t.Fatalf("%s: unusable spec chosen: %+v", lang, ks)
		}
	}
}

// TestJupyterMessageInterrupt: a kernelspec with interrupt_mode "message"
// is interrupted with interrupt_request on the control channel; DELETE
// /code answers 200 only once the kernel's interrupt_reply has arrived.
func TestJupyterMessageInterrupt(t *testing.T) {
	sys := FindKernelSpec(KernelDirs(os.Environ()), "python", os.Environ())
	if sys == nil {
		t.Skip("no Jupyter python kernel on this host (apt-get install python3-ipykernel)")
	}
	dir := t.TempDir()
	sys.InterruptMode = "message"
	data, _ := json.Marshal(sys)
	os.MkdirAll(filepath.Join(dir, "py-msg"), 0o755)
	if err := os.WriteFile(filepath.Join(dir, "py-msg", "kernel.json"), data, 0o644); err != nil {
		t.Fatal(err)
	}
	e := newTestEnv(t, func(o *Options) { o.KernelDirs = []string{dir} })
	id := e.createContext("python")
	c, _ := e.svc.contexts.Get(id)
	if k, ok := c.backend.(*kernelClient); !ok || k.interruptMode != "message" {
		t.Fatal("context does not use the message-interrupt kernel")
	}
	resp := e.Do("POST", "/code", map[string]any{"context": map[string]any{"id": id}, "code": "while True:\n    pass"})
	defer resp.Body.Close()
	sr := exectest.NewStreamReader(t, resp.Body)
	sr.Next()
	time.Sleep(300 * time.Millisecond)
	if st, b := e.Call("DELETE", "/code?id="+id, nil); st != 200 {
		t.Fatalf("interrupt: %d %s", st, b)
	}
	if ev := sr.Final(30 * time.Second); ev.Type != wire.EvError || ev.Error.EName != "KeyboardInterrupt" {
		t.Fatalf("interrupted run ended with %+v", ev)
	}
}

// TestCodeBackToBack starts each cell as soon as the previous stream has
// delivered its last event: the context must already be free (no "session
// is busy"), with the built-in driver and with a kernel.
func TestCodeBackToBack(t *testing.T) {
	for _, kernels := range []bool{false, true} {
		t.Run(map[bool]string{false: "builtin", true: "kernel"}[kernels], func(t *testing.T) {
			if _, err := os.Stat("/usr/bin/python3"); err != nil {
				t.Skip("no python3")
			}
			var e *testEnv
			if kernels {
				e = kernelEnv(t)
			} else {
				e = newTestEnv(t, func(o *Options) { o.NoKernels = true })
			}
			id := e.createContext("python")
			for i := range 30 {
				resp := e.Do("POST", "/code", map[string]any{"context": map[string]any{"id": id}, "code": "print(" + strconv.Itoa(i) + ")"})
				if resp.StatusCode != 200 {
					b, _ := io.ReadAll(resp.Body)
					t.Fatalf("cell %d: %d %s", i, resp.StatusCode, b)
				}
				sr := exectest.NewStreamReader(t, resp.Body)
				for ev := sr.Next(); ev.Type != wire.EvExecutionComplete; ev = sr.Next() {
					if ev.Type == wire.EvError {
						t.Fatalf("cell %d: %+v", i, ev.Error)
					}
				}
				resp.Body.Close()
			}
		})
	}
}

// TestJupyterLargeOutputComplete prints ~6 MB in 200,000 lines from a
// kernel cell and checks that every line arrives, in order.
func TestJupyterLargeOutputComplete(t *testing.T) {
	e := kernelEnv(t)
	id := e.createContext("python")
	const n = 200000
	evs := e.runCode(id, "for i in range("+strconv.Itoa(n)+"):\n    print(f'{i:08d} abcdefghijklmnopqrstu')")
	var out strings.Builder
	for _, ev := range evs {
		if ev.Type == wire.EvStdout {
			out.WriteString(ev.Text)
		}
	}
	if last := evs[len(evs)-1]; last.Type != wire.EvExecutionComplete {
		t.Fatalf("last event %+v", last)
	}
	lines := strings.Split(strings.TrimSuffix(out.String(), "\n"), "\n")
	if len(lines) != n {
		t.Fatalf("got %d lines, want %d", len(lines), n)
	}
	for i, l := range lines {
		if want := fmt.Sprintf("%08d abcdefghijklmnopqrstu", i); l != want {
			t.Fatalf("line %d = %q, want %q", i, l, want)
		}
	}
}

// TestCodeContexts covers the built-in REPL drivers (Jupyter kernels are
// off here; jupyter_test.go covers them).
func TestCodeContexts(t *testing.T) {
	e := newTestEnv(t, func(o *Options) { o.NoKernels = true })
	langs := []string{"bash"}
	for _, l := range []struct{ lang, bin string }{{"python", "python3"}, {"javascript", "node"}} {
		if _, err := exec.LookPath(l.bin); err == nil {
			langs = append(langs, l.lang)
		}
	}
	cells := map[string][3]string{ // define, use (prints 42), error
		"bash":       {"x=41", "echo $((x+1))", ""},
		"python":     {"x = 41", "print(x + 1)\nx + 1", "1/0"},
		"javascript": {"var x = 41", "console.log(x + 1); x + 1", "null.f()"},
	}
	for _, lang := range langs {
		t.Run(lang, func(t *testing.T) {
			st, b := e.Call("POST", "/code/context", map[string]any{"language": lang})
			var info ContextInfo
			json.Unmarshal(b, &info)
			if st != 200 || info.Language != lang || !exectest.Hex32.MatchString(info.ID) {
				t.Fatalf("create: %d %s", st, b)
			}
			run := func(code string) []wire.Event {
				resp := e.Do("POST", "/code", map[string]any{"context": map[string]any{"id": info.ID}, "code": code})
				defer resp.Body.Close()
				data, _ := io.ReadAll(resp.Body)
				return exectest.ReadEvents(t, data)
			}
			c := cells[lang]
			if evs := run(c[0]); evs[0].Text != info.ID || evs[len(evs)-1].Type != wire.EvExecutionComplete {
				t.Fatalf("define: %+v", evs)
			}
			evs := run(c[1])
			var stdout string
			var result any
			for _, ev := range evs {
				if ev.Type == wire.EvStdout {
					stdout += ev.Text
				}
				if ev.Type == wire.EvResult {
					result = ev.Results["text"]
				}
			}
			if stdout != "42\n" || evs[len(evs)-1].Type != wire.EvExecutionComplete {
				t.Fatalf("use: %+v", evs)
			}
			if lang != "bash" && result != "42" {
				t.Fatalf("result = %v (%+v)", result, evs)
			}
			if c[2] != "" {
				evs := run(c[2])
				last := evs[len(evs)-1]
				if last.Type != wire.EvError || last.Error.EName == "" || evs[len(evs)-2].Type != wire.EvStatus {
					t.Fatalf("error: %+v", evs)
				}
			}
			st, b = e.Call("GET", "/code/contexts?language="+lang, nil)
			if st != 200 || !strings.Contains(string(b), info.ID) {
				t.Fatalf("list: %s", b)
			}
			if st, _ := e.Call("DELETE", "/code/contexts/"+info.ID, nil); st != 200 {
				t.Fatal(st)
			}
			st, b = e.Call("GET", "/code/contexts/"+info.ID, nil)
			exectest.WantError(t, st, b, 404, wire.CodeContextNotFound)
		})
	}
	st, b := e.Call("POST", "/code/context", map[string]any{"language": "cobol"})
	exectest.WantError(t, st, b, 400, wire.CodeInvalidRequestBody)
	st, b = e.Call("POST", "/code", map[string]any{"code": ""})
	exectest.WantError(t, st, b, 400, wire.CodeInvalidRequestBody)
	st, b = e.Call("DELETE", "/code", nil)
	exectest.WantError(t, st, b, 400, wire.CodeMissingQuery)
	// No language: a shell command.
	resp := e.Do("POST", "/code", map[string]any{"code": "echo plain"})
	data, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if evs := exectest.ReadEvents(t, data); evs[1].Text != "plain" {
		t.Fatalf("command language: %+v", evs)
	}
}

func isKernel(c *codeContext) bool {
	_, ok := c.backend.(*kernelClient)
	return ok
}

// A kernel that dies between cells: the next execution is refused with
// RUNTIME_ERROR, and the message says how the interpreter ended (its wait
// status) so that the client can tell a crash from a kill.
func TestKernelExitedBetweenCells(t *testing.T) {
	e := kernelEnv(t)
	id := e.createContext("python")
	if evs := e.runCode(id, "import sys; print('hi', file=sys.stderr)"); evs[len(evs)-1].Type != wire.EvExecutionComplete {
		t.Fatalf("first cell: %s", eventTypes(evs))
	}
	c, err := e.svc.contexts.Get(id)
	if err != nil {
		t.Fatal(err)
	}
	p := c.backend.process()
	p.Signal(syscall.SIGKILL)
	<-p.Done()
	resp := e.Do("POST", "/code", map[string]any{"context": map[string]any{"id": id}, "code": "1"})
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	exectest.WantError(t, resp.StatusCode, b, 409, wire.CodeRuntimeError)
	if !strings.Contains(string(b), "signal: killed") || !strings.Contains(string(b), "create a new context") {
		t.Fatalf("the error does not say how the kernel ended: %s", b)
	}
}

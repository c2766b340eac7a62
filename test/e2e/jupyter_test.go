package e2e

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/moat-sandbox/moat/internal/testutil"
)

// TestJupyterInSandbox runs code contexts in a real sandbox whose image
// has ipykernel (the debian-kernels image of scripts/build-test-images.sh,
// built from the Debian mirror and cached; TestCodeLanguagesInSandbox uses
// it too, so CI builds one image): the agent must find the kernel and use
// it instead of its built-in REPL.
func TestJupyterInSandbox(t *testing.T) {
	script := filepath.Join(testutil.RepoRoot(t), "scripts", "build-test-images.sh")
	out, err := exec.Command("bash", script, "debian-kernels").Output()
	if err != nil {
		t.Fatalf("build test image: %v (run scripts/build-test-images.sh)", err)
	}
	tarball := strings.TrimSpace(string(out))
	if _, err := os.Stat(tarball); err != nil {
		t.Fatalf("test image %q: %v", tarball, err)
	}

	srv := newServer(t)
	const ref = "localhost/debian-kernels:jupyter"
	if b, err := exec.Command(srv.bin, "image", "import", "--root", srv.root, ref, tarball).CombinedOutput(); err != nil {
		t.Fatalf("import: %v\n%s", err, b)
	}
	srv.start()

	var created sandboxResp
	srv.mustJSON(202, "POST", "/v1/sandboxes", map[string]any{
		"image":      map[string]any{"uri": ref},
		"entrypoint": []string{"sleep", "infinity"},
		"timeout":    600,
	}, &created)
	var ep endpointResp
	srv.mustJSON(200, "GET", fmt.Sprintf("/v1/sandboxes/%s/endpoints/44772", created.ID), nil, &ep)
	base := "http://" + ep.Endpoint

	call := func(method, path string, body any) (int, []byte) {
		b, _ := json.Marshal(body)
		req, _ := http.NewRequest(method, base+path, bytes.NewReader(b))
		req.Header.Set("Content-Type", "application/json")
		for k, v := range ep.Headers {
			req.Header.Set(k, v)
		}
		resp, err := (&http.Client{Timeout: 2 * time.Minute}).Do(req)
		if err != nil {
			t.Fatalf("%s %s: %v", method, path, err)
		}
		defer resp.Body.Close()
		var buf bytes.Buffer
		buf.ReadFrom(resp.Body)
		return resp.StatusCode, buf.Bytes()
	}
	code, body := call("POST", "/code/context", map[string]any{"language": "python"})
	var ctx struct{ ID, Language string }
	if code != 200 || json.Unmarshal(body, &ctx) != nil || ctx.ID == "" {
		t.Fatalf("create context: %d %s", code, body)
	}
	run := func(src string) []map[string]any {
		t.Helper()
		code, body := call("POST", "/code", map[string]any{"context": map[string]any{"id": ctx.ID, "language": "python"}, "code": src})
		if code != 200 {
			t.Fatalf("run %q: %d %s", src, code, body)
		}
		var evs []map[string]any
		sc := bufio.NewScanner(bytes.NewReader(body))
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			line := strings.TrimPrefix(sc.Text(), "data: ")
			if line == "" {
				continue
			}
			var ev map[string]any
			if err := json.Unmarshal([]byte(line), &ev); err != nil {
				t.Fatalf("bad event %q", line)
			}
			if ev["type"] != "ping" {
				evs = append(evs, ev)
			}
		}
		return evs
	}
	result := func(evs []map[string]any) (string, float64) {
		for _, ev := range evs {
			if ev["type"] == "result" {
				r, _ := ev["results"].(map[string]any)
				n, _ := ev["execution_count"].(float64)
				s, _ := r["text"].(string)
				return s, n
			}
		}
		t.Fatalf("no result event: %v", evs)
		return "", 0
	}

	first := run("x = 41\nprint('hello from the kernel')")
	var printed string
	for _, ev := range first {
		if ev["type"] == "stdout" {
			printed += ev["text"].(string)
		}
	}
	if printed != "hello from the kernel\n" {
		t.Fatalf("stdout %q: %v", printed, first)
	}
	if v, n := result(run("x + 1")); v != "42" || n != 2 {
		t.Fatalf("state across cells: %q count %v", v, n)
	}
	// Only a real IPython kernel has get_ipython(); the built-in driver
	// is plain python.
	if v, _ := result(run("type(get_ipython()).__name__")); v != "'ZMQInteractiveShell'" {
		t.Fatalf("not a Jupyter kernel: %q", v)
	}
	evs := run("1/0")
	var ename string
	for _, ev := range evs {
		if ev["type"] == "error" {
			e, _ := ev["error"].(map[string]any)
			ename, _ = e["ename"].(string)
		}
	}
	if ename != "ZeroDivisionError" {
		t.Fatalf("error event: %v", evs)
	}
	if code, body := call("DELETE", "/code/contexts/"+ctx.ID, nil); code != 200 && code != 204 {
		t.Fatalf("delete context: %d %s", code, body)
	}
	if code, _, _ := srv.do("DELETE", "/v1/sandboxes/"+created.ID, nil); code != 204 {
		t.Fatalf("delete sandbox: %d", code)
	}
}

// codeEvent is one execd stream event, as a client decodes it.
type codeEvent struct {
	Type           string         `json:"type"`
	Text           string         `json:"text"`
	ExecutionCount int            `json:"execution_count"`
	Results        map[string]any `json:"results"`
	Error          *struct {
		EName     string   `json:"ename"`
		EValue    string   `json:"evalue"`
		Traceback []string `json:"traceback"`
	} `json:"error"`
}

// codeAgent drives the code-context API of one sandbox's agent.
type codeAgent struct {
	t    *testing.T
	base string
	hdr  map[string]string
}

func (a *codeAgent) do(method, path string, body any) *http.Response {
	a.t.Helper()
	b, _ := json.Marshal(body)
	req, _ := http.NewRequest(method, a.base+path, bytes.NewReader(b))
	req.Header.Set("Content-Type", "application/json")
	for k, v := range a.hdr {
		req.Header.Set(k, v)
	}
	resp, err := (&http.Client{Timeout: 3 * time.Minute}).Do(req)
	if err != nil {
		a.t.Fatalf("%s %s: %v", method, path, err)
	}
	return resp
}

func (a *codeAgent) call(method, path string, body any) (int, []byte) {
	a.t.Helper()
	resp := a.do(method, path, body)
	defer resp.Body.Close()
	var buf bytes.Buffer
	buf.ReadFrom(resp.Body)
	return resp.StatusCode, buf.Bytes()
}

// context creates a context of language and returns its id.
func (a *codeAgent) context(language string) string {
	a.t.Helper()
	code, body := a.call("POST", "/code/context", map[string]any{"language": language})
	var c struct{ ID, Language string }
	if code != 200 || json.Unmarshal(body, &c) != nil || c.ID == "" || c.Language != language {
		a.t.Fatalf("create %s context: %d %s", language, code, body)
	}
	return c.ID
}

// events reads a stream to its end, pings dropped.
func (a *codeAgent) events(resp *http.Response) []codeEvent {
	a.t.Helper()
	var evs []codeEvent
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := strings.TrimPrefix(sc.Text(), "data: ")
		if line == "" {
			continue
		}
		var ev codeEvent
		if err := json.Unmarshal([]byte(line), &ev); err != nil {
			a.t.Fatalf("bad event %q", line)
		}
		if ev.Type != "ping" {
			evs = append(evs, ev)
		}
	}
	return evs
}

// run executes code in context id and returns its events.
func (a *codeAgent) run(id, src string) []codeEvent {
	a.t.Helper()
	resp := a.do("POST", "/code", map[string]any{"context": map[string]any{"id": id}, "code": src})
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		var buf bytes.Buffer
		buf.ReadFrom(resp.Body)
		a.t.Fatalf("run %q: %d %s", src, resp.StatusCode, buf.Bytes())
	}
	return a.events(resp)
}

// interruptAfterInit starts loop in context id, sends DELETE /code as soon
// as the init event has arrived, and returns the stream's last event.
func (a *codeAgent) interruptAfterInit(id, loop string) codeEvent {
	a.t.Helper()
	resp := a.do("POST", "/code", map[string]any{"context": map[string]any{"id": id}, "code": loop})
	defer resp.Body.Close()
	br := bufio.NewReader(resp.Body)
	first, err := br.ReadBytes('\n')
	var ev codeEvent
	if err != nil || json.Unmarshal(bytes.TrimPrefix(first, []byte("data: ")), &ev) != nil || ev.Type != "init" {
		a.t.Fatalf("first event %q: %v", first, err)
	}
	if code, body := a.call("DELETE", "/code?id="+id, nil); code != 200 {
		a.t.Fatalf("interrupt: %d %s", code, body)
	}
	done := make(chan []codeEvent, 1)
	go func() { done <- a.events(&http.Response{Body: io.NopCloser(br)}) }()
	select {
	case evs := <-done:
		if len(evs) == 0 {
			a.t.Fatal("the interrupted stream ended without a final event")
		}
		return evs[len(evs)-1]
	case <-time.After(90 * time.Second):
		a.t.Fatalf("the interrupt sent right after init was lost: %q still runs", loop)
		return codeEvent{}
	}
}

func codeStdout(evs []codeEvent) string {
	var b strings.Builder
	for _, ev := range evs {
		if ev.Type == "stdout" {
			b.WriteString(ev.Text)
		}
	}
	return b.String()
}

func codeResult(evs []codeEvent) string {
	for _, ev := range evs {
		if ev.Type == "result" {
			s, _ := ev.Results["text"].(string)
			return s
		}
	}
	return ""
}

// codeLanguage is what TestCodeLanguagesInSandbox runs in one language.
type codeLanguage struct {
	name        string
	kernel      string // a process of the Jupyter kernel, "" for a built-in driver
	define, use string // use prints 42 and (result != "") has a value containing result
	result      string
	fail, ename string
	loop        string // runs until interrupted
}

// TestCodeLanguagesInSandbox runs code contexts of every language the
// debian-kernels test image can run, through a real `moat serve` and the
// agent in the sandbox: Jupyter kernels chosen by their kernelspec's
// language (ipykernel for python, IRkernel for R, tslab for TypeScript)
// and the built-in drivers where the image has no kernel (Java through the
// JDK's jshell, JavaScript through node, bash). Each keeps state, streams
// output, reports values and errors and is interrupted by a DELETE /code
// sent right after init; contexts of all languages run cells at the same
// time; go has no kernel and is refused with a clear error. A second
// sandbox with EXECD_JUPYTER_KERNELS=off runs TypeScript on the built-in
// driver (Debian's node-typescript). Deleting the sandboxes leaves nothing.
func TestCodeLanguagesInSandbox(t *testing.T) {
	script := filepath.Join(testutil.RepoRoot(t), "scripts", "build-test-images.sh")
	out, err := exec.Command("bash", script, "debian-kernels").Output()
	if err != nil {
		t.Fatalf("build test image: %v (run scripts/build-test-images.sh debian-kernels)", err)
	}
	tarball := strings.TrimSpace(string(out))
	srv := newServer(t)
	const ref = "localhost/debian-kernels:e2e"
	if b, err := exec.Command(srv.bin, "image", "import", "--root", srv.root, ref, tarball).CombinedOutput(); err != nil {
		t.Fatalf("import: %v\n%s", err, b)
	}
	srv.start()
	create := func(env map[string]string) string {
		var c sandboxResp
		srv.mustJSON(202, "POST", "/v1/sandboxes", map[string]any{
			"image": map[string]any{"uri": ref}, "entrypoint": []string{"sleep", "infinity"}, "timeout": 900, "env": env,
		}, &c)
		return c.ID
	}
	id := create(nil)
	base, hdr := srv.agent(id)
	a := &codeAgent{t: t, base: base, hdr: hdr}

	langs := []codeLanguage{
		{name: "python", kernel: "ipykernel", define: "x = 41", use: "print(x + 1)\nx + 1", result: "42",
			fail: "1/0", ename: "ZeroDivisionError", loop: "while True:\n    pass"},
		{name: "r", kernel: "IRkernel", define: "x <- 41", use: "cat(x + 1, \"\\n\", sep = \"\")\nx + 1", result: "42",
			fail: "stop(\"no\")", ename: "ERROR", loop: "while (TRUE) {}"},
		{name: "typescript", kernel: "tslab", define: "let x: number = 41", use: "console.log(x + 1)",
			fail: "throw new RangeError(\"no\")", ename: "Error", loop: "while (true) {}"},
		{name: "java", define: "int x = 41;", use: "System.out.println(x + 1);\nx + 1", result: "42",
			fail: "Object o = null;\no.hashCode();", ename: "EvalException", loop: "while (true) {}"},
		{name: "javascript", define: "var x = 41", use: "console.log(x + 1); x + 1", result: "42",
			fail: "null.f()", ename: "TypeError", loop: "for (;;) {}"},
		{name: "bash", define: "x=41", use: "echo $((x+1))", loop: "while :; do :; done"},
	}
	ids := map[string]string{}
	for _, l := range langs {
		t.Run(l.name, func(t *testing.T) {
			a := &codeAgent{t: t, base: base, hdr: hdr}
			ids[l.name] = a.context(l.name)
			cid := ids[l.name]
			if l.kernel != "" {
				// The context is the kernel, not a driver: its process runs.
				ps := shellOut(t, srv, id, "cat /proc/[0-9]*/cmdline | tr '\\0' ' '")
				if !strings.Contains(ps, l.kernel) {
					t.Fatalf("no %s process in the sandbox: %s", l.kernel, ps)
				}
			}
			if evs := a.run(cid, l.define); evs[len(evs)-1].Type != "execution_complete" {
				t.Fatalf("define: %+v", evs)
			}
			evs := a.run(cid, l.use)
			if got := codeStdout(evs); !strings.HasPrefix(got, "42") || evs[len(evs)-1].Type != "execution_complete" {
				t.Fatalf("use: stdout %q, %+v", got, evs)
			}
			if l.result != "" && !strings.Contains(codeResult(evs), l.result) {
				t.Fatalf("use: result %q, %+v", codeResult(evs), evs)
			}
			if l.fail != "" {
				evs := a.run(cid, l.fail)
				last := evs[len(evs)-1]
				if last.Type != "error" || last.Error == nil || !strings.Contains(last.Error.EName, l.ename) {
					t.Fatalf("fail: %+v", evs)
				}
			}
			if last := a.interruptAfterInit(cid, l.loop); last.Type != "error" {
				t.Fatalf("interrupted loop ended with %+v", last)
			}
			if evs := a.run(cid, l.use); !strings.HasPrefix(codeStdout(evs), "42") {
				t.Fatalf("after the interrupt: %+v", evs)
			}
		})
	}
	if t.Failed() {
		return
	}

	// Every context runs a cell at the same time; each sees its own state.
	var wg sync.WaitGroup
	results := make(map[string]string)
	var mu sync.Mutex
	for _, l := range langs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			evs := a.run(ids[l.name], l.use)
			mu.Lock()
			results[l.name] = codeStdout(evs)
			mu.Unlock()
		}()
	}
	wg.Wait()
	for name, got := range results {
		if !strings.HasPrefix(got, "42") {
			t.Errorf("%s, run concurrently: stdout %q", name, got)
		}
	}

	code, body := a.call("POST", "/code/context", map[string]any{"language": "go"})
	if code != 501 || !strings.Contains(string(body), "no Jupyter kernel for go") {
		t.Fatalf("go: %d %s", code, body)
	}

	// Built-in drivers only: TypeScript through node and Debian's
	// node-typescript.
	plain := create(map[string]string{"EXECD_JUPYTER_KERNELS": "off"})
	pbase, phdr := srv.agent(plain)
	p := &codeAgent{t: t, base: pbase, hdr: phdr}
	ts := p.context("typescript")
	p.run(ts, "interface P { n: number }\nconst mk = (n: number): P => ({n})")
	if evs := p.run(ts, "console.log(mk(41 + 1).n); mk(42).n"); codeStdout(evs) != "42\n" || codeResult(evs) != "42" {
		t.Fatalf("typescript driver: %+v", evs)
	}
	if ps := shellOut(t, srv, plain, "cat /proc/[0-9]*/cmdline | tr '\\0' ' '"); strings.Contains(ps, "tslab") {
		t.Fatalf("EXECD_JUPYTER_KERNELS=off still started tslab: %s", ps)
	}
	if last := p.interruptAfterInit(ts, "while (true) {}"); last.Type != "error" {
		t.Fatalf("typescript driver interrupt: %+v", last)
	}

	for _, sid := range []string{id, plain} {
		if code, _, _ := srv.do("DELETE", "/v1/sandboxes/"+sid, nil); code != 204 {
			t.Fatalf("delete sandbox: %d", code)
		}
	}
}

// shellOut runs cmd in sandbox id and returns its stdout.
func shellOut(t *testing.T, srv *server, id, cmd string) string {
	t.Helper()
	out, _ := shell(t, srv, id, cmd)
	return out
}

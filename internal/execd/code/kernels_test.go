package code

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/moat-sandbox/moat/internal/execd/exectest"
	"github.com/moat-sandbox/moat/internal/execd/wire"
)

// hostKernelAs installs the host's python kernel under a kernelspec that
// declares language (the kernel is real; only its declared language
// differs) and returns the kernelspec directory.
func hostKernelAs(t *testing.T, name, language string) string {
	t.Helper()
	sys := FindKernelSpec(KernelDirs(os.Environ()), "python", os.Environ())
	if sys == nil {
		t.Skip("no Jupyter python kernel on this host (apt-get install python3-ipykernel)")
	}
	dir := t.TempDir()
	spec := *sys
	spec.Language = language
	data, _ := json.Marshal(spec)
	os.MkdirAll(filepath.Join(dir, name), 0o755)
	if err := os.WriteFile(filepath.Join(dir, name, "kernel.json"), data, 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

// TestKernelForAnyLanguage: a context's kernel is chosen by the language
// its kernelspec declares, for any language, case-insensitively; a
// language with neither a kernel nor a built-in driver is refused with a
// {code, message} that says so, and nothing is left behind.
func TestKernelForAnyLanguage(t *testing.T) {
	dir := hostKernelAs(t, "klingon-kernel", "Klingon")
	e := newTestEnv(t, func(o *Options) { o.KernelDirs = []string{dir} })
	for _, lang := range []string{"klingon", "KLINGON"} {
		id := e.createContext(lang)
		c, _ := e.svc.contexts.Get(id)
		if !isKernel(c) {
			t.Fatalf("%s: the context is not kernel-backed", lang)
		}
		if evs := e.runCode(id, "6 * 7"); resultText(evs) != "42" {
			t.Fatalf("%s: %+v", lang, evs)
		}
	}
	st, b := e.Call("GET", "/code/contexts?language=Klingon", nil)
	var infos []ContextInfo
	if json.Unmarshal(b, &infos); st != 200 || len(infos) != 2 {
		t.Fatalf("list by language: %d %s", st, b)
	}

	st, b = e.Call("POST", "/code/context", map[string]any{"language": "vulcan"})
	exectest.WantError(t, st, b, 400, wire.CodeInvalidRequestBody)
	if !strings.Contains(string(b), "no Jupyter kernel") {
		t.Fatalf("message does not say why: %s", b)
	}
	st, b = e.Call("POST", "/code/context", map[string]any{"language": "go"})
	exectest.WantError(t, st, b, 501, wire.CodeRuntimeError)
	if !strings.Contains(string(b), "no Jupyter kernel for go") {
		t.Fatalf("message does not say why: %s", b)
	}
	for _, bad := range []string{"a b", "x/../y", strings.Repeat("l", 65)} {
		st, b = e.Call("POST", "/code/context", map[string]any{"language": bad})
		exectest.WantError(t, st, b, 400, wire.CodeInvalidRequestBody)
	}
	if left, _ := filepath.Glob(filepath.Join(e.run.Dir(), "code-*")); len(left) != 2 {
		t.Fatalf("context dirs: %v (want the 2 live contexts')", left)
	}
}

// TestKernelInterruptAfterInit: an interrupt sent as soon as the init
// event arrives, before ipykernel runs the cell (it ignores SIGINT until
// then), still interrupts it.
func TestKernelInterruptAfterInit(t *testing.T) {
	e := kernelEnv(t)
	id := e.createContext("python")
	for range 3 {
		interruptAfterInit(t, e, id)
		if evs := e.runCode(id, "6 * 7"); resultText(evs) != "42" {
			t.Fatalf("after interrupt: %+v", evs)
		}
	}
}

// TestConcurrentKernelContexts creates kernel contexts at once (their
// ports must not collide) and runs cells in all of them concurrently:
// each sees only its own state and output.
func TestConcurrentKernelContexts(t *testing.T) {
	e := kernelEnv(t)
	const n = 3
	ids := make([]string, n)
	var wg sync.WaitGroup
	for i := range ids {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ids[i] = e.createContext("python")
		}()
	}
	wg.Wait()
	for i, id := range ids {
		e.runCode(id, "me = "+itoa(i))
	}
	errs := make(chan string, n*5)
	for i, id := range ids {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for k := range 5 {
				evs := e.runCode(id, "import time\nfor j in range(3):\n    print(me, j, flush=True)\n    time.sleep(0.01)\nme * 100 + "+itoa(k))
				want := ""
				for j := range 3 {
					want += itoa(i) + " " + itoa(j) + "\n"
				}
				if stdout(evs) != want || resultText(evs) != itoa(i*100+k) {
					errs <- "context " + itoa(i) + ": " + stdout(evs) + " " + eventTypes(evs)
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for msg := range errs {
		t.Error(msg)
	}
}

package code

import (
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/moat-sandbox/moat/internal/execd/exectest"
	"github.com/moat-sandbox/moat/internal/execd/wire"
)

// driverCells are, per language, cells that define state, use it (printing
// 42 and, except bash, having the value 42), fail with an error whose
// ename (and, where set, evalue) is given, and loop until interrupted.
var driverCells = map[string]struct {
	bin                      string
	define, use, fail, ename string
	evalue, loop             string
}{
	"python":     {bin: "python3", define: "x = 41", use: "print(x + 1)\nx + 1", fail: "1/0", ename: "ZeroDivisionError", loop: "while True:\n    pass"},
	"javascript": {bin: "node", define: "var x = 41", use: "console.log(x + 1); x + 1", fail: "null.f()", ename: "TypeError", loop: "for (;;) {}"},
	"typescript": {bin: "node", define: "let x: number = 41\ninterface P { n: number }\nfunction mk(n: number): P { return {n} }", use: "console.log(mk(x + 1).n); mk(x + 1).n", fail: "throw new RangeError('no')", ename: "RangeError", loop: "while (true) {}"},
	"java":       {bin: "jshell", define: "int x = 41;", use: "System.out.println(x + 1);\nx + 1", fail: "int z = 10 / 0;", ename: "EvalException", evalue: "java.lang.ArithmeticException: / by zero", loop: "while (true) {}"},
	"bash":       {bin: "bash", define: "x=41", use: "echo $((x+1))", fail: "", loop: "while :; do :; done"},
}

// TestBuiltinDrivers runs every built-in driver the host has (the CI host
// has them all: scripts/install-deps.sh installs python3, node with
// Debian's node-typescript, and a JDK): state across cells, the value of
// the last expression, an error with its ename, and an interrupt sent
// right after the init event (before the interpreter has begun the cell),
// after which the context still works.
func TestBuiltinDrivers(t *testing.T) {
	e := newTestEnv(t, func(o *Options) { o.NoKernels = true })
	for _, lang := range []string{"python", "javascript", "typescript", "java", "bash"} {
		c := driverCells[lang]
		t.Run(lang, func(t *testing.T) {
			e := e.with(t)
			if _, err := exec.LookPath(c.bin); err != nil {
				t.Fatalf("%s is not installed (scripts/install-deps.sh installs it)", c.bin)
			}
			id := e.createContext(lang)
			if evs := e.runCode(id, c.define); evs[len(evs)-1].Type != wire.EvExecutionComplete {
				t.Fatalf("define: %+v", evs)
			}
			evs := e.runCode(id, c.use)
			if stdout(evs) != "42\n" || evs[len(evs)-1].Type != wire.EvExecutionComplete {
				t.Fatalf("use: %+v", evs)
			}
			if lang != "bash" && resultText(evs) != "42" {
				t.Fatalf("result = %v (%+v)", resultText(evs), evs)
			}
			if c.fail != "" {
				evs := e.runCode(id, c.fail)
				last := evs[len(evs)-1]
				if last.Type != wire.EvError || last.Error.EName != c.ename || evs[len(evs)-2].Type != wire.EvStatus {
					t.Fatalf("error: %+v", evs)
				}
				if c.evalue != "" && (last.Error.EValue != c.evalue || len(last.Error.Traceback) == 0 || last.Error.Traceback[0] != c.evalue) {
					t.Fatalf("error value and traceback: %+v", last.Error)
				}
			}
			interruptAfterInit(t, e, id)
			evs = e.runCode(id, c.use)
			if stdout(evs) != "42\n" {
				t.Fatalf("after interrupt: %+v", evs)
			}
		})
	}
}

// interruptAfterInit starts an endless cell and sends DELETE /code as soon
// as the init event has arrived: the cell must end with an error.
func interruptAfterInit(t *testing.T, e *testEnv, id string) {
	t.Helper()
	c, err := e.svc.contexts.Get(id)
	if err != nil {
		t.Fatal(err)
	}
	interruptCodeAfterInit(t, e, id, driverCells[c.key].loop)
}

// interruptCodeAfterInit runs code (which must not end by itself) in
// context id and sends DELETE /code as soon as the init event has arrived:
// the cell must end with an error.
func interruptCodeAfterInit(t *testing.T, e *testEnv, id, code string) {
	t.Helper()
	resp := e.Do("POST", "/code", map[string]any{"context": map[string]any{"id": id}, "code": code})
	defer resp.Body.Close()
	sr := exectest.NewStreamReader(t, resp.Body)
	if ev := sr.Next(); ev.Type != wire.EvInit {
		t.Fatalf("first event %+v", ev)
	}
	if st, b := e.Call("DELETE", "/code?id="+id, nil); st != 200 {
		t.Fatalf("interrupt: %d %s", st, b)
	}
	if ev := sr.Final(30 * time.Second); ev.Type != wire.EvError {
		t.Fatalf("the interrupted loop ended with %+v", ev)
	}
}

func stdout(evs []wire.Event) string {
	var b strings.Builder
	for _, ev := range evs {
		if ev.Type == wire.EvStdout {
			b.WriteString(ev.Text)
		}
	}
	return b.String()
}

// TestConcurrentContexts runs cells in several contexts of one agent at
// once: each sees only its own state and output.
func TestConcurrentContexts(t *testing.T) {
	e := newTestEnv(t, func(o *Options) { o.NoKernels = true })
	const n = 4
	ids := make([]string, n)
	for i := range ids {
		ids[i] = e.createContext("python")
		e.runCode(ids[i], "me = "+itoa(i))
	}
	var wg sync.WaitGroup
	errs := make(chan string, n*10)
	for i, id := range ids {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for k := range 10 {
				evs := e.runCode(id, "import time\nfor j in range(3):\n    print(me, j)\n    time.sleep(0.01)\nme * 100 + "+itoa(k))
				want := ""
				for j := range 3 {
					want += itoa(i) + " " + itoa(j) + "\n"
				}
				if stdout(evs) != want || resultText(evs) != itoa(i*100+k) {
					errs <- "context " + itoa(i) + ": " + stdout(evs)
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

func itoa(n int) string { return strconv.Itoa(n) }

package execd

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/moat-sandbox/moat/internal/execd/exectest"
	"github.com/moat-sandbox/moat/internal/execd/proc"
	"github.com/moat-sandbox/moat/internal/execd/wire"
	"github.com/moat-sandbox/moat/internal/testutil"
)

// agentProc is the test binary running as the agent (see helperEnv).
type agentProc struct {
	cmd    *exec.Cmd
	url    string
	stderr *lockedBuffer
	done   chan error
}

func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// startAgent starts an agent without its E2B faces (which would take the
// fixed ports 49983 and 49999 on the test host).
func startAgent(t *testing.T, newPIDNS bool, token string, entry ...string) *agentProc {
	t.Helper()
	return startAgentArgs(t, newPIDNS, token, []string{"--envd-listen", "off", "--code-interpreter-listen", "off"}, entry...)
}

// startAgentArgs starts an agent with extra flags.
func startAgentArgs(t *testing.T, newPIDNS bool, token string, extra []string, entry ...string) *agentProc {
	t.Helper()
	port := freePort(t)
	conf := t.TempDir() + "/agent.json"
	data, _ := json.Marshal(map[string]any{"token": token, "port": port})
	os.WriteFile(conf, data, 0o600)
	args := append([]string{"--config", conf, "--listen", fmt.Sprintf("127.0.0.1:%d", port), "--state-dir", t.TempDir()}, extra...)
	if len(entry) > 0 {
		args = append(append(args, "--"), entry...)
	}
	argsJSON, _ := json.Marshal(args)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), helperEnv+"="+string(argsJSON), "MOAT_LEAK=1")
	stderr := &lockedBuffer{}
	cmd.Stderr = stderr
	cmd.Stdout = stderr
	if newPIDNS {
		cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWPID}
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	a := &agentProc{cmd: cmd, url: fmt.Sprintf("http://127.0.0.1:%d", port), stderr: stderr, done: make(chan error, 1)}
	go func() { a.done <- cmd.Wait() }()
	t.Cleanup(func() {
		// A SIGTERM first: the agent's shutdown kills the process groups
		// it started (code kernels run in their own and outlive a SIGKILL
		// of an agent that is not PID 1).
		cmd.Process.Signal(syscall.SIGTERM)
		select {
		case err := <-a.done:
			a.done <- err
		case <-time.After(10 * time.Second):
			cmd.Process.Kill()
		}
		<-a.done
		if t.Failed() {
			t.Logf("agent log:\n%s", stderr.String())
		}
	})
	deadline := time.Now().Add(10 * time.Second)
	for {
		req, _ := http.NewRequest("GET", a.url+"/ping", nil)
		req.Header.Set(TokenHeader, token)
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				return a
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("agent did not come up: %v\n%s", err, stderr.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (a *agentProc) run(t *testing.T, token, command string) []wire.Event {
	t.Helper()
	body, _ := json.Marshal(map[string]any{"command": command})
	req, _ := http.NewRequest("POST", a.url+"/command", bytes.NewReader(body))
	req.Header.Set(TokenHeader, token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	return exectest.ReadEvents(t, data)
}

func (a *agentProc) wait(t *testing.T, d time.Duration) error {
	t.Helper()
	select {
	case err := <-a.done:
		a.done <- err
		return err
	case <-time.After(d):
		t.Fatalf("agent did not exit within %v", d)
		return nil
	}
}

func TestAgentEntrypointAndSIGTERM(t *testing.T) {
	dir := t.TempDir()
	marker, ready := dir+"/term", dir+"/ready"
	// The entrypoint says when its trap is set: a SIGTERM that arrives before
	// the shell ran `trap` (likely on a loaded machine) kills it untrapped.
	a := startAgent(t, false, "tok", "sh", "-c", "trap 'touch "+marker+"; exit 0' TERM; touch "+ready+"; while :; do sleep 0.05; done")
	for deadline := time.Now().Add(10 * time.Second); !fileExists(ready); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("entrypoint did not start within 10s")
		}
	}
	evs := a.run(t, "tok", `echo "${EXECD_ACCESS_TOKEN:-none} ${MOAT_LEAK:-none}"`)
	if evs[1].Text != "none none" {
		t.Fatalf("child env leaks agent vars: %+v", evs)
	}
	a.cmd.Process.Signal(syscall.SIGTERM)
	if err := a.wait(t, 10*time.Second); err != nil {
		t.Fatalf("agent exit: %v", err)
	}
	if !fileExists(marker) {
		t.Fatal("SIGTERM was not forwarded to the entrypoint")
	}
}

func TestAgentKeepsServingAfterEntrypointExit(t *testing.T) {
	a := startAgent(t, false, "", "sh", "-c", "exit 5")
	time.Sleep(300 * time.Millisecond)
	if evs := a.run(t, "", "echo alive"); evs[1].Text != "alive" {
		t.Fatalf("events = %+v", evs)
	}
	if !strings.Contains(a.stderr.String(), "exit status 5") {
		t.Fatalf("entrypoint exit not logged:\n%s", a.stderr.String())
	}
	a.cmd.Process.Signal(syscall.SIGTERM)
	if err := a.wait(t, 10*time.Second); err != nil {
		t.Fatal(err)
	}
}

// TestAgentPID1Reaping runs the agent as PID 1 of a new PID namespace and
// checks that orphans are reaped while the command runner still gets
// every exit status right.
func TestAgentPID1Reaping(t *testing.T) {
	testutil.RequiresRoot(t)
	a := startAgent(t, true, "", "sleep", "1000")
	// Orphans: the inner shells exit at once, their sleeps re-parent to PID 1.
	for range 5 {
		a.run(t, "", "(sleep 0.1 &) ; (sleep 0.1 &)")
	}
	a.run(t, "", "(sleep 0.77 &)")
	if n := childrenWithArg(t, a.cmd.Process.Pid, "0.77"); n != 1 {
		t.Fatalf("orphan not re-parented to the agent (found %d)", n)
	}
	time.Sleep(time.Second) // let it exit: it must be reaped, not left a zombie
	var wg sync.WaitGroup
	for i := range 20 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			evs := a.run(t, "", fmt.Sprintf("sleep 0.0%d; exit %d", i%10, i+1))
			last := evs[len(evs)-1]
			if last.Type != wire.EvError || last.Error.EValue != strconv.Itoa(i+1) {
				t.Errorf("command %d: last = %+v", i, last)
			}
		}()
	}
	wg.Wait()
	time.Sleep(500 * time.Millisecond)
	if z := zombieChildren(t, a.cmd.Process.Pid); len(z) > 0 {
		t.Fatalf("zombies under the agent: %v", z)
	}
	a.cmd.Process.Signal(syscall.SIGTERM)
	if err := a.wait(t, 10*time.Second); err != nil {
		t.Fatal(err)
	}
}

// zombieChildren lists zombie processes whose parent is ppid (host view).
func zombieChildren(t *testing.T, ppid int) []int {
	t.Helper()
	ents, _ := os.ReadDir("/proc")
	var out []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		data, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		s := string(data)
		f := strings.Fields(s[strings.LastIndexByte(s, ')')+2:])
		if len(f) > 1 && f[0] == "Z" && f[1] == strconv.Itoa(ppid) {
			out = append(out, pid)
		}
	}
	return out
}

func TestParseArgs(t *testing.T) {
	conf := t.TempDir() + "/agent.json"
	os.WriteFile(conf, []byte(`{"token":"filetok","port":1234}`), 0o600)
	env := map[string]string{}
	getenv := func(k string) string { return env[k] }
	cfg, err := ParseArgs([]string{"--config", conf, "--", "sleep", "1"}, getenv)
	if err != nil || cfg.Token != "filetok" || cfg.Listen != "0.0.0.0:1234" || strings.Join(cfg.Entrypoint, " ") != "sleep 1" || cfg.Grace != 0 {
		t.Fatalf("cfg = %+v, %v", cfg, err)
	}
	env["EXECD_ACCESS_TOKEN"] = "envtok"
	env["EXECD_API_GRACE_SHUTDOWN"] = "3s"
	cfg, err = ParseArgs([]string{"--config", conf, "--port", "99"}, getenv)
	if err != nil || cfg.Token != "envtok" || cfg.Listen != "0.0.0.0:99" || cfg.Grace != 3*time.Second || cfg.Entrypoint != nil {
		t.Fatalf("cfg = %+v, %v", cfg, err)
	}
	env["EXECD_API_GRACE_SHUTDOWN"] = "250"
	cfg, _ = ParseArgs([]string{"--listen", "127.0.0.1:5"}, getenv)
	if cfg.Grace != 250*time.Millisecond || cfg.Listen != "127.0.0.1:5" {
		t.Fatalf("cfg = %+v", cfg)
	}
	if cfg.NoKernels {
		t.Fatal("Jupyter kernels are off by default")
	}
	env["EXECD_JUPYTER_KERNELS"] = "off"
	if cfg, err = ParseArgs(nil, getenv); err != nil || !cfg.NoKernels {
		t.Fatalf("EXECD_JUPYTER_KERNELS=off: %+v, %v", cfg, err)
	}
	env["EXECD_JUPYTER_KERNELS"] = "maybe"
	if _, err := ParseArgs(nil, getenv); err == nil {
		t.Fatal("EXECD_JUPYTER_KERNELS=maybe accepted")
	}
	delete(env, "EXECD_JUPYTER_KERNELS")
	for _, bad := range [][]string{{"--config", "/nonexistent"}, {"--nope"}, {"--listen", "noport"}} {
		if _, err := ParseArgs(bad, getenv); err == nil {
			t.Errorf("ParseArgs(%q) succeeded", bad)
		}
	}
	if got := proc.ChildEnv([]string{"A=1", "EXECD_ACCESS_TOKEN=x", "MOAT_X=2", "B=3"}); strings.Join(got, ",") != "A=1,B=3" {
		t.Fatalf("childEnv = %v", got)
	}
}

// childrenWithArg counts live children of ppid with arg in their cmdline.
func childrenWithArg(t *testing.T, ppid int, arg string) int {
	t.Helper()
	ents, _ := os.ReadDir("/proc")
	n := 0
	for _, e := range ents {
		data, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		s := string(data)
		f := strings.Fields(s[strings.LastIndexByte(s, ')')+2:])
		if len(f) < 2 || f[1] != strconv.Itoa(ppid) {
			continue
		}
		cl, _ := os.ReadFile("/proc/" + e.Name() + "/cmdline")
		if bytes.Contains(cl, []byte(arg)) {
			n++
		}
	}
	return n
}

type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/moat-sandbox/moat/internal/localregistry"
	"github.com/moat-sandbox/moat/internal/testutil"
)

// startRegistry serves an in-process OCI registry on loopback holding a
// busybox image built from the host's busybox-static, and returns its
// reference.
func startRegistry(t *testing.T) string {
	t.Helper()
	reg, err := localregistry.Start()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { reg.Close() })
	ref, err := reg.PushDir(context.Background(), testutil.BusyboxRootfs(t), "e2e/busybox:1",
		[]string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin", "FROM_IMAGE=yes"})
	if err != nil {
		t.Fatal(err)
	}
	return ref
}

// server is one `moat serve` process under test.
type server struct {
	t       *testing.T
	bin     string
	root    string
	runRoot string
	addr    string
	key     string
	bridge  string
	subnet  string
	cmd     *exec.Cmd
	logf    *os.File
}

func freePort(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// newServer prepares (but does not start) a server with its own state
// dirs, bridge and subnet, so it cannot disturb a moat on the same host.
func newServer(t *testing.T, bridge, subnet string) *server {
	t.Helper()
	testutil.RequiresRoot(t)
	dir := t.TempDir()
	s := &server{t: t, bin: testutil.MoatBinary(t), root: filepath.Join(dir, "root"), runRoot: filepath.Join(dir, "run"),
		addr: freePort(t), key: "e2e-key-0123456789", bridge: bridge, subnet: subnet}
	lf, err := os.Create(filepath.Join(dir, "server.log"))
	if err != nil {
		t.Fatal(err)
	}
	s.logf = lf
	// Sandbox IPs are reused across tests: a keep-alive connection to a
	// sandbox of an earlier test must never be reused for a new one.
	dropIdleConns(t)
	t.Cleanup(func() {
		s.deleteAll()
		s.stop()
		lf.Close()
		if t.Failed() {
			b, _ := os.ReadFile(lf.Name())
			t.Logf("server log:\n%s", tail(string(b), 6000))
		}
	})
	return s
}

func tail(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}

func (s *server) start(extra ...string) {
	s.t.Helper()
	args := append([]string{"serve", "--root", s.root, "--run-root", s.runRoot, "--listen", s.addr,
		"--bridge", s.bridge, "--subnet", s.subnet, "--log-level", "debug",
		// Tests pull only from their loopback registry: a typo in an image
		// name must not reach out to a public registry.
		"--allow-registry", "loopback"}, extra...)
	s.cmd = exec.Command(s.bin, args...)
	s.cmd.Env = append(os.Environ(), "MOAT_API_KEY="+s.key)
	s.cmd.Stdout, s.cmd.Stderr = s.logf, s.logf
	s.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := s.cmd.Start(); err != nil {
		s.t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		resp, err := http.Get("http://" + s.addr + "/health")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				return
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	s.t.Fatal("server did not become healthy")
}

// deleteAll removes every pool and sandbox of a running server, so a
// failed test leaves nothing behind either.
func (s *server) deleteAll() {
	if s.cmd == nil {
		return
	}
	var pools struct{ Items []struct{ Name string } }
	if code, b, _ := s.do("GET", "/v1/pools", nil); code == 200 {
		json.Unmarshal(b, &pools)
	}
	for _, p := range pools.Items {
		s.do("DELETE", "/v1/pools/"+p.Name, nil)
	}
	var list struct{ Items []struct{ ID string } }
	if code, b, _ := s.do("GET", "/v1/sandboxes?pageSize=1000", nil); code == 200 {
		json.Unmarshal(b, &list)
	}
	for _, sb := range list.Items {
		s.do("DELETE", "/v1/sandboxes/"+sb.ID, nil)
	}
}

// kill9 kills the server with SIGKILL, as a crash would.
func (s *server) kill9() {
	if s.cmd == nil || s.cmd.Process == nil {
		return
	}
	s.cmd.Process.Signal(syscall.SIGKILL)
	s.cmd.Wait()
	s.cmd = nil
}

// stop shuts the server down gracefully.
func (s *server) stop() {
	if s.cmd == nil || s.cmd.Process == nil {
		return
	}
	s.cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan struct{})
	go func() { s.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		s.cmd.Process.Kill()
		<-done
	}
	s.cmd = nil
}

// do sends an API request; body may be nil, a []byte, or a value to marshal.
func (s *server) do(method, path string, body any, hdr ...string) (int, []byte, http.Header) {
	s.t.Helper()
	var r io.Reader
	switch b := body.(type) {
	case nil:
	case []byte:
		r = bytes.NewReader(b)
	default:
		j, _ := json.Marshal(b)
		r = bytes.NewReader(j)
	}
	req, _ := http.NewRequest(method, "http://"+s.addr+path, r)
	req.Header.Set("OPEN-SANDBOX-API-KEY", s.key)
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		if hdr[i+1] == "" {
			req.Header.Del(hdr[i])
		} else {
			req.Header.Set(hdr[i], hdr[i+1])
		}
	}
	resp, err := (&http.Client{Timeout: 60 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}).Do(req)
	if err != nil {
		s.t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	out, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, out, resp.Header
}

func (s *server) mustJSON(code int, method, path string, body any, into any) {
	s.t.Helper()
	got, out, _ := s.do(method, path, body)
	if got != code {
		s.t.Fatalf("%s %s: status %d, want %d: %s", method, path, got, code, out)
	}
	if into != nil {
		if err := json.Unmarshal(out, into); err != nil {
			s.t.Fatalf("%s %s: decode %s: %v", method, path, out, err)
		}
	}
}

// event is one execd stream event.
type event struct {
	Type          string `json:"type"`
	Text          string `json:"text"`
	ExecutionTime *int64 `json:"execution_time"`
	Error         *struct {
		Ename, Evalue string
		Traceback     []string
	} `json:"error"`
}

// runCommand runs a foreground command through the agent at base (an
// http:// URL) and returns the decoded events.
func runCommand(t *testing.T, base string, hdr map[string]string, command string) []event {
	t.Helper()
	body, _ := json.Marshal(map[string]any{"command": command})
	req, _ := http.NewRequestWithContext(context.Background(), "POST", base+"/command", bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	// No keep-alive: sandbox addresses are reused after deletes (and across
	// server crashes in the chaos test), and an idle connection to a
	// deleted sandbox must never carry a command for its successor.
	hc := &http.Client{Timeout: 60 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatalf("POST /command: %v", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("POST /command: status %d: %s", resp.StatusCode, b)
	}
	if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "text/event-stream") {
		t.Fatalf("content type %q", ct)
	}
	var evs []event
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := strings.TrimPrefix(sc.Text(), "data: ")
		if line == "" {
			continue
		}
		var e event
		if err := json.Unmarshal([]byte(line), &e); err != nil {
			t.Fatalf("bad event %q: %v", line, err)
		}
		if e.Type != "ping" {
			evs = append(evs, e)
		}
	}
	return evs
}

// stdoutOf joins the stdout events.
func stdoutOf(evs []event) string {
	var lines []string
	for _, e := range evs {
		if e.Type == "stdout" {
			lines = append(lines, e.Text)
		}
	}
	return strings.Join(lines, "\n")
}

func assertCompleted(t *testing.T, evs []event) {
	t.Helper()
	if len(evs) < 2 || evs[0].Type != "init" || len(evs[0].Text) != 32 {
		t.Fatalf("stream does not start with init and a 32-hex id: %+v", evs)
	}
	last := evs[len(evs)-1]
	if last.Type != "execution_complete" || last.ExecutionTime == nil {
		t.Fatalf("stream does not end with execution_complete: %+v", evs)
	}
}

// dropIdleConns closes the test process's kept-alive HTTP connections: a
// sandbox address reused from an earlier test (or -count run) would
// otherwise get a pooled connection of a dead sandbox, which the new one
// resets.
func dropIdleConns(t *testing.T) {
	http.DefaultTransport.(*http.Transport).CloseIdleConnections()
	t.Cleanup(http.DefaultTransport.(*http.Transport).CloseIdleConnections)
}

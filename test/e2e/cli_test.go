package e2e

import (
	"bufio"
	"bytes"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/creack/pty"
)

// cliRun is the outcome of one `moat` CLI invocation.
type cliRun struct {
	stdout, stderr string
	code           int
}

// cli runs the moat binary against srv with stdin (may be nil).
func cli(t *testing.T, srv *server, stdin []byte, args ...string) cliRun {
	t.Helper()
	cmd := cliCmd(srv, args...)
	if stdin != nil {
		cmd.Stdin = bytes.NewReader(stdin)
	}
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	done := make(chan error, 1)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { done <- cmd.Wait() }()
	var err error
	select {
	case err = <-done:
	case <-time.After(2 * time.Minute):
		cmd.Process.Kill()
		t.Fatalf("moat %s: timed out", strings.Join(args, " "))
	}
	r := cliRun{stdout: out.String(), stderr: errOut.String()}
	var ee *exec.ExitError
	switch {
	case errors.As(err, &ee):
		r.code = ee.ExitCode()
	case err != nil:
		t.Fatalf("moat %s: %v", strings.Join(args, " "), err)
	}
	return r
}

func cliCmd(srv *server, args ...string) *exec.Cmd {
	cmd := exec.Command(srv.bin, args...)
	cmd.Env = append(os.Environ(), "MOAT_SERVER=http://"+srv.addr, "OPEN_SANDBOX_API_KEY="+srv.key, "TERM=dumb")
	return cmd
}

// mustCLI runs the CLI and fails unless it exits with code.
func mustCLI(t *testing.T, srv *server, code int, args ...string) cliRun {
	t.Helper()
	r := cli(t, srv, nil, args...)
	if r.code != code {
		t.Fatalf("moat %s: exit %d, want %d\nstdout: %s\nstderr: %s", strings.Join(args, " "), r.code, code, r.stdout, r.stderr)
	}
	return r
}

func TestCLI(t *testing.T) {
	srv := newServer(t)
	ref := startRegistry(t)
	srv.start()

	// create (waits for Running by default) prints the ID.
	r := mustCLI(t, srv, 0, "sandbox", "create", "--image", ref, "--timeout", "10m", "-e", "GREETING=hello",
		"-m", "team=cli", "-m", "case=e2e", "-r", "cpu=500m,memory=256Mi", "-q")
	id := strings.TrimSpace(r.stdout)
	if id == "" || strings.ContainsAny(id, " \n") {
		t.Fatalf("create printed %q", r.stdout)
	}

	t.Run("ls", func(t *testing.T) {
		var list struct {
			Items []sandboxResp
		}
		r := mustCLI(t, srv, 0, "sb", "ls", "-o", "json", "--metadata", "team=cli", "--state", "Running")
		if err := json.Unmarshal([]byte(r.stdout), &list); err != nil {
			t.Fatalf("ls -o json: %v\n%s", err, r.stdout)
		}
		if len(list.Items) != 1 || list.Items[0].ID != id || list.Items[0].Metadata["case"] != "e2e" || list.Items[0].Status.State != "Running" {
			t.Fatalf("ls -o json = %+v", list.Items)
		}
		r = mustCLI(t, srv, 0, "sb", "ls", "-o", "json", "--metadata", "team=other")
		if err := json.Unmarshal([]byte(r.stdout), &list); err != nil || len(list.Items) != 0 {
			t.Fatalf("ls filtered: %v %s", err, r.stdout)
		}
		r = mustCLI(t, srv, 0, "sb", "ls")
		if !strings.HasPrefix(r.stdout, "ID ") || !strings.Contains(r.stdout, id) || !strings.Contains(r.stdout, "case=e2e,team=cli") {
			t.Fatalf("ls table:\n%s", r.stdout)
		}
		r = mustCLI(t, srv, 0, "sb", "get", id, "-o", "yaml")
		if !strings.Contains(r.stdout, "id: "+id) || !strings.Contains(r.stdout, "state: Running") {
			t.Fatalf("get -o yaml:\n%s", r.stdout)
		}
	})

	t.Run("exec", func(t *testing.T) {
		r := mustCLI(t, srv, 3, "exec", id, "--", `echo out-$GREETING; echo err >&2; exit 3`)
		if r.stdout != "out-hello\n" || r.stderr != "err\n" {
			t.Fatalf("exec: stdout %q stderr %q", r.stdout, r.stderr)
		}
		r = mustCLI(t, srv, 0, "exec", id, "--cwd", "/tmp", "-e", "X=a b", "--", "sh", "-c", `echo "$(pwd) $X"`)
		if r.stdout != "/tmp a b\n" {
			t.Fatalf("exec argv: %q", r.stdout)
		}
		// Output is streamed: the first line arrives while the command
		// still runs.
		cmd := cliCmd(srv, "exec", id, "--", "echo first; sleep 3; echo second")
		pipe, _ := cmd.StdoutPipe()
		start := time.Now()
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		line, err := bufio.NewReader(pipe).ReadString('\n')
		if err != nil || line != "first\n" {
			t.Fatalf("first line %q, %v", line, err)
		}
		if d := time.Since(start); d > 2500*time.Millisecond {
			t.Fatalf("first line after %v: not streamed", d)
		}
		if err := cmd.Wait(); err != nil {
			t.Fatalf("streamed exec: %v", err)
		}
	})

	t.Run("exec-interrupt", func(t *testing.T) {
		cmd := cliCmd(srv, "exec", id, "--", "echo started; sleep 60")
		pipe, _ := cmd.StdoutPipe()
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		if line, err := bufio.NewReader(pipe).ReadString('\n'); err != nil || line != "started\n" {
			t.Fatalf("first line %q, %v", line, err)
		}
		start := time.Now()
		cmd.Process.Signal(syscall.SIGINT)
		err := cmd.Wait()
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != 128+int(syscall.SIGTERM) || time.Since(start) > 20*time.Second {
			t.Fatalf("interrupted exec: %v after %v", err, time.Since(start))
		}
		// The remote sleep is gone (and ps does see the entrypoint).
		r := mustCLI(t, srv, 0, "exec", id, "--", "ps >/tmp/ps.txt; grep -q '[t]ail -f' /tmp/ps.txt && echo $(grep -c '[s]leep 60' /tmp/ps.txt)")
		if r.stdout != "0\n" {
			t.Fatalf("ps: the entrypoint is missing or sleep is still running: %q", r.stdout)
		}
	})

	t.Run("background", func(t *testing.T) {
		r := mustCLI(t, srv, 0, "exec", id, "--background", "--", "echo bg-out; exit 4")
		cmdID := strings.TrimSpace(r.stdout)
		if len(cmdID) == 0 {
			t.Fatalf("background printed %q", r.stdout)
		}
		r = mustCLI(t, srv, 0, "command", "logs", id, cmdID, "--follow")
		if r.stdout != "bg-out\n" {
			t.Fatalf("logs %q", r.stdout)
		}
		var st struct {
			Running  bool `json:"running"`
			ExitCode *int `json:"exit_code"`
		}
		r = mustCLI(t, srv, 0, "command", "status", id, cmdID, "-o", "json")
		if err := json.Unmarshal([]byte(r.stdout), &st); err != nil || st.Running || st.ExitCode == nil || *st.ExitCode != 4 {
			t.Fatalf("status %s (%v)", r.stdout, err)
		}
	})

	t.Run("files", func(t *testing.T) {
		dir := t.TempDir()
		data := make([]byte, 3<<20+17)
		rand.Read(data)
		local := filepath.Join(dir, "data.bin")
		if err := os.WriteFile(local, data, 0o640); err != nil {
			t.Fatal(err)
		}
		mustCLI(t, srv, 0, "files", "mkdir", id, "/work/in")
		mustCLI(t, srv, 0, "files", "put", id, local, "/work/in/")
		back := filepath.Join(dir, "back.bin")
		mustCLI(t, srv, 0, "files", "get", id, "/work/in/data.bin", back)
		got, err := os.ReadFile(back)
		if err != nil || !bytes.Equal(got, data) {
			t.Fatalf("round trip: %d bytes, want %d (%v)", len(got), len(data), err)
		}
		r := mustCLI(t, srv, 0, "files", "get", id, "/work/in/data.bin", "-")
		if r.stdout != string(data) {
			t.Fatalf("get to stdout: %d bytes, want %d", len(r.stdout), len(data))
		}
		var infos []struct {
			Path string `json:"path"`
			Size int64  `json:"size"`
			Mode int    `json:"mode"`
		}
		r = mustCLI(t, srv, 0, "files", "ls", id, "/work/in", "-o", "json")
		if err := json.Unmarshal([]byte(r.stdout), &infos); err != nil || len(infos) != 1 ||
			infos[0].Path != "/work/in/data.bin" || infos[0].Size != int64(len(data)) || infos[0].Mode != 640 {
			t.Fatalf("ls: %s (%v)", r.stdout, err)
		}
		if r = mustCLI(t, srv, 0, "files", "ls", id, "/work/in"); !strings.Contains(r.stdout, "-rw-r-----") {
			t.Fatalf("ls table:\n%s", r.stdout)
		}
		if r = cli(t, srv, []byte("from stdin"), "files", "put", id, "-", "/work/in/s.txt"); r.code != 0 {
			t.Fatalf("put stdin: %+v", r)
		}
		if r = mustCLI(t, srv, 0, "files", "get", id, "/work/in/s.txt", "-"); r.stdout != "from stdin" {
			t.Fatalf("stdin round trip %q", r.stdout)
		}
		mustCLI(t, srv, 0, "files", "rm", id, "/work/in/s.txt")
		if r = mustCLI(t, srv, 4, "files", "get", id, "/work/in/s.txt", "-"); !strings.Contains(r.stderr, "FILE_NOT_FOUND") {
			t.Fatalf("get deleted: %q", r.stderr)
		}
		mustCLI(t, srv, 0, "files", "rm", "-r", id, "/work/in")
		mustCLI(t, srv, 4, "files", "ls", id, "/work/in")
	})

	t.Run("shell", func(t *testing.T) {
		// Piped stdin: pipe mode, no echo, the shell's exit code.
		r := cli(t, srv, []byte("echo hi-$((3+4))\necho oops >&2; exit 7\n"), "shell", id)
		if r.code != 7 || !strings.Contains(r.stdout, "hi-7") || !strings.Contains(r.stderr, "oops") {
			t.Fatalf("shell: %+v", r)
		}
		// End of input ends the shell with the last status.
		r = cli(t, srv, []byte("cd /tmp\npwd\nfalse"), "shell", id)
		if r.code != 1 || !strings.Contains(r.stdout, "/tmp") {
			t.Fatalf("shell at EOF: %+v", r)
		}
		// Forced terminal: echo and prompt go to stdout, the exit code still passes.
		r = cli(t, srv, []byte("echo tty-$((2+2)) $(tty)\nexit 5\n"), "shell", "--tty", id)
		if r.code != 5 || !strings.Contains(r.stdout, "tty-4 /dev/pts/") {
			t.Fatalf("shell --tty: %+v", r)
		}
		r = cli(t, srv, nil, "shell", id, "--", "sh", "-c", "echo cmd-ran; exit 9")
		if r.code != 9 || !strings.Contains(r.stdout, "cmd-ran") {
			t.Fatalf("shell -- cmd: %+v", r)
		}
	})

	t.Run("shell-signals", func(t *testing.T) {
		// Ctrl-C (SIGINT to moat) without a terminal interrupts the remote
		// foreground command; the shell goes on.
		cmd := cliCmd(srv, "shell", id)
		stdin, _ := cmd.StdinPipe()
		out := &syncBuffer{}
		cmd.Stdout = out
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		io.WriteString(stdin, "echo before; sleep 30\n")
		waitFor(t, func() bool { return strings.Contains(out.String(), "before") })
		time.Sleep(300 * time.Millisecond) // let sleep start
		cmd.Process.Signal(syscall.SIGINT)
		io.WriteString(stdin, "echo after-$((2+3))\nexit 4\n")
		err := cmd.Wait()
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != 4 || !strings.Contains(out.String(), "after-5") || time.Since(start) > 20*time.Second {
			t.Fatalf("shell after SIGINT: %v after %v, output %q", err, time.Since(start), out.String())
		}

		// SIGTERM ends moat even though stdin stays open, and the session
		// (with its shell) is deleted.
		cmd = cliCmd(srv, "shell", id)
		stdin, _ = cmd.StdinPipe()
		out = &syncBuffer{}
		cmd.Stdout = out
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		io.WriteString(stdin, "echo marker-$((7*6)); sleep 31\n")
		waitFor(t, func() bool { return strings.Contains(out.String(), "marker-42") })
		cmd.Process.Signal(syscall.SIGTERM)
		err = cmd.Wait()
		if !errors.As(err, &ee) || ee.ExitCode() != 143 {
			t.Fatalf("shell after SIGTERM: %v", err)
		}
		stdin.Close()
		waitFor(t, func() bool {
			r := mustCLI(t, srv, 0, "exec", id, "--", "ps >/tmp/ps2.txt; grep -q '[t]ail -f' /tmp/ps2.txt && echo $(grep -c '[s]leep 31' /tmp/ps2.txt)")
			return r.stdout == "0\n"
		})
	})

	t.Run("shell-terminal", func(t *testing.T) { shellOnTerminal(t, srv, id) })

	t.Run("server-proxy", func(t *testing.T) {
		// Through the server's proxy route: SSE for exec, WebSocket for shell.
		if r := mustCLI(t, srv, 2, "exec", "--server-proxy", id, "--", "echo via-proxy; exit 2"); r.stdout != "via-proxy\n" {
			t.Fatalf("exec --server-proxy: %q", r.stdout)
		}
		r := cli(t, srv, []byte("echo ws-$((1+1))\nexit 3\n"), "shell", "--server-proxy", id)
		if r.code != 3 || !strings.Contains(r.stdout, "ws-2") {
			t.Fatalf("shell --server-proxy: %+v", r)
		}
	})

	t.Run("pause-resume", func(t *testing.T) {
		mustCLI(t, srv, 0, "sb", "pause", id)
		var sb sandboxResp
		r := mustCLI(t, srv, 0, "sb", "get", id, "-o", "json")
		if json.Unmarshal([]byte(r.stdout), &sb); sb.Status.State != "Paused" {
			t.Fatalf("after pause: %s", r.stdout)
		}
		if r = mustCLI(t, srv, 3, "sb", "pause", id); !strings.Contains(r.stderr, "(HTTP 409") {
			t.Fatalf("pause paused: %q", r.stderr)
		}
		mustCLI(t, srv, 0, "sb", "resume", id)
		r = mustCLI(t, srv, 0, "sb", "get", id)
		if !strings.Contains(r.stdout, "Running") {
			t.Fatalf("after resume:\n%s", r.stdout)
		}
		if r = mustCLI(t, srv, 0, "exec", id, "--", "echo alive"); r.stdout != "alive\n" {
			t.Fatalf("exec after resume %q", r.stdout)
		}
		r = mustCLI(t, srv, 0, "sb", "renew", id, "--for", "2h")
		if !strings.HasPrefix(r.stdout, id+" expires ") {
			t.Fatalf("renew %q", r.stdout)
		}
	})

	t.Run("pool-batch", func(t *testing.T) {
		mustCLI(t, srv, 0, "pool", "create", "clipool", "--image", ref, "--buffer-min", "0", "--buffer-max", "0", "--pool-max", "2")
		var pools struct {
			Items []struct{ Name string }
		}
		r := mustCLI(t, srv, 0, "pool", "ls", "-o", "json")
		if json.Unmarshal([]byte(r.stdout), &pools); len(pools.Items) != 1 || pools.Items[0].Name != "clipool" {
			t.Fatalf("pool ls: %s", r.stdout)
		}
		if r = mustCLI(t, srv, 0, "pool", "get", "clipool"); !strings.Contains(r.stdout, "buffer 0-0, pool 0-2") {
			t.Fatalf("pool get:\n%s", r.stdout)
		}
		mustCLI(t, srv, 0, "pool", "rm", "clipool")
		if r = mustCLI(t, srv, 4, "pool", "get", "clipool"); !strings.Contains(r.stderr, "POOL::NOT_FOUND") {
			t.Fatalf("pool get deleted: %q", r.stderr)
		}
		r = mustCLI(t, srv, 0, "sb", "batch", "--count", "2", "--image", ref, "-m", "batch=yes", "-q")
		ids := strings.Fields(r.stdout)
		if len(ids) != 2 {
			t.Fatalf("batch printed %q", r.stdout)
		}
		mustCLI(t, srv, 0, append([]string{"sb", "rm"}, ids...)...)
	})

	t.Run("errors", func(t *testing.T) {
		r := mustCLI(t, srv, 4, "sb", "get", "no-such-sandbox")
		if !strings.Contains(r.stderr, "SANDBOX::NOT_FOUND") || !strings.Contains(r.stderr, "(HTTP 404") {
			t.Fatalf("get missing: %q", r.stderr)
		}
		if r = mustCLI(t, srv, 2, "sb", "create", "--image", ref, "-e", "NOEQUALS"); !strings.Contains(r.stderr, "KEY=VALUE") {
			t.Fatalf("bad env: %q", r.stderr)
		}
		if r = cli(t, srv, nil, "sb", "ls", "--api-key", "wrong"); r.code == 0 || !strings.Contains(r.stderr, "HTTP 401") {
			t.Fatalf("bad key: %+v", r)
		}
	})

	mustCLI(t, srv, 0, "sb", "rm", id)
	mustCLI(t, srv, 4, "sb", "get", id)
}

// shellOnTerminal runs `moat shell` on a local pseudo-terminal, as a user
// would: raw mode, the local window size, resize on SIGWINCH, exit code.
func shellOnTerminal(t *testing.T, srv *server, id string) {
	cmd := cliCmd(srv, "shell", id)
	ptmx, err := pty.StartWithSize(cmd, &pty.Winsize{Rows: 33, Cols: 111})
	if err != nil {
		t.Fatal(err)
	}
	defer ptmx.Close()
	out := make(chan string, 64)
	go func() {
		buf := make([]byte, 4096)
		for {
			n, err := ptmx.Read(buf)
			if n > 0 {
				out <- string(buf[:n])
			}
			if err != nil {
				close(out)
				return
			}
		}
	}()
	var seen strings.Builder
	expect := func(want string) {
		t.Helper()
		deadline := time.After(20 * time.Second)
		for !strings.Contains(seen.String(), want) {
			select {
			case s, ok := <-out:
				if !ok {
					t.Fatalf("terminal closed waiting for %q; got %q", want, seen.String())
				}
				seen.WriteString(s)
			case <-deadline:
				t.Fatalf("timed out waiting for %q; got %q", want, seen.String())
			}
		}
	}
	expect("# ")
	// Raw mode: the remote terminal echoes, so a typed command shows once
	// and its output follows; the size is the local one.
	ptmx.WriteString("stty size; echo sum-$((40+2))\r")
	expect("33 111")
	expect("sum-42")
	if err := pty.Setsize(ptmx, &pty.Winsize{Rows: 44, Cols: 99}); err != nil {
		t.Fatal(err)
	}
	// The resize is asynchronous (SIGWINCH, then a frame to the agent).
	deadline := time.Now().Add(10 * time.Second)
	for i := 0; ; i++ {
		ptmx.WriteString(fmt.Sprintf("echo size-%d-$(stty size | tr ' ' x)\r", i))
		expect(fmt.Sprintf("size-%d-", i))
		time.Sleep(200 * time.Millisecond)
		for drained := false; !drained; {
			select {
			case s := <-out:
				seen.WriteString(s)
			default:
				drained = true
			}
		}
		if strings.Contains(seen.String(), "44x99") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("remote size never became 44x99: %q", seen.String())
		}
	}
	ptmx.WriteString("exit 6\r")
	err = cmd.Wait()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 6 {
		t.Fatalf("shell on a terminal: %v, want exit 6; output %q", err, seen.String())
	}
}

// waitFor polls cond for up to 20 s.
func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met in 20s")
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// syncBuffer is a bytes.Buffer safe for one writer and concurrent readers.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

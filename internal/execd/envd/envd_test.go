package envd_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"go.uber.org/goleak"

	"github.com/moat-sandbox/moat/internal/agentproto"
	"github.com/moat-sandbox/moat/internal/execd/envd"
	"github.com/moat-sandbox/moat/internal/execd/envd/gen/filesystem/filesystemconnect"
	ppb "github.com/moat-sandbox/moat/internal/execd/envd/gen/process"
	"github.com/moat-sandbox/moat/internal/execd/envd/gen/process/processconnect"
	"github.com/moat-sandbox/moat/internal/execd/proc"
)

func TestMain(m *testing.M) {
	if os.Getenv(usersHelperEnv) != "" {
		os.Exit(m.Run())
	}
	goleak.VerifyTestMain(m)
}

// env is an envd handler served in-process with clients of both codecs.
type env struct {
	t       *testing.T
	url     string
	token   string
	http    *http.Client
	proc    processconnect.ProcessClient // JSON codec, as the SDKs
	procBin processconnect.ProcessClient // binary codec
	fs      filesystemconnect.FilesystemClient
}

type envOpts struct {
	token       string
	defaultUser string
}

func newEnv(t *testing.T, o envOpts) *env {
	t.Helper()
	run, err := proc.NewRunner(proc.Options{StateDir: t.TempDir(), BaseEnv: append(proc.ChildEnv(os.Environ()), "SANDBOX_LEVEL=1")})
	if err != nil {
		t.Fatal(err)
	}
	svc := envd.New(run, envd.Options{Token: func() string { return o.token }, DefaultUser: o.defaultUser})
	ts := httptest.NewServer(svc.Handler())
	t.Cleanup(func() {
		ts.CloseClientConnections()
		ts.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		run.Close(ctx)
	})
	e := &env{t: t, url: ts.URL, token: o.token, http: ts.Client()}
	e.proc = processconnect.NewProcessClient(e.http, ts.URL, connect.WithProtoJSON(), connect.WithInterceptors(e))
	e.procBin = processconnect.NewProcessClient(e.http, ts.URL, connect.WithInterceptors(e))
	e.fs = filesystemconnect.NewFilesystemClient(e.http, ts.URL, connect.WithProtoJSON(), connect.WithInterceptors(e))
	return e
}

// The env adds the access token to every RPC, as the SDKs do.
func (e *env) WrapUnary(next connect.UnaryFunc) connect.UnaryFunc {
	return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
		e.sign(req.Header())
		return next(ctx, req)
	}
}

func (e *env) WrapStreamingClient(next connect.StreamingClientFunc) connect.StreamingClientFunc {
	return func(ctx context.Context, spec connect.Spec) connect.StreamingClientConn {
		conn := next(ctx, spec)
		e.sign(conn.RequestHeader())
		return conn
	}
}

func (e *env) WrapStreamingHandler(next connect.StreamingHandlerFunc) connect.StreamingHandlerFunc {
	return next
}

func (e *env) sign(h http.Header) {
	if e.token != "" && h.Get(agentproto.EnvdTokenHeader) == "" {
		h.Set(agentproto.EnvdTokenHeader, e.token)
	}
}

func ctxT(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

func bash(script string) *ppb.ProcessConfig {
	return &ppb.ProcessConfig{Cmd: "/bin/bash", Args: []string{"-l", "-c", script}}
}

func ptr[T any](v T) *T { return &v }

// events is what a process stream delivered.
type events struct {
	pid            uint32
	first          string // the first event's kind
	stdout, stderr strings.Builder
	pty            strings.Builder
	keepalives     int
	end            *ppb.ProcessEvent_EndEvent
}

func kind(ev *ppb.ProcessEvent) string {
	switch ev.GetEvent().(type) {
	case *ppb.ProcessEvent_Start:
		return "start"
	case *ppb.ProcessEvent_Data:
		return "data"
	case *ppb.ProcessEvent_End:
		return "end"
	case *ppb.ProcessEvent_Keepalive:
		return "keepalive"
	}
	return "none"
}

func (r *events) add(ev *ppb.ProcessEvent) {
	if r.first == "" {
		r.first = kind(ev)
	}
	switch v := ev.GetEvent().(type) {
	case *ppb.ProcessEvent_Start:
		r.pid = v.Start.GetPid()
	case *ppb.ProcessEvent_Data:
		r.stdout.Write(v.Data.GetStdout())
		r.stderr.Write(v.Data.GetStderr())
		r.pty.Write(v.Data.GetPty())
	case *ppb.ProcessEvent_Keepalive:
		r.keepalives++
	case *ppb.ProcessEvent_End:
		r.end = v.End
	}
}

func collect[T interface{ GetEvent() *ppb.ProcessEvent }](s interface {
	Receive() bool
	Msg() T
	Err() error
}) (*events, error) {
	r := &events{}
	for s.Receive() {
		r.add(s.Msg().GetEvent())
	}
	return r, s.Err()
}

func (e *env) run(ctx context.Context, req *ppb.StartRequest) (*events, error) {
	s, err := e.proc.Start(ctx, connect.NewRequest(req))
	if err != nil {
		return nil, err
	}
	defer s.Close()
	return collect[*ppb.StartResponse](s)
}

func code(err error) connect.Code {
	var ce *connect.Error
	if errors.As(err, &ce) {
		return ce.Code()
	}
	return connect.CodeUnknown
}

func wantCode(t *testing.T, err error, want connect.Code) {
	t.Helper()
	if code(err) != want {
		t.Fatalf("error %v: code %v, want %v", err, code(err), want)
	}
}

// eventually polls cond for up to 20 s (the machine may be busy).
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestStartStreamsOutputAndExit(t *testing.T) {
	e := newEnv(t, envOpts{})
	for name, c := range map[string]processconnect.ProcessClient{"json": e.proc, "binary": e.procBin} {
		t.Run(name, func(t *testing.T) {
			s, err := c.Start(ctxT(t, 30*time.Second), connect.NewRequest(&ppb.StartRequest{
				Process: &ppb.ProcessConfig{Cmd: "/bin/bash", Args: []string{"-c", `printf 'out\n'; printf 'err\n' >&2; echo "$FOO"; exit 3`}, Envs: map[string]string{"FOO": "bar"}},
				Stdin:   ptr(false),
			}))
			if err != nil {
				t.Fatal(err)
			}
			r, err := collect[*ppb.StartResponse](s)
			if err != nil {
				t.Fatal(err)
			}
			if r.first != "start" || r.pid == 0 {
				t.Fatalf("first event %s pid %d, want start with a pid", r.first, r.pid)
			}
			if r.stdout.String() != "out\nbar\n" || r.stderr.String() != "err\n" {
				t.Fatalf("stdout %q stderr %q", r.stdout.String(), r.stderr.String())
			}
			if r.end == nil || r.end.ExitCode != 3 || !r.end.Exited || r.end.Status != "exit status 3" || r.end.GetError() != "exit status 3" {
				t.Fatalf("end %v", r.end)
			}
		})
	}
	// A successful exit has no error.
	r, err := e.run(ctxT(t, 30*time.Second), &ppb.StartRequest{Process: bash("true")})
	if err != nil || r.end == nil || r.end.ExitCode != 0 || r.end.Error != nil || r.end.Status != "exit status 0" {
		t.Fatalf("true: %v %v", r, err)
	}
}

func TestStartIsTheRealPid(t *testing.T) {
	e := newEnv(t, envOpts{})
	r, err := e.run(ctxT(t, 30*time.Second), &ppb.StartRequest{Process: bash(`echo $$`)})
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.TrimSpace(r.stdout.String()); got != strings.TrimSpace(itoa(r.pid)) {
		t.Fatalf("the shell says its pid is %s, start said %d", got, r.pid)
	}
}

func TestStartErrors(t *testing.T) {
	e := newEnv(t, envOpts{})
	ctx := ctxT(t, 30*time.Second)
	cases := []struct {
		name string
		req  *ppb.StartRequest
		user string
		want connect.Code
	}{
		{"missing cwd", &ppb.StartRequest{Process: &ppb.ProcessConfig{Cmd: "/bin/true", Cwd: ptr("/does/not/exist")}}, "", connect.CodeInvalidArgument},
		{"no cmd", &ppb.StartRequest{Process: &ppb.ProcessConfig{}}, "", connect.CodeInvalidArgument},
		{"unknown binary", &ppb.StartRequest{Process: &ppb.ProcessConfig{Cmd: "no-such-binary-xyz"}}, "", connect.CodeInvalidArgument},
		{"unknown user", &ppb.StartRequest{Process: bash("true")}, "no-such-user-xyz", connect.CodeUnauthenticated},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			req := connect.NewRequest(c.req)
			if c.user != "" {
				req.Header().Set("Authorization", basic(c.user))
			}
			s, err := e.proc.Start(ctx, req)
			if err == nil {
				_, err = collect[*ppb.StartResponse](s)
			}
			wantCode(t, err, c.want)
		})
	}
}

func TestStdinPipe(t *testing.T) {
	e := newEnv(t, envOpts{})
	ctx := ctxT(t, 30*time.Second)
	s, err := e.proc.Start(ctx, connect.NewRequest(&ppb.StartRequest{Process: &ppb.ProcessConfig{Cmd: "cat"}, Stdin: ptr(true)}))
	if err != nil {
		t.Fatal(err)
	}
	if !s.Receive() || s.Msg().GetEvent().GetStart() == nil {
		t.Fatalf("no start event: %v", s.Err())
	}
	pid := s.Msg().GetEvent().GetStart().GetPid()
	sel := &ppb.ProcessSelector{Selector: &ppb.ProcessSelector_Pid{Pid: pid}}
	if _, err := e.proc.SendInput(ctx, connect.NewRequest(&ppb.SendInputRequest{Process: sel, Input: &ppb.ProcessInput{Input: &ppb.ProcessInput_Stdin{Stdin: []byte("hello ")}}})); err != nil {
		t.Fatal(err)
	}
	if _, err := e.proc.SendInput(ctx, connect.NewRequest(&ppb.SendInputRequest{Process: sel, Input: &ppb.ProcessInput{Input: &ppb.ProcessInput_Stdin{Stdin: []byte("world")}}})); err != nil {
		t.Fatal(err)
	}
	// PTY input to a pipe process and input of neither kind fail.
	_, err = e.proc.SendInput(ctx, connect.NewRequest(&ppb.SendInputRequest{Process: sel, Input: &ppb.ProcessInput{Input: &ppb.ProcessInput_Pty{Pty: []byte("x")}}}))
	wantCode(t, err, connect.CodeInternal)
	_, err = e.proc.SendInput(ctx, connect.NewRequest(&ppb.SendInputRequest{Process: sel, Input: &ppb.ProcessInput{}}))
	wantCode(t, err, connect.CodeUnimplemented)
	if _, err := e.proc.CloseStdin(ctx, connect.NewRequest(&ppb.CloseStdinRequest{Process: sel})); err != nil {
		t.Fatal(err)
	}
	r, err := collect[*ppb.StartResponse](s)
	if err != nil {
		t.Fatal(err)
	}
	if r.stdout.String() != "hello world" || r.end == nil || r.end.ExitCode != 0 {
		t.Fatalf("cat after EOF: %q %v", r.stdout.String(), r.end)
	}

	// Without stdin, cat reads /dev/null and input is refused.
	s2, err := e.proc.Start(ctx, connect.NewRequest(&ppb.StartRequest{Process: bash("sleep 0.5; cat"), Stdin: ptr(false)}))
	if err != nil {
		t.Fatal(err)
	}
	s2.Receive()
	pid2 := s2.Msg().GetEvent().GetStart().GetPid()
	_, err = e.proc.SendInput(ctx, connect.NewRequest(&ppb.SendInputRequest{Process: &ppb.ProcessSelector{Selector: &ppb.ProcessSelector_Pid{Pid: pid2}}, Input: &ppb.ProcessInput{Input: &ppb.ProcessInput_Stdin{Stdin: []byte("x")}}}))
	wantCode(t, err, connect.CodeInternal)
	r2, err := collect[*ppb.StartResponse](s2)
	if err != nil || r2.end == nil || r2.end.ExitCode != 0 || r2.stdout.Len() != 0 {
		t.Fatalf("stdin:false: %v %v", r2, err)
	}
}

func TestReattachByPidAndTag(t *testing.T) {
	e := newEnv(t, envOpts{})
	ctx := ctxT(t, 60*time.Second)
	sctx, drop := context.WithCancel(ctx)
	s, err := e.proc.Start(sctx, connect.NewRequest(&ppb.StartRequest{Process: bash(`read x; echo "got $x"; exit 7`), Tag: ptr("worker")}))
	if err != nil {
		t.Fatal(err)
	}
	if !s.Receive() {
		t.Fatal(s.Err())
	}
	pid := s.Msg().GetEvent().GetStart().GetPid()
	// The client goes away; the process does not.
	drop()
	s.Close()
	list, err := e.proc.List(ctx, connect.NewRequest(&ppb.ListRequest{}))
	if err != nil {
		t.Fatal(err)
	}
	var found *ppb.ProcessInfo
	for _, p := range list.Msg.GetProcesses() {
		if p.GetPid() == pid {
			found = p
		}
	}
	if found == nil || found.GetTag() != "worker" || found.GetConfig().GetCmd() != "/bin/bash" || found.GetConfig().GetArgs()[2] != `read x; echo "got $x"; exit 7` {
		t.Fatalf("list after the stream dropped: %v", list.Msg)
	}
	c, err := e.proc.Connect(ctx, connect.NewRequest(&ppb.ConnectRequest{Process: &ppb.ProcessSelector{Selector: &ppb.ProcessSelector_Tag{Tag: "worker"}}}))
	if err != nil {
		t.Fatal(err)
	}
	if !c.Receive() || c.Msg().GetEvent().GetStart().GetPid() != pid {
		t.Fatalf("connect by tag: first event %v, %v", c.Msg(), c.Err())
	}
	if _, err := e.proc.SendInput(ctx, connect.NewRequest(&ppb.SendInputRequest{
		Process: &ppb.ProcessSelector{Selector: &ppb.ProcessSelector_Pid{Pid: pid}},
		Input:   &ppb.ProcessInput{Input: &ppb.ProcessInput_Stdin{Stdin: []byte("hi\n")}},
	})); err != nil {
		t.Fatal(err)
	}
	r, err := collect[*ppb.ConnectResponse](c)
	if err != nil {
		t.Fatal(err)
	}
	if r.stdout.String() != "got hi\n" || r.end == nil || r.end.ExitCode != 7 {
		t.Fatalf("reattached: %q %v", r.stdout.String(), r.end)
	}
	// An exited process replays start and end for a while, and leaves the list.
	c2, err := e.proc.Connect(ctx, connect.NewRequest(&ppb.ConnectRequest{Process: &ppb.ProcessSelector{Selector: &ppb.ProcessSelector_Pid{Pid: pid}}}))
	if err != nil {
		t.Fatal(err)
	}
	r2, err := collect[*ppb.ConnectResponse](c2)
	if err != nil || r2.first != "start" || r2.pid != pid || r2.end == nil || r2.end.ExitCode != 7 {
		t.Fatalf("connect after exit: %+v %v", r2, err)
	}
	list, _ = e.proc.List(ctx, connect.NewRequest(&ppb.ListRequest{}))
	for _, p := range list.Msg.GetProcesses() {
		if p.GetPid() == pid {
			t.Fatalf("exited process still listed")
		}
	}
	// Unknown pids.
	c3, err := e.proc.Connect(ctx, connect.NewRequest(&ppb.ConnectRequest{Process: &ppb.ProcessSelector{Selector: &ppb.ProcessSelector_Pid{Pid: 999999999}}}))
	if err == nil {
		_, err = collect[*ppb.ConnectResponse](c3)
	}
	wantCode(t, err, connect.CodeNotFound)
}

func TestKeepalive(t *testing.T) {
	e := newEnv(t, envOpts{})
	req := connect.NewRequest(&ppb.StartRequest{Process: bash("sleep 2.5; echo done")})
	req.Header().Set("Keepalive-Ping-Interval", "1")
	s, err := e.proc.Start(ctxT(t, 30*time.Second), req)
	if err != nil {
		t.Fatal(err)
	}
	r, err := collect[*ppb.StartResponse](s)
	if err != nil {
		t.Fatal(err)
	}
	if r.first != "start" || r.keepalives < 1 || r.stdout.String() != "done\n" || r.end == nil {
		t.Fatalf("first %s, %d keepalives, stdout %q, end %v", r.first, r.keepalives, r.stdout.String(), r.end)
	}
}

func TestConnectTimeoutKillsTheProcess(t *testing.T) {
	e := newEnv(t, envOpts{})
	// The client sends Connect-Timeout-Ms from its deadline.
	ctx, cancel := context.WithTimeout(context.Background(), 1500*time.Millisecond)
	defer cancel()
	s, err := e.proc.Start(ctx, connect.NewRequest(&ppb.StartRequest{Process: bash("sleep 60")}))
	if err != nil {
		t.Fatal(err)
	}
	r, err := collect[*ppb.StartResponse](s)
	wantCode(t, err, connect.CodeDeadlineExceeded)
	if r.pid == 0 {
		t.Fatal("no start event before the deadline")
	}
	// The process is gone even though nobody follows it.
	eventually(t, "the timed-out process to be killed", func() bool {
		list, err := e.proc.List(context.Background(), connect.NewRequest(&ppb.ListRequest{}))
		if err != nil {
			return false
		}
		for _, p := range list.Msg.GetProcesses() {
			if p.GetPid() == r.pid {
				return false
			}
		}
		return true
	})
}

func TestSendSignal(t *testing.T) {
	e := newEnv(t, envOpts{})
	ctx := ctxT(t, 30*time.Second)
	s, err := e.proc.Start(ctx, connect.NewRequest(&ppb.StartRequest{Process: &ppb.ProcessConfig{Cmd: "sleep", Args: []string{"60"}}}))
	if err != nil {
		t.Fatal(err)
	}
	s.Receive()
	pid := s.Msg().GetEvent().GetStart().GetPid()
	sel := &ppb.ProcessSelector{Selector: &ppb.ProcessSelector_Pid{Pid: pid}}
	_, err = e.proc.SendSignal(ctx, connect.NewRequest(&ppb.SendSignalRequest{Process: sel}))
	wantCode(t, err, connect.CodeUnimplemented)
	if _, err := e.proc.SendSignal(ctx, connect.NewRequest(&ppb.SendSignalRequest{Process: sel, Signal: ppb.Signal_SIGNAL_SIGKILL})); err != nil {
		t.Fatal(err)
	}
	r, err := collect[*ppb.StartResponse](s)
	if err != nil {
		t.Fatal(err)
	}
	if r.end == nil || r.end.ExitCode != -1 || r.end.Exited || r.end.Status != "signal: killed" || r.end.GetError() != "signal: killed" {
		t.Fatalf("end after SIGKILL: %v", r.end)
	}
	_, err = e.proc.SendSignal(ctx, connect.NewRequest(&ppb.SendSignalRequest{Process: &ppb.ProcessSelector{Selector: &ppb.ProcessSelector_Pid{Pid: 999999999}}, Signal: ppb.Signal_SIGNAL_SIGKILL}))
	wantCode(t, err, connect.CodeNotFound)
	_, err = e.proc.SendSignal(ctx, connect.NewRequest(&ppb.SendSignalRequest{Process: &ppb.ProcessSelector{Selector: &ppb.ProcessSelector_Tag{Tag: "nobody-has-it"}}, Signal: ppb.Signal_SIGNAL_SIGTERM}))
	wantCode(t, err, connect.CodeNotFound)
}

// syncBuf is a Builder written by one goroutine and read by another.
type syncBuf struct {
	mu sync.Mutex
	b  strings.Builder
}

func (b *syncBuf) add(p []byte) { b.mu.Lock(); b.b.Write(p); b.mu.Unlock() }
func (b *syncBuf) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

func TestPTY(t *testing.T) {
	e := newEnv(t, envOpts{})
	ctx := ctxT(t, 60*time.Second)
	s, err := e.proc.Start(ctx, connect.NewRequest(&ppb.StartRequest{
		Process: &ppb.ProcessConfig{Cmd: "/bin/sh", Args: []string{"-c", `stty size; read a; stty size; echo "a=$a"`}, Envs: map[string]string{"TERM": "xterm-256color"}},
		Pty:     &ppb.PTY{Size: &ppb.PTY_Size{Cols: 100, Rows: 30}},
	}))
	if err != nil {
		t.Fatal(err)
	}
	if !s.Receive() {
		t.Fatal(s.Err())
	}
	pid := s.Msg().GetEvent().GetStart().GetPid()
	sel := &ppb.ProcessSelector{Selector: &ppb.ProcessSelector_Pid{Pid: pid}}
	var out syncBuf
	done := make(chan *events, 1)
	go func() {
		r := &events{}
		for s.Receive() {
			ev := s.Msg().GetEvent()
			out.add(ev.GetData().GetPty())
			if ev.GetData().GetStdout() != nil {
				out.add([]byte("<stdout event>"))
			}
			r.add(ev)
		}
		done <- r
	}()
	eventually(t, "the first stty size", func() bool { return strings.Contains(out.String(), "30 100") })
	if _, err := e.proc.Update(ctx, connect.NewRequest(&ppb.UpdateRequest{Process: sel, Pty: &ppb.PTY{Size: &ppb.PTY_Size{Cols: 120, Rows: 40}}})); err != nil {
		t.Fatal(err)
	}
	// Stdin input and CloseStdin do not apply to a PTY process.
	_, err = e.proc.SendInput(ctx, connect.NewRequest(&ppb.SendInputRequest{Process: sel, Input: &ppb.ProcessInput{Input: &ppb.ProcessInput_Stdin{Stdin: []byte("x")}}}))
	wantCode(t, err, connect.CodeInternal)
	_, err = e.proc.CloseStdin(ctx, connect.NewRequest(&ppb.CloseStdinRequest{Process: sel}))
	wantCode(t, err, connect.CodeInternal)
	if _, err := e.proc.SendInput(ctx, connect.NewRequest(&ppb.SendInputRequest{Process: sel, Input: &ppb.ProcessInput{Input: &ppb.ProcessInput_Pty{Pty: []byte("typed\r")}}})); err != nil {
		t.Fatal(err)
	}
	r := <-done
	if r.end == nil || r.end.ExitCode != 0 {
		t.Fatalf("pty end %v (%v)", r.end, s.Err())
	}
	got := out.String()
	if !strings.Contains(got, "40 120") || !strings.Contains(got, "a=typed") || strings.Contains(got, "<stdout event>") {
		t.Fatalf("pty output %q", got)
	}
	// A non-PTY process cannot be resized.
	s2, err := e.proc.Start(ctx, connect.NewRequest(&ppb.StartRequest{Process: &ppb.ProcessConfig{Cmd: "sleep", Args: []string{"5"}}}))
	if err != nil {
		t.Fatal(err)
	}
	s2.Receive()
	sel2 := &ppb.ProcessSelector{Selector: &ppb.ProcessSelector_Pid{Pid: s2.Msg().GetEvent().GetStart().GetPid()}}
	_, err = e.proc.Update(ctx, connect.NewRequest(&ppb.UpdateRequest{Process: sel2, Pty: &ppb.PTY{Size: &ppb.PTY_Size{Cols: 1, Rows: 1}}}))
	wantCode(t, err, connect.CodeInternal)
	e.proc.SendSignal(ctx, connect.NewRequest(&ppb.SendSignalRequest{Process: sel2, Signal: ppb.Signal_SIGNAL_SIGKILL}))
	collect[*ppb.StartResponse](s2)
}

func TestAuth(t *testing.T) {
	e := newEnv(t, envOpts{token: "secret-token-123"})
	ctx := ctxT(t, 30*time.Second)
	// The right token works.
	if _, err := e.proc.List(ctx, connect.NewRequest(&ppb.ListRequest{})); err != nil {
		t.Fatal(err)
	}
	// A wrong one, or none, is unauthenticated, on unary and streaming RPCs.
	req := connect.NewRequest(&ppb.ListRequest{})
	req.Header().Set(agentproto.EnvdTokenHeader, "wrong")
	_, err := e.proc.List(ctx, req)
	wantCode(t, err, connect.CodeUnauthenticated)
	bare := processconnect.NewProcessClient(e.http, e.url, connect.WithProtoJSON())
	s, err := bare.Start(ctx, connect.NewRequest(&ppb.StartRequest{Process: bash("true")}))
	if err == nil {
		_, err = collect[*ppb.StartResponse](s)
	}
	wantCode(t, err, connect.CodeUnauthenticated)
	// The 401 body is envd's.
	resp, err := e.http.Post(e.url+"/process.Process/List", "application/json", strings.NewReader("{}"))
	if err != nil {
		t.Fatal(err)
	}
	body := readAll(t, resp)
	if resp.StatusCode != 401 || body != `{"code":401,"message":"unauthorized access, please provide a valid access token or method signing if supported"}` {
		t.Fatalf("401: %d %s", resp.StatusCode, body)
	}
	// /health is open; /envs is not.
	resp, err = e.http.Get(e.url + "/health")
	if err != nil {
		t.Fatal(err)
	}
	readAll(t, resp)
	if resp.StatusCode != 204 || resp.Header.Get("Cache-Control") != "no-store" {
		t.Fatalf("health: %d %v", resp.StatusCode, resp.Header)
	}
	resp, _ = e.http.Get(e.url + "/envs")
	readAll(t, resp)
	if resp.StatusCode != 401 {
		t.Fatalf("/envs without a token: %d", resp.StatusCode)
	}
	hreq, _ := http.NewRequest("GET", e.url+"/envs", nil)
	hreq.Header.Set(agentproto.EnvdTokenHeader, e.token)
	resp, err = e.http.Do(hreq)
	if err != nil {
		t.Fatal(err)
	}
	if body := readAll(t, resp); resp.StatusCode != 200 || !strings.Contains(body, `"SANDBOX_LEVEL":"1"`) {
		t.Fatalf("/envs: %d %s", resp.StatusCode, body)
	}
}

func TestNoTokenNoAuth(t *testing.T) {
	e := newEnv(t, envOpts{})
	bare := processconnect.NewProcessClient(e.http, e.url, connect.WithProtoJSON())
	if _, err := bare.List(ctxT(t, 30*time.Second), connect.NewRequest(&ppb.ListRequest{})); err != nil {
		t.Fatal(err)
	}
}

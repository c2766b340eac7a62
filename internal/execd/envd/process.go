package envd

import (
	"context"
	"errors"
	"net/http"
	"os"
	"strconv"
	"sync"
	"syscall"
	"time"

	"connectrpc.com/connect"
	creackpty "github.com/creack/pty"

	"github.com/moat-sandbox/moat/internal/errdefs"
	ppb "github.com/moat-sandbox/moat/internal/execd/envd/gen/process"
	"github.com/moat-sandbox/moat/internal/execd/proc"
)

const (
	// chunkSize bounds the bytes of one data event, as envd's.
	chunkSize = 32 << 10
	// retainExited is how long an exited process can still be connected
	// to (its end event is replayed).
	retainExited = 30 * time.Second
	// keepaliveHeader is the client's keepalive interval in seconds;
	// defaultKeepalive applies without it.
	keepaliveHeader  = "Keepalive-Ping-Interval"
	defaultKeepalive = 90 * time.Second
)

// process is a child started by Start, registered under its pid. Its
// output goes to whichever streams are subscribed when it is produced.
type process struct {
	pid    int
	tag    *string
	config *ppb.ProcessConfig
	proc   *proc.Proc
	tty    *os.File // the PTY master; nil for a pipe process

	inMu  sync.Mutex
	stdin *os.File // pipe process: the stdin pipe; nil when disabled or closed

	mu   sync.Mutex
	subs map[*subscriber]struct{}   // guarded by mu
	end  *ppb.ProcessEvent_EndEvent // guarded by mu; set once exited and drained
}

// subscriber is one stream following a process.
type subscriber struct {
	ch   chan *ppb.ProcessEvent
	gone chan struct{} // closed when the stream stops following
}

// subscribe adds a follower; when the process has already ended it
// returns the end event instead.
func (p *process) subscribe() (*subscriber, *ppb.ProcessEvent_EndEvent) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.end != nil {
		return nil, p.end
	}
	sub := &subscriber{ch: make(chan *ppb.ProcessEvent, 16), gone: make(chan struct{})}
	p.subs[sub] = struct{}{}
	return sub, nil
}

func (p *process) unsubscribe(sub *subscriber) {
	p.mu.Lock()
	delete(p.subs, sub)
	p.mu.Unlock()
	close(sub.gone)
}

// publish hands ev to every follower, waiting for each (so output is
// paced by the slowest live stream) unless it stops following.
func (p *process) publish(ev *ppb.ProcessEvent, end *ppb.ProcessEvent_EndEvent) {
	p.mu.Lock()
	if end != nil {
		p.end = end
	}
	subs := make([]*subscriber, 0, len(p.subs))
	for sub := range p.subs {
		subs = append(subs, sub)
	}
	p.mu.Unlock()
	for _, sub := range subs {
		select {
		case sub.ch <- ev:
		case <-sub.gone:
		}
	}
}

func (p *process) exited() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.end != nil
}

func startEvent(pid int) *ppb.ProcessEvent {
	return &ppb.ProcessEvent{Event: &ppb.ProcessEvent_Start{Start: &ppb.ProcessEvent_StartEvent{Pid: uint32(pid)}}}
}

func endEvent(end *ppb.ProcessEvent_EndEvent) *ppb.ProcessEvent {
	return &ppb.ProcessEvent{Event: &ppb.ProcessEvent_End{End: end}}
}

var keepaliveEvent = &ppb.ProcessEvent{Event: &ppb.ProcessEvent_Keepalive{Keepalive: &ppb.ProcessEvent_KeepAlive{}}}

// keepaliveInterval is the client's Keepalive-Ping-Interval.
func keepaliveInterval(h http.Header) time.Duration {
	if n, err := strconv.Atoi(h.Get(keepaliveHeader)); err == nil && n > 0 {
		return time.Duration(min(n, 3600)) * time.Second
	}
	return defaultKeepalive
}

// processServer implements process.Process.
type processServer struct{ s *Service }

func (ps *processServer) Start(ctx context.Context, req *connect.Request[ppb.StartRequest], stream *connect.ServerStream[ppb.StartResponse]) error {
	p, sub, err := ps.s.start(ctx, req.Header(), req.Msg)
	if err != nil {
		return rpcError(err)
	}
	return ps.s.follow(ctx, p, sub, keepaliveInterval(req.Header()), func(ev *ppb.ProcessEvent) error {
		return stream.Send(&ppb.StartResponse{Event: ev})
	})
}

func (ps *processServer) Connect(ctx context.Context, req *connect.Request[ppb.ConnectRequest], stream *connect.ServerStream[ppb.ConnectResponse]) error {
	p, err := ps.s.find(req.Msg.GetProcess(), true)
	if err != nil {
		return rpcError(err)
	}
	send := func(ev *ppb.ProcessEvent) error { return stream.Send(&ppb.ConnectResponse{Event: ev}) }
	sub, end := p.subscribe()
	if end != nil {
		if err := send(startEvent(p.pid)); err != nil {
			return err
		}
		return send(endEvent(end))
	}
	return ps.s.follow(ctx, p, sub, keepaliveInterval(req.Header()), send)
}

// follow streams p to a client: start, then output and keepalives, then
// end. A client that goes away stops following; the process goes on.
func (s *Service) follow(ctx context.Context, p *process, sub *subscriber, every time.Duration, send func(*ppb.ProcessEvent) error) error {
	defer p.unsubscribe(sub)
	if err := send(startEvent(p.pid)); err != nil {
		return err
	}
	t := time.NewTimer(every)
	defer t.Stop()
	for {
		select {
		case ev := <-sub.ch:
			if err := send(ev); err != nil {
				return err
			}
			if ev.GetEnd() != nil {
				return nil
			}
			t.Reset(every)
		case <-t.C:
			if err := send(keepaliveEvent); err != nil {
				return err
			}
			t.Reset(every)
		case <-ctx.Done():
			if errors.Is(ctx.Err(), context.DeadlineExceeded) {
				return connect.NewError(connect.CodeDeadlineExceeded, errors.New("process timed out"))
			}
			return connect.NewError(connect.CodeCanceled, ctx.Err())
		case <-s.run.Context().Done():
			return connect.NewError(connect.CodeUnavailable, errors.New("agent is shutting down"))
		}
	}
}

// start starts msg's process and subscribes the caller before any output
// is read. With a deadline on ctx (Connect-Timeout-Ms) the process is
// killed at the deadline, whether or not the stream is still there.
func (s *Service) start(ctx context.Context, h http.Header, msg *ppb.StartRequest) (*process, *subscriber, error) {
	cfg := msg.GetProcess()
	if cfg.GetCmd() == "" {
		return nil, nil, errdefs.Newf(errdefs.ErrInvalidArgument, "process.cmd is required")
	}
	a, err := s.rpcAccount(h)
	if err != nil {
		return nil, nil, err
	}
	cred, err := a.credential()
	if err != nil {
		return nil, nil, err
	}
	cwd, err := s.processCwd(cfg.Cwd, a)
	if err != nil {
		return nil, nil, err
	}
	reqEnv := make([]string, 0, len(cfg.GetEnvs()))
	for k, v := range cfg.GetEnvs() {
		reqEnv = append(reqEnv, k+"="+v)
	}
	env := proc.MergeEnv(s.run.Env(nil), []string{"HOME=" + a.home, "USER=" + a.name, "LOGNAME=" + a.name}, reqEnv)
	path, err := proc.LookPath(cfg.GetCmd(), env)
	if err != nil {
		return nil, nil, errdefs.Newf(errdefs.ErrInvalidArgument, "failed to start process: %v", err)
	}
	spec := proc.Spec{Path: path, Args: append([]string{cfg.GetCmd()}, cfg.GetArgs()...), Env: env, Dir: cwd}
	io, err := processFiles(&spec, msg, cred)
	if err != nil {
		return nil, nil, errdefs.Newf(errdefs.ErrInternal, "process stdio: %v", err)
	}
	pr, err := s.run.Start(spec)
	io.closeChild()
	if err != nil {
		io.closeOurs()
		if errors.Is(err, errdefs.ErrUnavailable) {
			return nil, nil, err
		}
		return nil, nil, errdefs.Newf(errdefs.ErrInvalidArgument, "failed to start process: %v", err)
	}
	p := &process{pid: pr.Pid, tag: msg.Tag, config: cfg, proc: pr, tty: io.tty, stdin: io.stdin, subs: make(map[*subscriber]struct{})}
	sub, _ := p.subscribe()
	id := strconv.Itoa(p.pid)
	// A new process under a reused pid replaces the retained exit.
	if err := s.procs.Add(id, p); err != nil {
		pr.Signal(syscall.SIGKILL)
		io.closeOurs()
		return nil, nil, err
	}
	var kill *time.Timer
	if dl, ok := ctx.Deadline(); ok {
		kill = time.AfterFunc(time.Until(dl), func() { pr.Signal(syscall.SIGKILL) })
	}
	s.pump(p, io.outs, kill)
	return p, sub, nil
}

// processCwd is the requested cwd resolved for a, or the default
// workdir, or a's home; it must exist.
func (s *Service) processCwd(cwd *string, a account) (string, error) {
	var dir string
	if cwd != nil && *cwd != "" {
		d, err := s.resolvePath(*cwd, a)
		if err != nil {
			return "", err
		}
		dir = d
	} else {
		dir = a.home
		if wd := s.opts.DefaultWorkdir; wd != "" {
			if st, err := os.Stat(wd); err == nil && st.IsDir() {
				dir = wd
			}
		}
	}
	if st, err := os.Stat(dir); err != nil || !st.IsDir() {
		return "", errdefs.Newf(errdefs.ErrInvalidArgument, "cwd '%s' does not exist", dir)
	}
	return dir, nil
}

// stdio is a process's descriptors: ours (output read ends, stdin, the
// PTY master) and the child's, closed once it has started.
type stdio struct {
	tty   *os.File
	stdin *os.File
	outs  []*os.File // stdout, stderr; or the PTY master
	child []*os.File
}

func (io stdio) closeChild() {
	for _, f := range io.child {
		f.Close()
	}
}

func (io stdio) closeOurs() {
	for _, f := range io.outs {
		f.Close()
	}
	if io.stdin != nil && io.stdin != io.tty {
		io.stdin.Close()
	}
}

// processFiles gives spec a terminal of msg's size as its controlling tty
// in a new session, or pipes (stdin only when asked for, or by default)
// in a new process group.
func processFiles(spec *proc.Spec, msg *ppb.StartRequest, cred *syscall.Credential) (stdio, error) {
	if msg.Pty != nil {
		ptmx, tty, err := creackpty.Open()
		if err != nil {
			return stdio{}, err
		}
		cols, rows := msg.Pty.GetSize().GetCols(), msg.Pty.GetSize().GetRows()
		if cols == 0 || rows == 0 {
			cols, rows = 80, 24
		}
		creackpty.Setsize(ptmx, &creackpty.Winsize{Cols: uint16(cols), Rows: uint16(rows)})
		spec.Files = []*os.File{tty, tty, tty}
		spec.Sys = &syscall.SysProcAttr{Setsid: true, Setctty: true, Ctty: 0, Credential: cred}
		return stdio{tty: ptmx, outs: []*os.File{ptmx}, child: []*os.File{tty}}, nil
	}
	var io stdio
	fail := func(err error) (stdio, error) {
		io.closeChild()
		io.closeOurs()
		return stdio{}, err
	}
	var in *os.File
	if msg.Stdin == nil || *msg.Stdin {
		r, w, err := os.Pipe()
		if err != nil {
			return fail(err)
		}
		in, io.stdin = r, w
	} else {
		f, err := os.Open(os.DevNull)
		if err != nil {
			return fail(err)
		}
		in = f
	}
	io.child = append(io.child, in)
	for range 2 {
		r, w, err := os.Pipe()
		if err != nil {
			return fail(err)
		}
		io.outs = append(io.outs, r)
		io.child = append(io.child, w)
	}
	spec.Files = io.child
	spec.Sys = &syscall.SysProcAttr{Setpgid: true, Credential: cred}
	return io, nil
}

// pump publishes p's output in chunks until it exits, then its end, and
// keeps the exit for retainExited.
func (s *Service) pump(p *process, outs []*os.File, kill *time.Timer) {
	var wg sync.WaitGroup
	for i, f := range outs {
		wrap := func(b []byte) *ppb.ProcessEvent_DataEvent {
			switch {
			case p.tty != nil:
				return &ppb.ProcessEvent_DataEvent{Output: &ppb.ProcessEvent_DataEvent_Pty{Pty: b}}
			case i == 1:
				return &ppb.ProcessEvent_DataEvent{Output: &ppb.ProcessEvent_DataEvent_Stderr{Stderr: b}}
			}
			return &ppb.ProcessEvent_DataEvent{Output: &ppb.ProcessEvent_DataEvent_Stdout{Stdout: b}}
		}
		deliver := func(b []byte) {
			p.publish(&ppb.ProcessEvent{Event: &ppb.ProcessEvent_Data{Data: wrap(append([]byte(nil), b...))}}, nil)
		}
		wg.Add(1)
		s.run.Go(func() {
			defer wg.Done()
			buf := make([]byte, chunkSize)
			for {
				n, err := f.Read(buf)
				if n > 0 {
					deliver(buf[:n])
				}
				if errors.Is(err, os.ErrDeadlineExceeded) {
					// The process is gone but something it left holds
					// the pipe: take what is buffered and stop.
					proc.Drain(f, buf, deliver)
					return
				}
				if err != nil {
					return // EOF, or EIO once a PTY's slave side is closed
				}
			}
		})
	}
	s.run.Go(func() {
		<-p.proc.Done()
		if kill != nil {
			kill.Stop()
		}
		for _, f := range outs {
			f.SetReadDeadline(time.Now().Add(100 * time.Millisecond))
		}
		wg.Wait()
		for _, f := range outs {
			f.Close()
		}
		p.inMu.Lock()
		if p.stdin != nil {
			p.stdin.Close()
			p.stdin = nil
		}
		p.inMu.Unlock()
		ws := p.proc.Status()
		end := &ppb.ProcessEvent_EndEvent{ExitCode: int32(proc.ExitCode(ws)), Exited: ws.Exited(), Status: proc.DescribeStatus(ws)}
		if !ws.Exited() || ws.ExitStatus() != 0 {
			end.Error = &end.Status
		}
		p.publish(endEvent(end), end)
		id := strconv.Itoa(p.pid)
		time.AfterFunc(retainExited, func() {
			if cur, err := s.procs.Get(id); err == nil && cur == p {
				s.procs.Remove(id)
			}
		})
	})
}

// find returns the process sel names: by pid (an exited one only when
// withExited), or the first live one with the tag.
func (s *Service) find(sel *ppb.ProcessSelector, withExited bool) (*process, error) {
	switch v := sel.GetSelector().(type) {
	case *ppb.ProcessSelector_Pid:
		p, err := s.procs.Get(strconv.FormatUint(uint64(v.Pid), 10))
		if err != nil || (!withExited && p.exited()) {
			return nil, errdefs.Newf(errdefs.ErrNotFound, "process with pid %d not found", v.Pid)
		}
		return p, nil
	case *ppb.ProcessSelector_Tag:
		live := s.procs.List(func(p *process) bool { return p.tag != nil && *p.tag == v.Tag })
		for _, p := range live {
			if !p.exited() {
				return p, nil
			}
		}
		if withExited && len(live) > 0 {
			return live[0], nil
		}
		return nil, errdefs.Newf(errdefs.ErrNotFound, "process with tag %s not found", v.Tag)
	}
	return nil, errdefs.Newf(errdefs.ErrInvalidArgument, "a process selector (pid or tag) is required")
}

func (ps *processServer) List(ctx context.Context, req *connect.Request[ppb.ListRequest]) (*connect.Response[ppb.ListResponse], error) {
	var out []*ppb.ProcessInfo
	for _, p := range ps.s.procs.List(nil) {
		if !p.exited() {
			out = append(out, &ppb.ProcessInfo{Config: p.config, Pid: uint32(p.pid), Tag: p.tag})
		}
	}
	return connect.NewResponse(&ppb.ListResponse{Processes: out}), nil
}

func (ps *processServer) Update(ctx context.Context, req *connect.Request[ppb.UpdateRequest]) (*connect.Response[ppb.UpdateResponse], error) {
	p, err := ps.s.find(req.Msg.GetProcess(), false)
	if err != nil {
		return nil, rpcError(err)
	}
	if size := req.Msg.GetPty().GetSize(); size != nil {
		if p.tty == nil {
			return nil, rpcError(errdefs.Newf(errdefs.ErrInternal, "process %d has no pty", p.pid))
		}
		if err := creackpty.Setsize(p.tty, &creackpty.Winsize{Cols: uint16(size.GetCols()), Rows: uint16(size.GetRows())}); err != nil {
			return nil, rpcError(errdefs.Newf(errdefs.ErrInternal, "resize pty: %v", err))
		}
	}
	return connect.NewResponse(&ppb.UpdateResponse{}), nil
}

// write delivers in to p's stdin pipe or terminal.
func (p *process) write(in *ppb.ProcessInput) error {
	switch v := in.GetInput().(type) {
	case *ppb.ProcessInput_Stdin:
		if p.tty != nil {
			return errdefs.Newf(errdefs.ErrInternal, "process %d has a pty: send pty input", p.pid)
		}
		p.inMu.Lock()
		defer p.inMu.Unlock()
		if p.stdin == nil {
			return errdefs.Newf(errdefs.ErrInternal, "stdin not enabled or closed")
		}
		if _, err := p.stdin.Write(v.Stdin); err != nil {
			return errdefs.Newf(errdefs.ErrInternal, "write stdin: %v", err)
		}
		return nil
	case *ppb.ProcessInput_Pty:
		if p.tty == nil {
			return errdefs.Newf(errdefs.ErrInternal, "process %d has no pty: send stdin", p.pid)
		}
		if _, err := p.tty.Write(v.Pty); err != nil {
			return errdefs.Newf(errdefs.ErrInternal, "write pty: %v", err)
		}
		return nil
	}
	return errdefs.Newf(errdefs.ErrNotImplemented, "input must be stdin or pty")
}

func (ps *processServer) SendInput(ctx context.Context, req *connect.Request[ppb.SendInputRequest]) (*connect.Response[ppb.SendInputResponse], error) {
	p, err := ps.s.find(req.Msg.GetProcess(), false)
	if err != nil {
		return nil, rpcError(err)
	}
	if err := p.write(req.Msg.GetInput()); err != nil {
		return nil, rpcError(err)
	}
	return connect.NewResponse(&ppb.SendInputResponse{}), nil
}

func (ps *processServer) StreamInput(ctx context.Context, stream *connect.ClientStream[ppb.StreamInputRequest]) (*connect.Response[ppb.StreamInputResponse], error) {
	var p *process
	for stream.Receive() {
		switch ev := stream.Msg().GetEvent().(type) {
		case *ppb.StreamInputRequest_Start:
			found, err := ps.s.find(ev.Start.GetProcess(), false)
			if err != nil {
				return nil, rpcError(err)
			}
			p = found
		case *ppb.StreamInputRequest_Data:
			if p == nil {
				return nil, connect.NewError(connect.CodeFailedPrecondition, errors.New("the first message must be start"))
			}
			if err := p.write(ev.Data.GetInput()); err != nil {
				return nil, rpcError(err)
			}
		}
	}
	if err := stream.Err(); err != nil {
		return nil, err
	}
	return connect.NewResponse(&ppb.StreamInputResponse{}), nil
}

func (ps *processServer) SendSignal(ctx context.Context, req *connect.Request[ppb.SendSignalRequest]) (*connect.Response[ppb.SendSignalResponse], error) {
	var sig syscall.Signal
	switch req.Msg.GetSignal() {
	case ppb.Signal_SIGNAL_SIGKILL:
		sig = syscall.SIGKILL
	case ppb.Signal_SIGNAL_SIGTERM:
		sig = syscall.SIGTERM
	default:
		return nil, connect.NewError(connect.CodeUnimplemented, errors.New("signal must be SIGTERM or SIGKILL"))
	}
	p, err := ps.s.find(req.Msg.GetProcess(), false)
	if err != nil {
		return nil, rpcError(err)
	}
	// As envd: the process itself, not its group.
	if err := syscall.Kill(p.pid, sig); err != nil {
		return nil, rpcError(errdefs.Newf(errdefs.ErrNotFound, "process with pid %d not found", p.pid))
	}
	return connect.NewResponse(&ppb.SendSignalResponse{}), nil
}

func (ps *processServer) CloseStdin(ctx context.Context, req *connect.Request[ppb.CloseStdinRequest]) (*connect.Response[ppb.CloseStdinResponse], error) {
	p, err := ps.s.find(req.Msg.GetProcess(), false)
	if err != nil {
		return nil, rpcError(err)
	}
	if p.tty != nil {
		return nil, rpcError(errdefs.Newf(errdefs.ErrInternal, "process %d has a pty: send 0x04 (Ctrl+D) instead", p.pid))
	}
	p.inMu.Lock()
	defer p.inMu.Unlock()
	if p.stdin == nil {
		return nil, rpcError(errdefs.Newf(errdefs.ErrInternal, "stdin not enabled or closed"))
	}
	err = p.stdin.Close()
	p.stdin = nil
	if err != nil {
		return nil, rpcError(errdefs.Newf(errdefs.ErrInternal, "close stdin: %v", err))
	}
	return connect.NewResponse(&ppb.CloseStdinResponse{}), nil
}

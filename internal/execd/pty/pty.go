// Package pty is the agent's terminal service: POST /pty creates a session
// whose shell starts on the first WebSocket attach (GET /pty/{id}/ws), in a
// pseudo-terminal or, with ?pty=0, on pipes. Output is kept in a bounded
// replay buffer addressed by absolute offsets so a client can resume with
// ?since=; one client holds a session at a time (?takeover=1 replaces it).
package pty

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/coder/websocket"
	creackpty "github.com/creack/pty"
	"golang.org/x/sys/unix"

	"github.com/moat-sandbox/moat/internal/errdefs"
	"github.com/moat-sandbox/moat/internal/execd/proc"
	"github.com/moat-sandbox/moat/internal/execd/wire"
	"github.com/moat-sandbox/moat/internal/web"
)

// WebSocket binary frame type bytes (protocol §2.5).
const (
	FrameStdin  = 0x00
	FrameStdout = 0x01
	FrameStderr = 0x02
	FrameReplay = 0x03
)

// CloseTakenOver is the WebSocket close code sent to a client whose
// session another client took over (?takeover=1).
const CloseTakenOver = websocket.StatusCode(4001)

const (
	ptyReplayBytes   = 1 << 20 // replay buffer kept per session
	ptyPingInterval  = 30 * time.Second
	ptyWriteTimeout  = 10 * time.Second
	ptyReadLimit     = 1 << 20
	defaultTermValue = "xterm-256color"
)

// Service serves /pty.
type Service struct {
	run      *proc.Runner
	sessions *proc.Registry[*ptySession]
}

// New returns a Service that starts its shells through run.
func New(run *proc.Runner) *Service {
	return &Service{run: run, sessions: proc.NewRegistry[*ptySession](run, "pty session")}
}

// ptySession is an interactive shell driven over one WebSocket at a time.
// The shell starts on the first attach (in PTY mode, or pipe mode with
// ?pty=0). Output is kept in a bounded replay buffer addressed by absolute
// byte offsets, so a client can resume with ?since=.
type ptySession struct {
	id, cwd, command string

	mu       sync.Mutex
	started  bool
	pipeMode bool
	proc     *proc.Proc
	ptmx     *os.File // PTY mode
	stdin    *os.File
	replay   []byte // the last ≤ ptyReplayBytes bytes of output
	total    int64  // bytes of output ever produced
	exited   bool
	exitCode int
	exitCh   chan struct{} // closed when the process is reaped and output drained
	conn     *ptyConn      // current holder
}

// ptyConn is one attached WebSocket.
type ptyConn struct {
	ws   *websocket.Conn
	wmu  sync.Mutex
	done chan struct{} // closed when its handler returns
}

func (c *ptyConn) write(typ websocket.MessageType, p []byte) error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), ptyWriteTimeout)
	defer cancel()
	return c.ws.Write(ctx, typ, p)
}

func (c *ptyConn) writeJSON(v any) error {
	b, _ := json.Marshal(v)
	return c.write(websocket.MessageText, b)
}

// Create serves POST /pty.
func (s *Service) Create(w http.ResponseWriter, r *http.Request) error {
	var req struct {
		Cwd     string `json:"cwd"`
		Command string `json:"command"`
	}
	if err := wire.DecodeBody(r, &req, true); err != nil {
		return err
	}
	p := &ptySession{id: wire.NewID(), command: req.Command, exitCh: make(chan struct{})}
	if req.Cwd != "" {
		p.cwd = s.run.Expand(req.Cwd)
		if st, err := os.Stat(p.cwd); err != nil || !st.IsDir() {
			return wire.BadBody("cwd %s is not a directory", p.cwd)
		}
	}
	if err := s.sessions.Add(p.id, p); err != nil {
		return err
	}
	web.WriteJSON(w, http.StatusCreated, map[string]string{"session_id": p.id})
	return nil
}

// Get serves GET /pty/{id}: whether the shell runs and the output offset.
func (s *Service) Get(w http.ResponseWriter, r *http.Request) error {
	p, err := s.sessions.Get(r.PathValue("id"))
	if err != nil {
		return err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	return wire.WriteJSON(w, map[string]any{"session_id": p.id, "running": p.started && !p.exited, "output_offset": p.total})
}

// Delete serves DELETE /pty/{id}: it kills the shell and closes the socket.
func (s *Service) Delete(w http.ResponseWriter, r *http.Request) error {
	p, err := s.sessions.Remove(r.PathValue("id"))
	if err != nil {
		return err
	}
	p.mu.Lock()
	pr, conn, started := p.proc, p.conn, p.started
	p.mu.Unlock()
	if pr != nil {
		pr.Signal(syscall.SIGKILL)
	}
	if started && pr != nil {
		<-p.exitCh
	}
	if conn != nil {
		conn.ws.Close(websocket.StatusNormalClosure, "session deleted")
	}
	w.WriteHeader(http.StatusOK)
	return nil
}

// startLocked launches the shell. Preconditions: p.mu held, !p.started.
func (s *Service) startLocked(p *ptySession, pipeMode bool) error {
	spec := s.shellSpec(p)
	var fio shellFiles
	var err error
	if pipeMode {
		fio, err = pipeFiles(&spec)
	} else {
		fio, err = ptyFiles(&spec)
	}
	if err != nil {
		return err
	}
	pr, err := s.run.Start(spec)
	for _, f := range fio.child {
		f.Close()
	}
	if err != nil {
		for _, f := range fio.outs {
			f.Close()
		}
		fio.stdin.Close()
		return err
	}
	p.started, p.pipeMode, p.proc = true, pipeMode, pr
	p.ptmx, p.stdin = fio.ptmx, fio.stdin
	s.pumpUntilExit(p, pr, fio.outs, pipeMode)
	return nil
}

// shellSpec is the session's shell (interactive, or `-c command`) in its
// cwd, with a TERM.
func (s *Service) shellSpec(p *ptySession) proc.Spec {
	shell := s.run.Shell()
	args := []string{filepath.Base(shell), "-i"}
	if p.command != "" {
		args = []string{filepath.Base(shell), "-c", p.command}
	}
	env := s.run.Env(nil)
	if proc.LookupEnv(env, "TERM") == "" {
		env = append(env, "TERM="+defaultTermValue)
	}
	return proc.Spec{Path: shell, Args: args, Env: env, Dir: p.cwd}
}

// shellFiles are the agent's ends of a shell's stdio and the child's ends,
// which the agent closes once the shell has started.
type shellFiles struct {
	stdin *os.File
	ptmx  *os.File   // PTY mode only
	outs  []*os.File // read ends: stdout[, stderr]
	child []*os.File
}

// pipeFiles gives the shell three pipes in its own process group.
func pipeFiles(spec *proc.Spec) (shellFiles, error) {
	var fds [6]*os.File // inR inW outR outW errR errW
	for i := 0; i < len(fds); i += 2 {
		var err error
		if fds[i], fds[i+1], err = os.Pipe(); err != nil {
			for _, f := range fds[:i] {
				f.Close()
			}
			return shellFiles{}, err
		}
	}
	inR, inW, outR, outW, errR, errW := fds[0], fds[1], fds[2], fds[3], fds[4], fds[5]
	spec.Files = []*os.File{inR, outW, errW}
	spec.Sys = &syscall.SysProcAttr{Setpgid: true}
	return shellFiles{stdin: inW, outs: []*os.File{outR, errR}, child: []*os.File{inR, outW, errW}}, nil
}

// ptyFiles gives the shell an 80x24 terminal as its controlling tty, in a
// new session.
func ptyFiles(spec *proc.Spec) (shellFiles, error) {
	ptmx, tty, err := creackpty.Open()
	if err != nil {
		return shellFiles{}, err
	}
	creackpty.Setsize(ptmx, &creackpty.Winsize{Rows: 24, Cols: 80})
	spec.Files = []*os.File{tty, tty, tty}
	spec.Sys = &syscall.SysProcAttr{Setsid: true, Setctty: true, Ctty: 0}
	return shellFiles{stdin: ptmx, ptmx: ptmx, outs: []*os.File{ptmx}, child: []*os.File{tty}}, nil
}

// pumpUntilExit copies the shell's output until it exits, then records the
// exit, tells the attached client and closes its socket.
func (s *Service) pumpUntilExit(p *ptySession, pr *proc.Proc, outs []*os.File, pipeMode bool) {
	var wg sync.WaitGroup
	for i, f := range outs {
		kind := byte(FrameStdout)
		if i == 1 {
			kind = FrameStderr
		}
		wg.Add(1)
		s.run.Go(func() { defer wg.Done(); p.pump(f, kind) })
	}
	s.run.Go(func() {
		<-pr.Done()
		if pipeMode {
			// A grandchild may hold the pipes; give readers a moment.
			for _, f := range outs {
				f.SetReadDeadline(time.Now().Add(100 * time.Millisecond))
			}
		}
		wg.Wait()
		p.mu.Lock()
		p.exited, p.exitCode = true, proc.ExitCode(pr.Status())
		conn := p.conn
		code := p.exitCode
		p.stdin.Close()
		p.mu.Unlock()
		close(p.exitCh)
		if conn != nil {
			conn.writeJSON(map[string]any{"type": "exit", "exit_code": code})
			conn.ws.Close(websocket.StatusNormalClosure, "exited")
		}
	})
}

// pump copies output into the replay buffer and to the attached client.
func (p *ptySession) pump(f *os.File, kind byte) {
	defer f.Close()
	buf := make([]byte, 32<<10)
	for {
		n, err := f.Read(buf)
		if n > 0 {
			p.mu.Lock()
			p.replay = append(p.replay, buf[:n]...)
			if over := len(p.replay) - ptyReplayBytes; over > 0 {
				p.replay = append(p.replay[:0], p.replay[over:]...)
			}
			p.total += int64(n)
			conn := p.conn
			p.mu.Unlock()
			if conn != nil {
				conn.write(websocket.MessageBinary, append([]byte{kind}, buf[:n]...))
			}
		}
		if err != nil {
			return // EOF, EIO (PTY slave closed) or deadline after exit
		}
	}
}

type ptyError struct {
	Type    string `json:"type"`
	Code    string `json:"code"`
	Message string `json:"message"`
}

// attachOpts are the query parameters of GET /pty/{id}/ws.
type attachOpts struct {
	takeover bool
	pipeMode bool  // ?pty=0: start the shell on pipes
	since    int64 // replay output from this offset; -1: no replay
}

func parseAttach(r *http.Request) (attachOpts, error) {
	q := r.URL.Query()
	o := attachOpts{
		takeover: q.Get("takeover") == "1" || q.Get("takeover") == "true",
		pipeMode: q.Get("pty") == "0" || q.Get("pty") == "false",
		since:    -1,
	}
	if v := q.Get("since"); v != "" {
		var err error
		o.since, err = strconv.ParseInt(v, 10, 64)
		if err != nil || o.since < 0 {
			return o, errdefs.Invalid(wire.CodeInvalidRequestBody, "since must be a non-negative integer")
		}
	}
	return o, nil
}

// Attach serves GET /pty/{id}/ws, the WebSocket (protocol §2.5).
func (s *Service) Attach(w http.ResponseWriter, r *http.Request) error {
	p, err := s.sessions.Get(r.PathValue("id"))
	if err != nil {
		return err
	}
	o, err := parseAttach(r)
	if err != nil {
		return err
	}
	if err := p.detachFor(o.takeover); err != nil {
		return err
	}
	ws, err := websocket.Accept(w, r, &websocket.AcceptOptions{InsecureSkipVerify: true})
	if err != nil {
		return nil // Accept wrote the HTTP error
	}
	ws.SetReadLimit(ptyReadLimit)
	c := &ptyConn{ws: ws, done: make(chan struct{})}
	defer close(c.done)
	defer ws.CloseNow()
	if !s.attach(p, c, o) {
		return nil
	}
	defer p.detach(c)
	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	go c.keepAlive(ctx)
	p.serve(ctx, c)
	return nil
}

// detachFor makes room for a new client: with takeover the current holder
// is detached and told so (its close handshake runs on its own); without,
// a held session is a conflict.
func (p *ptySession) detachFor(takeover bool) error {
	p.mu.Lock()
	old := p.conn
	if old != nil && takeover {
		p.conn = nil
	}
	p.mu.Unlock()
	if old == nil {
		return nil
	}
	if !takeover {
		return errdefs.WithPublic(fmt.Errorf("pty %s: %w", p.id, errdefs.ErrConflict), "ALREADY_CONNECTED", "session already has a connected client")
	}
	go func() {
		old.writeJSON(ptyError{Type: "error", Code: "TAKEN_OVER", Message: "session taken over by another client"})
		old.ws.Close(CloseTakenOver, "TAKEN_OVER")
	}()
	return nil
}

// attach starts the shell if it has not started, greets c, replays output
// since o.since and makes c the holder. It reports false when c was turned
// away or the shell has exited (c is then told and closed).
func (s *Service) attach(p *ptySession, c *ptyConn, o attachOpts) bool {
	p.mu.Lock()
	if p.conn != nil {
		p.mu.Unlock()
		c.writeJSON(ptyError{Type: "error", Code: "ALREADY_CONNECTED", Message: "session already has a connected client"})
		c.ws.Close(websocket.StatusPolicyViolation, "ALREADY_CONNECTED")
		return false
	}
	if !p.started {
		if err := s.startLocked(p, o.pipeMode); err != nil {
			p.mu.Unlock()
			c.writeJSON(ptyError{Type: "error", Code: "START_FAILED", Message: err.Error()})
			c.ws.Close(websocket.StatusInternalError, "START_FAILED")
			return false
		}
	}
	mode := "pty"
	if p.pipeMode {
		mode = "pipe"
	}
	// Under p.mu no output can slip between the replay and live frames.
	c.writeJSON(map[string]any{"type": "connected", "session_id": p.id, "mode": mode})
	if o.since >= 0 {
		p.replayLocked(c, o.since)
	}
	exited, code := p.exited, p.exitCode
	if !exited {
		p.conn = c
	}
	p.mu.Unlock()
	if exited {
		c.writeJSON(map[string]any{"type": "exit", "exit_code": code})
		c.ws.Close(websocket.StatusNormalClosure, "exited")
	}
	return !exited
}

// replayLocked sends c the kept output from offset since (or from the
// oldest kept byte) as one replay frame. Preconditions: p.mu held.
func (p *ptySession) replayLocked(c *ptyConn, since int64) {
	start := p.total - int64(len(p.replay))
	from := max(since, start)
	if from >= p.total {
		return
	}
	frame := make([]byte, 9, 9+p.total-from)
	frame[0] = FrameReplay
	binary.BigEndian.PutUint64(frame[1:], uint64(from))
	frame = append(frame, p.replay[from-start:]...)
	c.write(websocket.MessageBinary, frame)
}

// detach drops c as the holder unless another client took over.
func (p *ptySession) detach(c *ptyConn) {
	p.mu.Lock()
	if p.conn == c {
		p.conn = nil
	}
	p.mu.Unlock()
}

// keepAlive pings the client until ctx is done and drops a client that
// does not answer.
func (c *ptyConn) keepAlive(ctx context.Context) {
	t := time.NewTicker(ptyPingInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			pctx, pc := context.WithTimeout(ctx, 2*ptyPingInterval)
			err := c.ws.Ping(pctx)
			pc()
			if err != nil {
				c.ws.CloseNow()
				return
			}
		}
	}
}

// serve reads c's frames until the socket ends: binary frames are stdin,
// text frames are JSON control messages.
func (p *ptySession) serve(ctx context.Context, c *ptyConn) {
	for {
		typ, data, err := c.ws.Read(ctx)
		if err != nil {
			return
		}
		if typ == websocket.MessageBinary {
			p.stdinFrame(c, data)
		} else {
			p.controlFrame(c, data)
		}
	}
}

func (p *ptySession) stdinFrame(c *ptyConn, data []byte) {
	if len(data) == 0 || data[0] != FrameStdin {
		c.writeJSON(ptyError{Type: "error", Code: "INVALID_FRAME", Message: "binary frames must start with 0x00"})
		return
	}
	if _, err := p.stdin.Write(data[1:]); err != nil && !errors.Is(err, os.ErrClosed) {
		c.writeJSON(ptyError{Type: "error", Code: "STDIN_WRITE_FAILED", Message: err.Error()})
	}
}

func (p *ptySession) controlFrame(c *ptyConn, data []byte) {
	var msg struct {
		Type   string `json:"type"`
		Cols   uint16 `json:"cols"`
		Rows   uint16 `json:"rows"`
		Signal string `json:"signal"`
	}
	if json.Unmarshal(data, &msg) != nil {
		c.writeJSON(ptyError{Type: "error", Code: "INVALID_FRAME", Message: "invalid JSON frame"})
		return
	}
	switch msg.Type {
	case "resize":
		if p.ptmx != nil && msg.Cols > 0 && msg.Rows > 0 {
			creackpty.Setsize(p.ptmx, &creackpty.Winsize{Cols: msg.Cols, Rows: msg.Rows})
		}
	case "signal":
		sig := signalByName(msg.Signal)
		if sig == 0 {
			c.writeJSON(ptyError{Type: "error", Code: "INVALID_FRAME", Message: "unknown signal " + msg.Signal})
			return
		}
		p.signal(sig)
	case "ping":
		c.writeJSON(map[string]string{"type": "pong"})
	default:
		c.writeJSON(ptyError{Type: "error", Code: "INVALID_FRAME", Message: "unknown frame type " + strconv.Quote(msg.Type)})
	}
}

// signal delivers sig to the terminal's foreground process group (PTY
// mode) or the shell's process group.
func (p *ptySession) signal(sig syscall.Signal) {
	p.mu.Lock()
	ptmx, pr := p.ptmx, p.proc
	p.mu.Unlock()
	if ptmx != nil {
		if pg, err := unix.IoctlGetInt(int(ptmx.Fd()), unix.TIOCGPGRP); err == nil && pg > 0 {
			if syscall.Kill(-pg, sig) == nil {
				return
			}
		}
	}
	if pr != nil {
		pr.Signal(sig)
	}
}

func signalByName(name string) syscall.Signal {
	switch name {
	case "SIGINT", "INT":
		return syscall.SIGINT
	case "SIGTERM", "TERM":
		return syscall.SIGTERM
	case "SIGKILL", "KILL":
		return syscall.SIGKILL
	case "SIGQUIT", "QUIT":
		return syscall.SIGQUIT
	case "SIGHUP", "HUP":
		return syscall.SIGHUP
	case "SIGTSTP", "TSTP":
		return syscall.SIGTSTP
	case "SIGCONT", "CONT":
		return syscall.SIGCONT
	case "SIGUSR1", "USR1":
		return syscall.SIGUSR1
	case "SIGUSR2", "USR2":
		return syscall.SIGUSR2
	case "SIGWINCH", "WINCH":
		return syscall.SIGWINCH
	}
	return 0
}

package execd

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/moat-sandbox/moat/internal/errdefs"
)

const (
	sigKILL = syscall.SIGKILL
	sigTERM = syscall.SIGTERM
)

// runCommandRequest is OpenSandbox's RunCommandRequest.
type runCommandRequest struct {
	Command    string            `json:"command"`
	Cwd        string            `json:"cwd"`
	Background bool              `json:"background"`
	Timeout    *int64            `json:"timeout"` // ms, >= 1; nil = no limit
	UID        *uint32           `json:"uid"`
	GID        *uint32           `json:"gid"`
	Envs       map[string]string `json:"envs"`
}

func (r *runCommandRequest) validate() error {
	if r.Command == "" {
		return errBody("invalid request, validation error: command is required")
	}
	if r.Timeout != nil && *r.Timeout < 0 {
		return errBody("invalid request, validation error: timeout must be >= 1 (ms)")
	}
	if r.GID != nil && r.UID == nil {
		return errBody("invalid request, validation error: gid requires uid")
	}
	return nil
}

// command is one /command execution, foreground or background.
type command struct {
	id         string
	content    string
	background bool
	startedAt  time.Time
	logPath    string
	proc       *Proc // nil if it failed to start

	mu         sync.Mutex
	finished   bool
	exitCode   int
	errMsg     string
	finishedAt time.Time
}

func (c *command) finish(code int, msg string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.finished {
		return
	}
	c.finished, c.exitCode, c.errMsg, c.finishedAt = true, code, msg, time.Now()
}

// commandStatus is the GET /command/status/{id} body.
type commandStatus struct {
	ID         string     `json:"id"`
	Content    string     `json:"content"`
	Running    bool       `json:"running"`
	ExitCode   *int       `json:"exit_code,omitempty"`
	Error      string     `json:"error,omitempty"`
	StartedAt  time.Time  `json:"started_at"`
	FinishedAt *time.Time `json:"finished_at,omitempty"`
}

func (c *command) status() commandStatus {
	c.mu.Lock()
	defer c.mu.Unlock()
	st := commandStatus{ID: c.id, Content: c.content, Running: !c.finished, StartedAt: c.startedAt}
	if c.finished {
		code, at := c.exitCode, c.finishedAt
		st.ExitCode, st.Error, st.FinishedAt = &code, c.errMsg, &at
	}
	return st
}

// credential resolves uid/gid into a SysProcAttr credential: gid defaults
// to the user's primary group and supplementary groups come from the user
// database (when the uid is known there).
func credential(uid, gid *uint32) *syscall.Credential {
	if uid == nil {
		return nil
	}
	cred := &syscall.Credential{Uid: *uid, Gid: *uid}
	u, err := user.LookupId(strconv.FormatUint(uint64(*uid), 10))
	if err == nil {
		if g, err := strconv.ParseUint(u.Gid, 10, 32); err == nil {
			cred.Gid = uint32(g)
		}
		if ids, err := u.GroupIds(); err == nil {
			for _, id := range ids {
				if g, err := strconv.ParseUint(id, 10, 32); err == nil {
					cred.Groups = append(cred.Groups, uint32(g))
				}
			}
		}
	} else {
		cred.NoSetGroups = os.Getuid() != 0
	}
	if gid != nil {
		cred.Gid = *gid
	}
	return cred
}

// shellSpec is the ProcSpec of `bash -c script` (or sh) in its own
// process group.
func (s *Server) shellSpec(script, cwd string, env []string, cred *syscall.Credential, files []*os.File) (ProcSpec, error) {
	dir := ""
	if cwd != "" {
		dir = expandPath(cwd, env)
		st, err := os.Stat(dir)
		if err != nil {
			return ProcSpec{}, fmt.Errorf("working directory %s: %w", dir, classifyOSError(err))
		}
		if !st.IsDir() {
			return ProcSpec{}, fmt.Errorf("working directory %s: not a directory: %w", dir, errdefs.ErrInvalidArgument)
		}
	}
	return ProcSpec{
		Path:  s.shell,
		Args:  []string{filepath.Base(s.shell), "-c", script},
		Env:   env,
		Dir:   dir,
		Files: files,
		Sys:   &syscall.SysProcAttr{Setpgid: true, Credential: cred},
	}, nil
}

func (s *Server) addCommand(c *command) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return errdefs.WithPublic(errdefs.ErrUnavailable, CodeRuntimeError, "agent is shutting down")
	}
	s.commands[c.id] = c
	return nil
}

func (s *Server) getCommand(id string) (*command, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	c, ok := s.commands[id]
	if !ok {
		return nil, errdefs.WithPublic(fmt.Errorf("command %q: %w", id, errdefs.ErrNotFound), CodeContextNotFound, "command not found: "+id)
	}
	return c, nil
}

// startError is the event sent after init when a command cannot start:
// upstream puts the error text in evalue.
func startError(err error) Event {
	msg := err.Error()
	return Event{Type: evError, Error: &EventError{EName: "CommandExecError", EValue: msg, Traceback: []string{msg}}}
}

// exitEvent is the final event of a finished shell execution: a non-zero
// exit is an error event (evalue = exit code) and no execution_complete.
func exitEvent(ws syscall.WaitStatus, started time.Time) Event {
	if ws.Exited() && ws.ExitStatus() == 0 {
		ms := time.Since(started).Milliseconds()
		return Event{Type: evExecutionComplete, ExecutionTime: &ms}
	}
	return Event{Type: evError, Error: &EventError{
		EName:     "CommandExecError",
		EValue:    strconv.Itoa(exitCode(ws)),
		Traceback: []string{describeStatus(ws)},
	}}
}

func (s *Server) handleRunCommand(w http.ResponseWriter, r *http.Request) error {
	var req runCommandRequest
	if err := decodeBody(r, &req, false); err != nil {
		return err
	}
	if err := req.validate(); err != nil {
		return err
	}
	c := &command{id: newID(), content: req.Command, background: req.Background, startedAt: time.Now()}
	c.logPath = filepath.Join(s.dir, c.id+".output")
	logf, err := os.OpenFile(c.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND|os.O_TRUNC, 0o600)
	if err != nil {
		return errRuntime(err, "error creating output file: "+err.Error())
	}
	var timeout time.Duration
	if req.Timeout != nil && *req.Timeout > 0 {
		timeout = time.Duration(*req.Timeout) * time.Millisecond
	}
	env := s.commandEnv(req.Envs)
	cred := credential(req.UID, req.GID)
	if req.Background {
		return s.runBackground(w, c, logf, env, cred, req.Cwd, timeout)
	}
	return s.runForeground(w, r, c, logf, env, cred, req.Cwd, timeout)
}

// runBackground starts the command with stdout+stderr appended directly to
// its output file and stdin /dev/null, then sends init and
// execution_complete at once.
func (s *Server) runBackground(w http.ResponseWriter, c *command, logf *os.File, env []string, cred *syscall.Credential, cwd string, timeout time.Duration) error {
	defer logf.Close()
	stream := newEventStream(w)
	devnull, err := os.Open(os.DevNull)
	if err != nil {
		return errRuntime(err, "")
	}
	defer devnull.Close()
	if err := s.addCommand(c); err != nil {
		return err
	}
	spec, err := s.shellSpec(c.content, cwd, env, cred, []*os.File{devnull, logf, logf})
	if err == nil {
		c.proc, err = s.reaper.Start(spec)
	}
	if err != nil {
		c.finish(255, err.Error())
		stream.send(Event{Type: evInit, Text: c.id})
		stream.send(startError(err))
		return nil
	}
	proc := c.proc
	s.track(func() {
		var deadline <-chan time.Time
		if timeout > 0 {
			t := time.NewTimer(timeout)
			defer t.Stop()
			deadline = t.C
		}
		select {
		case <-proc.Done():
		case <-deadline:
			proc.Signal(sigKILL)
			<-proc.Done()
		}
		ws := proc.Status()
		c.finish(exitCode(ws), errText(ws))
	})
	stream.send(Event{Type: evInit, Text: c.id})
	ms := time.Since(c.startedAt).Milliseconds()
	stream.send(Event{Type: evExecutionComplete, ExecutionTime: &ms})
	return nil
}

// errText is the status "error" field: empty on success.
func errText(ws syscall.WaitStatus) string {
	if ws.Exited() && ws.ExitStatus() == 0 {
		return ""
	}
	return describeStatus(ws)
}

// runForeground streams the command's output line by line as it is
// produced and ends the stream as soon as the process has exited and its
// output is flushed. A timeout, a client disconnect or a broken stream
// SIGKILLs the process group.
func (s *Server) runForeground(w http.ResponseWriter, r *http.Request, c *command, logf *os.File, env []string, cred *syscall.Credential, cwd string, timeout time.Duration) error {
	log := &outputLog{f: logf}
	defer logf.Close()
	stream := newEventStream(w)
	devnull, err := os.Open(os.DevNull)
	if err != nil {
		return errRuntime(err, "")
	}
	defer devnull.Close()
	outR, outW, err := os.Pipe()
	if err != nil {
		return errRuntime(err, "")
	}
	errR, errW, err := os.Pipe()
	if err != nil {
		outR.Close()
		outW.Close()
		return errRuntime(err, "")
	}
	if err := s.addCommand(c); err != nil {
		outR.Close()
		outW.Close()
		errR.Close()
		errW.Close()
		return err
	}
	spec, err := s.shellSpec(c.content, cwd, env, cred, []*os.File{devnull, outW, errW})
	if err == nil {
		c.proc, err = s.reaper.Start(spec)
	}
	outW.Close()
	errW.Close()
	if err != nil {
		outR.Close()
		errR.Close()
		c.finish(255, err.Error())
		stream.send(Event{Type: evInit, Text: c.id})
		stream.send(startError(err))
		return nil
	}
	proc := c.proc
	stream.onBroken = func() { proc.Signal(sigKILL) }
	if err := stream.send(Event{Type: evInit, Text: c.id}); err != nil {
		proc.Signal(sigKILL)
	}
	stream.startPings()

	outSplit := &lineSplitter{typ: evStdout}
	errSplit := &lineSplitter{typ: evStderr}
	var outBuf, errBuf []byte
	outPipe := newOutputPipe(outR, log, func(b []byte) {
		outBuf = outSplit.write(outBuf[:0], b)
		stream.write(outBuf)
	})
	errPipe := newOutputPipe(errR, log, func(b []byte) {
		errBuf = errSplit.write(errBuf[:0], b)
		stream.write(errBuf)
	})
	s.track(outPipe.run)
	s.track(errPipe.run)

	var deadline <-chan time.Time
	if timeout > 0 {
		t := time.NewTimer(timeout)
		defer t.Stop()
		deadline = t.C
	}
	select {
	case <-proc.Done():
	case <-deadline:
		proc.Signal(sigKILL)
	case <-r.Context().Done():
		proc.Signal(sigKILL)
	case <-s.ctx.Done():
		proc.Signal(sigKILL)
	}
	<-proc.Done()
	outPipe.markExited()
	errPipe.markExited()
	<-outPipe.flushed
	<-errPipe.flushed
	ws := proc.Status()
	c.finish(exitCode(ws), errText(ws))

	// The sinks are detached now, so the splitters are ours alone.
	stream.stopPings()
	tail := outSplit.flush(nil)
	tail = errSplit.flush(tail)
	tail = appendEvent(tail, exitEvent(ws, c.startedAt))
	stream.write(tail)
	if s.opts.Grace > 0 {
		select {
		case <-time.After(s.opts.Grace):
		case <-r.Context().Done():
		}
	}
	return nil
}

func (s *Server) handleCommandStatus(w http.ResponseWriter, r *http.Request, id string) error {
	c, err := s.getCommand(id)
	if err != nil {
		return err
	}
	return writeJSON(w, c.status())
}

// handleCommandLogs returns the merged output from byte offset cursor to
// the current end, and the new end offset in EXECD-COMMANDS-TAIL-CURSOR (as
// upstream does: a cursor beyond the end is clamped to it).
func (s *Server) handleCommandLogs(w http.ResponseWriter, r *http.Request, id string) error {
	c, err := s.getCommand(id)
	if err != nil {
		return err
	}
	var cursor int64
	if v := r.URL.Query().Get("cursor"); v != "" {
		cursor, err = strconv.ParseInt(v, 10, 64)
		if err != nil || cursor < 0 {
			return errdefs.Invalid(CodeInvalidRequestBody, "cursor must be a non-negative integer")
		}
	}
	f, err := os.Open(c.logPath)
	if err != nil {
		return errRuntime(err, "error opening command output: "+err.Error())
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return errRuntime(err, "")
	}
	end := st.Size()
	cursor = min(cursor, end)
	w.Header().Set("EXECD-COMMANDS-TAIL-CURSOR", strconv.FormatInt(end, 10))
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("Content-Length", strconv.FormatInt(end-cursor, 10))
	w.WriteHeader(http.StatusOK)
	io.Copy(w, io.NewSectionReader(f, cursor, end-cursor))
	return nil
}

// handleInterruptCommand sends SIGTERM to the command's process group and
// SIGKILL after KillGrace if it is still running.
func (s *Server) handleInterruptCommand(w http.ResponseWriter, r *http.Request) error {
	id := r.URL.Query().Get("id")
	if id == "" {
		return errMissingQuery("id")
	}
	c, err := s.getCommand(id)
	if err != nil {
		return err
	}
	if c.proc != nil {
		interrupt(r.Context(), c.proc, s.opts.KillGrace)
	}
	w.WriteHeader(http.StatusOK)
	return nil
}

// interrupt sends SIGTERM to p's group, then SIGKILL after grace, and
// waits (bounded by ctx) for the process to be reaped.
func interrupt(ctx context.Context, p *Proc, grace time.Duration) {
	p.Signal(sigTERM)
	if p.Exited() {
		return
	}
	t := time.NewTimer(grace)
	defer t.Stop()
	select {
	case <-p.Done():
		return
	case <-t.C:
	case <-ctx.Done():
	}
	p.Signal(sigKILL)
	select {
	case <-p.Done():
	case <-ctx.Done():
	}
}

// Package command is the agent's commands and sessions service: POST
// /command runs a shell command in the foreground (its output streamed as
// events) or in the background (its output kept in a file served by GET
// /command/{id}/logs); POST /session keeps env and cwd across runs. The
// registry holds every command, so its status and logs outlive the run.
package command

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/moat-sandbox/moat/internal/errdefs"
	"github.com/moat-sandbox/moat/internal/execd/proc"
	"github.com/moat-sandbox/moat/internal/execd/wire"
)

// Options configure a Service.
type Options struct {
	// Grace is slept after a finished foreground command (default 0).
	Grace time.Duration
	// KillGrace is how long DELETE /command waits between SIGTERM and
	// SIGKILL (default 3s).
	KillGrace time.Duration
}

// Service serves /command and /session.
type Service struct {
	run       *proc.Runner
	log       *slog.Logger
	grace     time.Duration
	killGrace time.Duration

	commands *proc.Registry[*command]
	sessions *proc.Registry[*session]
}

// New returns a Service that starts its processes through run.
func New(run *proc.Runner, opts Options) *Service {
	if opts.KillGrace == 0 {
		opts.KillGrace = 3 * time.Second
	}
	return &Service{
		run: run, log: run.Log(), grace: opts.Grace, killGrace: opts.KillGrace,
		commands: proc.NewRegistry[*command](run, "command"),
		sessions: proc.NewRegistry[*session](run, "session"),
	}
}

// RunRequest is OpenSandbox's RunCommandRequest.
type RunRequest struct {
	Command    string            `json:"command"`
	Cwd        string            `json:"cwd"`
	Background bool              `json:"background"`
	Timeout    *int64            `json:"timeout"` // ms, >= 1; nil = no limit
	UID        *uint32           `json:"uid"`
	GID        *uint32           `json:"gid"`
	Envs       map[string]string `json:"envs"`
}

func (r *RunRequest) validate() error {
	if r.Command == "" {
		return wire.BadBody("invalid request, validation error: command is required")
	}
	if r.Timeout != nil && *r.Timeout < 0 {
		return wire.BadBody("invalid request, validation error: timeout must be >= 1 (ms)")
	}
	if r.GID != nil && r.UID == nil {
		return wire.BadBody("invalid request, validation error: gid requires uid")
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
	proc       *proc.Proc // nil if it failed to start

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

// Status is the GET /command/status/{id} body.
type Status struct {
	ID         string     `json:"id"`
	Content    string     `json:"content"`
	Running    bool       `json:"running"`
	ExitCode   *int       `json:"exit_code,omitempty"`
	Error      string     `json:"error,omitempty"`
	StartedAt  time.Time  `json:"started_at"`
	FinishedAt *time.Time `json:"finished_at,omitempty"`
}

func (c *command) status() Status {
	c.mu.Lock()
	defer c.mu.Unlock()
	st := Status{ID: c.id, Content: c.content, Running: !c.finished, StartedAt: c.startedAt}
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

// startError is the event sent after init when a command cannot start:
// upstream puts the error text in evalue.
func startError(err error) wire.Event {
	msg := err.Error()
	return wire.Event{Type: wire.EvError, Error: &wire.EventError{EName: "CommandExecError", EValue: msg, Traceback: []string{msg}}}
}

// exitEvent is the final event of a finished shell execution: a non-zero
// exit is an error event (evalue = exit code) and no execution_complete.
func exitEvent(ws syscall.WaitStatus, started time.Time) wire.Event {
	if ws.Exited() && ws.ExitStatus() == 0 {
		ms := time.Since(started).Milliseconds()
		return wire.Event{Type: wire.EvExecutionComplete, ExecutionTime: &ms}
	}
	return wire.Event{Type: wire.EvError, Error: &wire.EventError{
		EName:     "CommandExecError",
		EValue:    strconv.Itoa(proc.ExitCode(ws)),
		Traceback: []string{proc.DescribeStatus(ws)},
	}}
}

// Run serves POST /command.
func (s *Service) Run(w http.ResponseWriter, r *http.Request) error {
	var req RunRequest
	if err := wire.DecodeBody(r, &req, false); err != nil {
		return err
	}
	if err := req.validate(); err != nil {
		return err
	}
	c := &command{id: wire.NewID(), content: req.Command, background: req.Background, startedAt: time.Now()}
	c.logPath = filepath.Join(s.run.Dir(), c.id+".output")
	logf, err := os.OpenFile(c.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND|os.O_TRUNC, 0o600)
	if err != nil {
		return wire.Runtime(err, "error creating output file: "+err.Error())
	}
	var timeout time.Duration
	if req.Timeout != nil && *req.Timeout > 0 {
		timeout = time.Duration(*req.Timeout) * time.Millisecond
	}
	env := s.run.Env(req.Envs)
	cred := credential(req.UID, req.GID)
	if req.Background {
		return s.runBackground(w, c, logf, env, cred, req.Cwd, timeout)
	}
	return s.runForeground(w, r, c, logf, env, cred, req.Cwd, timeout)
}

// runBackground starts the command with stdout+stderr appended directly to
// its output file and stdin /dev/null, then sends init and
// execution_complete at once.
func (s *Service) runBackground(w http.ResponseWriter, c *command, logf *os.File, env []string, cred *syscall.Credential, cwd string, timeout time.Duration) error {
	defer logf.Close()
	stream := wire.NewStream(w)
	devnull, err := os.Open(os.DevNull)
	if err != nil {
		return wire.Runtime(err, "")
	}
	defer devnull.Close()
	if err := s.commands.Add(c.id, c); err != nil {
		return err
	}
	if !s.start(c, stream, cwd, env, cred, []*os.File{devnull, logf, logf}) {
		return nil
	}
	p := c.proc
	s.run.Go(func() {
		s.waitOrKill(context.Background(), p, timeout)
		ws := p.Status()
		c.finish(proc.ExitCode(ws), errText(ws))
	})
	stream.Send(wire.Event{Type: wire.EvInit, Text: c.id})
	ms := time.Since(c.startedAt).Milliseconds()
	stream.Send(wire.Event{Type: wire.EvExecutionComplete, ExecutionTime: &ms})
	return nil
}

// start starts c's shell on files. When it cannot start, c finishes with
// 255, the stream gets init and the start error, and start reports false.
func (s *Service) start(c *command, stream *wire.Stream, cwd string, env []string, cred *syscall.Credential, files []*os.File) bool {
	spec, err := s.run.ShellSpec(c.content, cwd, env, cred, files)
	if err == nil {
		c.proc, err = s.run.Start(spec)
	}
	if err != nil {
		c.finish(255, err.Error())
		stream.Send(wire.Event{Type: wire.EvInit, Text: c.id})
		stream.Send(startError(err))
		return false
	}
	return true
}

// waitOrKill waits for p to exit, SIGKILLing its group after timeout (0:
// none), when ctx is done or when the agent shuts down.
func (s *Service) waitOrKill(ctx context.Context, p *proc.Proc, timeout time.Duration) {
	var deadline <-chan time.Time
	if timeout > 0 {
		t := time.NewTimer(timeout)
		defer t.Stop()
		deadline = t.C
	}
	select {
	case <-p.Done():
	case <-deadline:
		p.Signal(syscall.SIGKILL)
	case <-ctx.Done():
		p.Signal(syscall.SIGKILL)
	case <-s.run.Context().Done():
		p.Signal(syscall.SIGKILL)
	}
	<-p.Done()
}

// errText is the status "error" field: empty on success.
func errText(ws syscall.WaitStatus) string {
	if ws.Exited() && ws.ExitStatus() == 0 {
		return ""
	}
	return proc.DescribeStatus(ws)
}

// RunScript runs script as a foreground command with the base environment
// (POST /code without a language does this).
func (s *Service) RunScript(w http.ResponseWriter, r *http.Request, script string) error {
	c := &command{id: wire.NewID(), content: script, startedAt: time.Now()}
	c.logPath = filepath.Join(s.run.Dir(), c.id+".output")
	logf, err := os.OpenFile(c.logPath, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o600)
	if err != nil {
		return wire.Runtime(err, "")
	}
	return s.runForeground(w, r, c, logf, s.run.Env(nil), nil, "", 0)
}

// runForeground streams the command's output line by line as it is
// produced and ends the stream as soon as the process has exited and its
// output is flushed. A timeout, a client disconnect or a broken stream
// SIGKILLs the process group.
func (s *Service) runForeground(w http.ResponseWriter, r *http.Request, c *command, logf *os.File, env []string, cred *syscall.Credential, cwd string, timeout time.Duration) error {
	defer logf.Close()
	stream := wire.NewStream(w)
	devnull, err := os.Open(os.DevNull)
	if err != nil {
		return wire.Runtime(err, "")
	}
	defer devnull.Close()
	rs, ws, err := pipes(2) // stdout, stderr
	if err != nil {
		return wire.Runtime(err, "")
	}
	if err := s.commands.Add(c.id, c); err != nil {
		closeAll(rs, ws)
		return err
	}
	started := s.start(c, stream, cwd, env, cred, []*os.File{devnull, ws[0], ws[1]})
	closeAll(ws)
	if !started {
		closeAll(rs)
		return nil
	}
	p := c.proc
	stream.OnBroken = func() { p.Signal(syscall.SIGKILL) }
	if err := stream.Send(wire.Event{Type: wire.EvInit, Text: c.id}); err != nil {
		p.Signal(syscall.SIGKILL)
	}
	stream.StartPings()
	log := &outputLog{f: logf}
	stdout := s.streamLines(rs[0], log, wire.EvStdout, stream)
	stderr := s.streamLines(rs[1], log, wire.EvStderr, stream)
	s.waitOrKill(r.Context(), p, timeout)
	tail := finishLines(stdout, stderr)
	st := p.Status()
	c.finish(proc.ExitCode(st), errText(st))
	stream.StopPings()
	stream.Write(wire.AppendEvent(tail, exitEvent(st, c.startedAt)))
	if s.grace > 0 {
		select {
		case <-time.After(s.grace):
		case <-r.Context().Done():
		}
	}
	return nil
}

// Get serves GET /command/status/{id} and GET /command/{id}/logs, which
// overlap as ServeMux patterns, so one pattern ("GET /command/{a}/{b}")
// dispatches both.
func (s *Service) Get(w http.ResponseWriter, r *http.Request) error {
	if a, b := r.PathValue("a"), r.PathValue("b"); a == "status" {
		return s.handleCommandStatus(w, r, b)
	} else if b == "logs" {
		return s.handleCommandLogs(w, r, a)
	}
	return errdefs.WithPublic(errdefs.ErrNotFound, wire.CodeUnknown, "route not found: "+r.Method+" "+r.URL.Path)
}

func (s *Service) handleCommandStatus(w http.ResponseWriter, r *http.Request, id string) error {
	c, err := s.commands.Get(id)
	if err != nil {
		return err
	}
	return wire.WriteJSON(w, c.status())
}

// handleCommandLogs returns the merged output from byte offset cursor to
// the current end, and the new end offset in EXECD-COMMANDS-TAIL-CURSOR (as
// upstream does: a cursor beyond the end is clamped to it).
func (s *Service) handleCommandLogs(w http.ResponseWriter, r *http.Request, id string) error {
	c, err := s.commands.Get(id)
	if err != nil {
		return err
	}
	var cursor int64
	if v := r.URL.Query().Get("cursor"); v != "" {
		cursor, err = strconv.ParseInt(v, 10, 64)
		if err != nil || cursor < 0 {
			return errdefs.Invalid(wire.CodeInvalidRequestBody, "cursor must be a non-negative integer")
		}
	}
	f, err := os.Open(c.logPath)
	if err != nil {
		return wire.Runtime(err, "error opening command output: "+err.Error())
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return wire.Runtime(err, "")
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

// Interrupt serves DELETE /command?id=: it sends SIGTERM to the command's
// process group and SIGKILL after KillGrace if it is still running.
func (s *Service) Interrupt(w http.ResponseWriter, r *http.Request) error {
	id := r.URL.Query().Get("id")
	if id == "" {
		return wire.MissingQuery("id")
	}
	c, err := s.commands.Get(id)
	if err != nil {
		return err
	}
	if c.proc != nil {
		c.proc.Stop(r.Context(), s.killGrace)
	}
	w.WriteHeader(http.StatusOK)
	return nil
}

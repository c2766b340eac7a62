package command

import (
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/moat-sandbox/moat/internal/errdefs"
	"github.com/moat-sandbox/moat/internal/execd/proc"
	"github.com/moat-sandbox/moat/internal/execd/wire"
)

// session is a bash session (POST /session): every run is a fresh
// `bash --noprofile --norc <script>` whose script first restores the
// exported environment and cwd saved by the previous run and, on exit (an
// EXIT trap, so even `exit 3` saves), writes them back. So env vars and
// `cd` persist between runs, as upstream.
type session struct {
	id  string
	dir string // state: env, cwd, script

	mu   sync.Mutex
	proc *proc.Proc // running process, if any
	busy bool
}

func (ss *session) current() *proc.Proc {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	return ss.proc
}

const sessionDefaultTimeout = 24 * time.Hour

// CreateSession serves POST /session.
func (s *Service) CreateSession(w http.ResponseWriter, r *http.Request) error {
	var req struct {
		Cwd string `json:"cwd"`
	}
	if err := wire.DecodeBody(r, &req, true); err != nil {
		return err
	}
	ss := &session{id: wire.NewID()}
	ss.dir = filepath.Join(s.run.Dir(), "session-"+ss.id)
	if err := os.Mkdir(ss.dir, 0o700); err != nil {
		return wire.Runtime(err, "")
	}
	cwd := ""
	if req.Cwd != "" {
		cwd = s.run.Expand(req.Cwd)
		if st, err := os.Stat(cwd); err != nil || !st.IsDir() {
			os.RemoveAll(ss.dir)
			return wire.BadBody("cwd %s is not a directory", cwd)
		}
	}
	if cwd != "" {
		os.WriteFile(filepath.Join(ss.dir, "cwd"), []byte(cwd), 0o600)
	}
	if err := s.sessions.Add(ss.id, ss); err != nil {
		os.RemoveAll(ss.dir)
		return err
	}
	return wire.WriteJSON(w, map[string]string{"session_id": ss.id})
}

// DeleteSession serves DELETE /session/{id}: it kills a running command.
func (s *Service) DeleteSession(w http.ResponseWriter, r *http.Request) error {
	ss, err := s.sessions.Remove(r.PathValue("id"))
	if err != nil {
		return err
	}
	if p := ss.current(); p != nil {
		p.Signal(syscall.SIGKILL)
		<-p.Done()
	}
	os.RemoveAll(ss.dir)
	w.WriteHeader(http.StatusOK)
	return nil
}

// sessionScript wraps code so the session's env and cwd are restored
// first and saved on exit.
func sessionScript(dir, code, cwd string) string {
	q := shellQuote
	var b strings.Builder
	fmt.Fprintf(&b, "[ -f %s ] && . %s\n", q(dir+"/env"), q(dir+"/env"))
	if cwd != "" {
		fmt.Fprintf(&b, "cd %s || exit 1\n", q(cwd))
	} else {
		fmt.Fprintf(&b, "[ -f %s ] && cd \"$(cat %s)\"\n", q(dir+"/cwd"), q(dir+"/cwd"))
	}
	fmt.Fprintf(&b, "trap '__moat_rc=$?; pwd > %s; export -p > %s; exit $__moat_rc' EXIT\n", q(dir+"/cwd"), q(dir+"/env"))
	b.WriteString(code)
	b.WriteString("\n")
	return b.String()
}

func shellQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }

// sessionRun is the POST /session/{id}/run body.
type sessionRun struct {
	Command string `json:"command"`
	Cwd     string `json:"cwd"`
	Timeout int64  `json:"timeout"` // ms; 0: sessionDefaultTimeout
}

func decodeSessionRun(r *http.Request) (sessionRun, error) {
	var req sessionRun
	if err := wire.DecodeBody(r, &req, false); err != nil {
		return req, err
	}
	if req.Command == "" {
		return req, wire.BadBody("command is required")
	}
	if req.Timeout < 0 {
		return req, wire.BadBody("timeout must be >= 1 (ms)")
	}
	return req, nil
}

// claim makes ss busy for one run; a session runs one command at a time.
func (ss *session) claim() error {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	if ss.busy {
		return wire.Runtime(fmt.Errorf("%w: session is busy", errdefs.ErrConflict), "session is busy")
	}
	ss.busy = true
	return nil
}

func (ss *session) release() {
	ss.mu.Lock()
	ss.busy, ss.proc = false, nil
	ss.mu.Unlock()
}

func (ss *session) setProc(p *proc.Proc) {
	ss.mu.Lock()
	ss.proc = p
	ss.mu.Unlock()
}

// RunSession serves POST /session/{id}/run.
func (s *Service) RunSession(w http.ResponseWriter, r *http.Request) error {
	ss, err := s.sessions.Get(r.PathValue("id"))
	if err != nil {
		return err
	}
	req, err := decodeSessionRun(r)
	if err != nil {
		return err
	}
	timeout := sessionDefaultTimeout
	if req.Timeout > 0 {
		timeout = time.Duration(req.Timeout) * time.Millisecond
	}
	cwd := ""
	if req.Cwd != "" {
		cwd = s.run.Expand(req.Cwd)
	}
	if err := ss.claim(); err != nil {
		return err
	}
	defer ss.release()
	return s.runInSession(w, r, ss, sessionScript(ss.dir, req.Command, cwd), timeout)
}

// runInSession runs script with the shell, its stdout and stderr merged
// into stdout events, as a foreground command does.
func (s *Service) runInSession(w http.ResponseWriter, r *http.Request, ss *session, script string, timeout time.Duration) error {
	path := filepath.Join(ss.dir, "run.sh")
	if err := os.WriteFile(path, []byte(script), 0o600); err != nil {
		return wire.Runtime(err, "")
	}
	devnull, err := os.Open(os.DevNull)
	if err != nil {
		return wire.Runtime(err, "")
	}
	defer devnull.Close()
	pr, pw, err := os.Pipe()
	if err != nil {
		return wire.Runtime(err, "")
	}
	started := time.Now()
	p, err := s.run.Start(s.scriptSpec(path, []*os.File{devnull, pw, pw}))
	pw.Close()
	stream := wire.NewStream(w)
	if err != nil {
		pr.Close()
		stream.Send(wire.Event{Type: wire.EvInit, Text: ss.id})
		stream.Send(startError(err))
		return nil
	}
	ss.setProc(p)
	stream.OnBroken = func() { p.Signal(syscall.SIGKILL) }
	stream.Send(wire.Event{Type: wire.EvInit, Text: ss.id})
	stream.StartPings()
	out := s.streamLines(pr, io.Discard, wire.EvStdout, stream)
	s.waitOrKill(r.Context(), p, timeout)
	tail := finishLines(out)
	stream.StopPings()
	stream.Write(wire.AppendEvent(tail, exitEvent(p.Status(), started)))
	return nil
}

// scriptSpec runs the script file at path with the shell (bash without
// its startup files) in its own process group, with the base environment.
func (s *Service) scriptSpec(path string, files []*os.File) proc.Spec {
	args := []string{filepath.Base(s.run.Shell()), path}
	if filepath.Base(s.run.Shell()) == "bash" {
		args = []string{"bash", "--noprofile", "--norc", path}
	}
	return proc.Spec{
		Path: s.run.Shell(), Args: args, Env: s.run.Env(nil),
		Files: files, Sys: &syscall.SysProcAttr{Setpgid: true},
	}
}

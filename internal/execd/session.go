package execd

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
	proc *Proc // running process, if any
	busy bool
}

func (ss *session) current() *Proc {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	return ss.proc
}

const sessionDefaultTimeout = 24 * time.Hour

func (s *Server) handleCreateSession(w http.ResponseWriter, r *http.Request) error {
	var req struct {
		Cwd string `json:"cwd"`
	}
	if err := decodeBody(r, &req, true); err != nil {
		return err
	}
	ss := &session{id: newID()}
	ss.dir = filepath.Join(s.dir, "session-"+ss.id)
	if err := os.Mkdir(ss.dir, 0o700); err != nil {
		return errRuntime(err, "")
	}
	cwd := ""
	if req.Cwd != "" {
		cwd = s.expand(req.Cwd)
		if st, err := os.Stat(cwd); err != nil || !st.IsDir() {
			os.RemoveAll(ss.dir)
			return errBody("cwd %s is not a directory", cwd)
		}
	}
	if cwd != "" {
		os.WriteFile(filepath.Join(ss.dir, "cwd"), []byte(cwd), 0o600)
	}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		os.RemoveAll(ss.dir)
		return errdefs.WithPublic(errdefs.ErrUnavailable, CodeRuntimeError, "agent is shutting down")
	}
	s.sessions[ss.id] = ss
	s.mu.Unlock()
	return writeJSON(w, map[string]string{"session_id": ss.id})
}

func (s *Server) getSession(id string) (*session, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	ss, ok := s.sessions[id]
	if !ok {
		return nil, errContextNotFound("session", id)
	}
	return ss, nil
}

func (s *Server) handleDeleteSession(w http.ResponseWriter, r *http.Request) error {
	id := r.PathValue("id")
	s.mu.Lock()
	ss, ok := s.sessions[id]
	delete(s.sessions, id)
	s.mu.Unlock()
	if !ok {
		return errContextNotFound("session", id)
	}
	if p := ss.current(); p != nil {
		p.Signal(sigKILL)
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

func (s *Server) handleRunSession(w http.ResponseWriter, r *http.Request) error {
	ss, err := s.getSession(r.PathValue("id"))
	if err != nil {
		return err
	}
	var req struct {
		Command string `json:"command"`
		Cwd     string `json:"cwd"`
		Timeout int64  `json:"timeout"`
	}
	if err := decodeBody(r, &req, false); err != nil {
		return err
	}
	if req.Command == "" {
		return errBody("command is required")
	}
	if req.Timeout < 0 {
		return errBody("timeout must be >= 1 (ms)")
	}
	timeout := sessionDefaultTimeout
	if req.Timeout > 0 {
		timeout = time.Duration(req.Timeout) * time.Millisecond
	}
	cwd := ""
	if req.Cwd != "" {
		cwd = s.expand(req.Cwd)
	}
	ss.mu.Lock()
	if ss.busy {
		ss.mu.Unlock()
		return errRuntime(fmt.Errorf("%w: session is busy", errdefs.ErrConflict), "session is busy")
	}
	ss.busy = true
	ss.mu.Unlock()
	defer func() {
		ss.mu.Lock()
		ss.busy, ss.proc = false, nil
		ss.mu.Unlock()
	}()

	script := filepath.Join(ss.dir, "run.sh")
	if err := os.WriteFile(script, []byte(sessionScript(ss.dir, req.Command, cwd)), 0o600); err != nil {
		return errRuntime(err, "")
	}
	devnull, err := os.Open(os.DevNull)
	if err != nil {
		return errRuntime(err, "")
	}
	defer devnull.Close()
	pr, pw, err := os.Pipe()
	if err != nil {
		return errRuntime(err, "")
	}
	args := []string{filepath.Base(s.shell), script}
	if filepath.Base(s.shell) == "bash" {
		args = []string{"bash", "--noprofile", "--norc", script}
	}
	started := time.Now()
	proc, err := s.reaper.Start(ProcSpec{
		Path: s.shell, Args: args, Env: s.commandEnv(nil),
		Files: []*os.File{devnull, pw, pw}, Sys: &syscall.SysProcAttr{Setpgid: true},
	})
	pw.Close()
	stream := newEventStream(w)
	if err != nil {
		pr.Close()
		stream.send(Event{Type: evInit, Text: ss.id})
		stream.send(startError(err))
		return nil
	}
	ss.mu.Lock()
	ss.proc = proc
	ss.mu.Unlock()
	stream.onBroken = func() { proc.Signal(sigKILL) }
	stream.send(Event{Type: evInit, Text: ss.id})
	stream.startPings()
	split := &lineSplitter{typ: evStdout}
	var buf []byte
	pipe := newOutputPipe(pr, io.Discard, func(b []byte) {
		buf = split.write(buf[:0], b)
		stream.write(buf)
	})
	s.track(pipe.run)
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case <-proc.Done():
	case <-t.C:
		proc.Signal(sigKILL)
	case <-r.Context().Done():
		proc.Signal(sigKILL)
	case <-s.ctx.Done():
		proc.Signal(sigKILL)
	}
	<-proc.Done()
	pipe.markExited()
	<-pipe.flushed
	stream.stopPings()
	tail := split.flush(nil)
	stream.write(appendEvent(tail, exitEvent(proc.Status(), started)))
	return nil
}

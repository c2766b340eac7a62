package execd

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"sync"
	"syscall"
	"time"

	"github.com/moat-sandbox/moat/internal/errdefs"
)

// codeContext is a stateful interpreter (POST /code/context) run by one of
// the built-in drivers (repl_drivers.go). It runs one execution at a time.
type codeContext struct {
	id, language, cwd string

	mu       sync.Mutex // guards below
	proc     *Proc
	busy     bool
	dead     bool
	req      *os.File      // driver fd 4
	ctl      *bufio.Reader // driver fd 3
	ctlFile  *os.File
	out, err *syncPipe
	runs     int
	kernel   *kernelClient // set when a Jupyter kernel backs the context
}

func (c *codeContext) process() *Proc {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.proc
}

// codeContextInfo is the context JSON shape.
type codeContextInfo struct {
	ID       string `json:"id"`
	Language string `json:"language"`
	Cwd      string `json:"cwd,omitempty"`
}

// interpreter returns the argv of the driver for language.
func (s *Server) interpreter(language, stateDir string) ([]string, error) {
	env := s.baseEnv()
	switch language {
	case "python":
		for _, name := range []string{"python3", "python"} {
			if p, err := lookPath(name, env); err == nil {
				return []string{p, "-u", "-c", pythonDriver}, nil
			}
		}
		return nil, errdefs.WithPublic(errdefs.ErrFailedPrecondition, CodeRuntimeError, "language runtime not available: python3 is not installed in this image")
	case "javascript":
		for _, name := range []string{"node", "nodejs"} {
			if p, err := lookPath(name, env); err == nil {
				return []string{p, "-e", nodeDriver}, nil
			}
		}
		return nil, errdefs.WithPublic(errdefs.ErrFailedPrecondition, CodeRuntimeError, "language runtime not available: node is not installed in this image")
	case "bash":
		return []string{s.shell, "-c", bashDriver}, nil
	case "typescript", "java", "go", "sql":
		return nil, errdefs.WithPublic(errdefs.ErrNotImplemented, CodeRuntimeError,
			"language runtime server not configured, please check your image runtime (built-in interpreters: bash, python, javascript)")
	default:
		return nil, errdefs.Invalid(CodeInvalidRequestBody, "unknown language "+fmt.Sprintf("%q", language))
	}
}

// startContext starts c's interpreter: the image's Jupyter kernel for the
// language if it has one (kernelspec.go), else the built-in driver.
func (s *Server) startContext(ctx context.Context, c *codeContext) error {
	if ks := s.kernelFor(ctx, c.language); ks != nil {
		return s.startKernel(ctx, c, ks)
	}
	argv, err := s.interpreter(c.language, s.dir)
	if err != nil {
		return err
	}
	devnull, err := os.Open(os.DevNull)
	if err != nil {
		return errRuntime(err, "")
	}
	defer devnull.Close()
	var toClose []*os.File
	pipe := func() (*os.File, *os.File) {
		r, w, e := os.Pipe()
		if e != nil && err == nil {
			err = e
		}
		return r, w
	}
	outR, outW := pipe()
	errR, errW := pipe()
	ctlR, ctlW := pipe()
	reqR, reqW := pipe()
	if err != nil {
		return errRuntime(err, "")
	}
	toClose = append(toClose, outW, errW, ctlW, reqR)
	proc, err := s.reaper.Start(ProcSpec{
		Path: argv[0], Args: argv, Env: s.commandEnv(nil), Dir: c.cwd,
		Files: []*os.File{devnull, outW, errW, ctlW, reqR},
		Sys:   &syscall.SysProcAttr{Setpgid: true},
	})
	for _, f := range toClose {
		f.Close()
	}
	if err != nil {
		outR.Close()
		errR.Close()
		ctlR.Close()
		reqW.Close()
		return errRuntime(err, "error starting "+c.language+" interpreter: "+err.Error())
	}
	c.proc, c.req, c.ctlFile, c.ctl = proc, reqW, ctlR, bufio.NewReaderSize(ctlR, 64<<10)
	c.out, c.err = newSyncPipe(outR), newSyncPipe(errR)
	s.track(c.out.run)
	s.track(c.err.run)
	s.track(func() {
		<-proc.Done()
		c.mu.Lock()
		c.dead = true
		c.mu.Unlock()
		reqW.Close()
		ctlR.Close()
	})
	return nil
}

func (s *Server) createContext(ctx context.Context, language, cwd string) (*codeContext, error) {
	c := &codeContext{id: newID(), language: language}
	if cwd != "" {
		c.cwd = s.expand(cwd)
		if st, err := os.Stat(c.cwd); err != nil || !st.IsDir() {
			return nil, errBody("cwd %s is not a directory", c.cwd)
		}
	}
	if err := s.startContext(ctx, c); err != nil {
		return nil, err
	}
	s.mu.Lock()
	s.contexts[c.id] = c
	s.mu.Unlock()
	return c, nil
}

func (s *Server) handleCreateContext(w http.ResponseWriter, r *http.Request) error {
	var req struct {
		Language string `json:"language"`
		Cwd      string `json:"cwd"`
	}
	if err := decodeBody(r, &req, false); err != nil {
		return err
	}
	if req.Language == "" {
		return errBody("language is required")
	}
	c, err := s.createContext(r.Context(), req.Language, req.Cwd)
	if err != nil {
		return err
	}
	return writeJSON(w, codeContextInfo{ID: c.id, Language: c.language, Cwd: c.cwd})
}

func (s *Server) listContexts(language string) []*codeContext {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []*codeContext
	for _, c := range s.contexts {
		if language == "" || c.language == language {
			out = append(out, c)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].id < out[j].id })
	return out
}

func (s *Server) handleListContexts(w http.ResponseWriter, r *http.Request) error {
	out := []codeContextInfo{}
	for _, c := range s.listContexts(r.URL.Query().Get("language")) {
		out = append(out, codeContextInfo{ID: c.id, Language: c.language})
	}
	return writeJSON(w, out)
}

func (s *Server) removeContext(c *codeContext) {
	s.mu.Lock()
	delete(s.contexts, c.id)
	s.mu.Unlock()
	if p := c.process(); p != nil {
		p.Signal(sigKILL)
		<-p.Done()
	}
	if c.kernel != nil {
		c.kernel.removeFiles()
	}
}

func (s *Server) handleDeleteContexts(w http.ResponseWriter, r *http.Request) error {
	lang := r.URL.Query().Get("language")
	if lang == "" {
		return errMissingQuery("language")
	}
	for _, c := range s.listContexts(lang) {
		s.removeContext(c)
	}
	w.WriteHeader(http.StatusOK)
	return nil
}

func (s *Server) getContext(id string) (*codeContext, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	c, ok := s.contexts[id]
	if !ok {
		return nil, errContextNotFound("context", id)
	}
	return c, nil
}

func (s *Server) handleGetContext(w http.ResponseWriter, r *http.Request) error {
	c, err := s.getContext(r.PathValue("id"))
	if err != nil {
		return err
	}
	return writeJSON(w, codeContextInfo{ID: c.id, Language: c.language, Cwd: c.cwd})
}

func (s *Server) handleDeleteContext(w http.ResponseWriter, r *http.Request) error {
	c, err := s.getContext(r.PathValue("id"))
	if err != nil {
		return err
	}
	s.removeContext(c)
	w.WriteHeader(http.StatusOK)
	return nil
}

// handleInterruptCode sends SIGINT to the context's interpreter group.
func (s *Server) handleInterruptCode(w http.ResponseWriter, r *http.Request) error {
	id := r.URL.Query().Get("id")
	if id == "" {
		return errMissingQuery("id")
	}
	c, err := s.getContext(id)
	if err != nil {
		return err
	}
	if c.kernel != nil {
		if err := c.kernel.interrupt(r.Context()); err != nil {
			return errRuntime(err, "error interrupting the kernel: "+err.Error())
		}
	} else if p := c.process(); p != nil {
		p.Signal(syscall.SIGINT)
	}
	w.WriteHeader(http.StatusOK)
	return nil
}

// defaultContext returns (creating it lazily) the default context of a
// language: the oldest one.
func (s *Server) defaultContext(ctx context.Context, language string) (*codeContext, error) {
	if cs := s.listContexts(language); len(cs) > 0 {
		return cs[0], nil
	}
	return s.createContext(ctx, language, "")
}

type driverMsg struct {
	Type      string            `json:"type"`
	Text      string            `json:"text"`
	Data      map[string]string `json:"data"`
	EName     string            `json:"ename"`
	EValue    string            `json:"evalue"`
	Traceback []string          `json:"traceback"`
}

// handleRunCode executes code in a context and streams Jupyter-shaped
// events: init(context id), stdout/stderr (raw text), execution_count +
// result for a value, then execution_complete, or status + error.
func (s *Server) handleRunCode(w http.ResponseWriter, r *http.Request) error {
	var req struct {
		Context *struct {
			ID       string `json:"id"`
			Language string `json:"language"`
		} `json:"context"`
		Code string `json:"code"`
	}
	if err := decodeBody(r, &req, false); err != nil {
		return err
	}
	if req.Code == "" {
		return errBody("code is required")
	}
	var c *codeContext
	var err error
	switch {
	case req.Context != nil && req.Context.ID != "":
		c, err = s.getContext(req.Context.ID)
	case req.Context != nil && req.Context.Language != "" && req.Context.Language != "command":
		c, err = s.defaultContext(r.Context(), req.Context.Language)
	default:
		// No language: run as a shell command, like POST /command.
		cmd := &command{id: newID(), content: req.Code, startedAt: time.Now()}
		cmd.logPath = filepath.Join(s.dir, cmd.id+".output")
		logf, err := os.OpenFile(cmd.logPath, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o600)
		if err != nil {
			return errRuntime(err, "")
		}
		return s.runForeground(w, r, cmd, logf, s.commandEnv(nil), nil, "", 0)
	}
	if err != nil {
		return err
	}
	c.mu.Lock()
	if c.busy {
		c.mu.Unlock()
		return errRuntime(fmt.Errorf("%w: session is busy", errdefs.ErrConflict), "session is busy")
	}
	if c.dead {
		c.mu.Unlock()
		return errRuntime(fmt.Errorf("%w: interpreter exited", errdefs.ErrFailedPrecondition), "context interpreter has exited; create a new context")
	}
	c.busy = true
	c.runs++
	n := c.runs
	c.mu.Unlock()
	// release frees the context. It runs before the final event is sent,
	// so a client that starts its next cell as soon as it has read the
	// last event never finds the context busy.
	release := sync.OnceFunc(func() {
		c.mu.Lock()
		c.busy = false
		c.mu.Unlock()
	})
	defer release()

	if c.kernel != nil {
		return s.runKernel(w, r, c, req.Code, release)
	}
	code := req.Code
	if c.language == "bash" {
		cell := filepath.Join(s.dir, fmt.Sprintf("cell-%s-%d.sh", c.id, n))
		if err := os.WriteFile(cell, []byte(code+"\n"), 0o600); err != nil {
			return errRuntime(err, "")
		}
		defer os.Remove(cell)
		code = cell
	}
	line, _ := json.Marshal(map[string]string{"code": code})
	started := time.Now()
	stream := newEventStream(w)
	stream.send(Event{Type: evInit, Text: c.id})
	stream.startPings()
	defer stream.stopPings()
	c.out.setSink(func(b []byte) { stream.send(Event{Type: evStdout, Text: string(b)}) })
	c.err.setSink(func(b []byte) { stream.send(Event{Type: evStderr, Text: string(b)}) })
	detach := func() {
		c.out.setSink(nil)
		c.err.setSink(nil)
	}
	if _, err := c.req.Write(append(line, '\n')); err != nil {
		detach()
		stream.send(Event{Type: evError, Error: &EventError{EName: "RuntimeError", EValue: "interpreter is not running", Traceback: []string{err.Error()}}})
		return nil
	}

	// Interrupt the interpreter if the client goes away mid-execution
	// (and only then: stopWatch is closed before the context is released).
	stopWatch := make(chan struct{})
	unwatch := sync.OnceFunc(func() { close(stopWatch) })
	defer unwatch()
	go func() {
		select {
		case <-r.Context().Done():
			select {
			case <-stopWatch:
				return
			default:
			}
			if p := c.process(); p != nil {
				p.Signal(syscall.SIGINT)
			}
		case <-stopWatch:
		}
	}()

	var final Event
	for {
		raw, err := c.ctl.ReadBytes('\n')
		if err != nil {
			final = Event{Type: evError, Error: &EventError{EName: "RuntimeError", EValue: "interpreter exited", Traceback: []string{"the " + c.language + " interpreter exited"}}}
			break
		}
		var m driverMsg
		if json.Unmarshal(raw, &m) != nil {
			continue
		}
		switch m.Type {
		case "stdout":
			stream.send(Event{Type: evStdout, Text: m.Text})
		case "stderr":
			stream.send(Event{Type: evStderr, Text: m.Text})
		case "result":
			results := map[string]any{}
			for k, v := range m.Data {
				if k == "text/plain" {
					k = "text" // upstream's rename (protocol §14.2)
				}
				results[k] = v
			}
			stream.send(Event{Type: evExecutionCount, ExecutionCount: n})
			stream.send(Event{Type: evResult, ExecutionCount: n, Results: results})
		case "error":
			final = Event{Type: evError, Error: &EventError{EName: m.EName, EValue: m.EValue, Traceback: m.Traceback}}
		case "done":
			if final.Type == "" {
				ms := time.Since(started).Milliseconds()
				final = Event{Type: evExecutionComplete, ExecutionTime: &ms}
			}
		}
		if m.Type == "done" {
			break
		}
	}
	// Output written directly to fds 1/2 before "done" is delivered first.
	c.out.barrier()
	c.err.barrier()
	unwatch()
	detach()
	release()
	if final.Type == evError {
		stream.send(Event{Type: evStatus, Text: "error"})
	}
	stream.send(final)
	return nil
}

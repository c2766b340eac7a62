// Package code is the agent's code interpreter service (POST /code and
// /code/context): stateful contexts, each backed by the image's Jupyter
// kernel for the language (jupyter.go, kernelspec.go) or by a built-in
// driver (drivers.go), and the events their executions stream.
package code

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
	"github.com/moat-sandbox/moat/internal/execd/proc"
	"github.com/moat-sandbox/moat/internal/execd/wire"
)

// Options configure a Service.
type Options struct {
	// NoKernels makes contexts always use the built-in drivers, even when
	// the image has Jupyter kernels.
	NoKernels bool
	// KernelDirs overrides the kernelspec search path (nil = Jupyter's:
	// $JUPYTER_PATH, ~/.local/share, /usr/local/share, /usr/share); a
	// non-nil list also disables the plain `python3 -m ipykernel_launcher`
	// probe.
	KernelDirs []string
}

// ScriptRunner runs code that names no language as a foreground shell
// command (the commands service).
type ScriptRunner interface {
	RunScript(w http.ResponseWriter, r *http.Request, script string) error
}

// Service serves /code.
type Service struct {
	run   *proc.Runner
	shell ScriptRunner
	opts  Options

	mu       sync.Mutex
	contexts map[string]*codeContext // guarded by mu

	kernelMu sync.Mutex
	kernels  map[string]*KernelSpec // by language; nil entry = none (guarded by kernelMu)
}

// New returns a Service that starts interpreters through run and hands
// language-less code to shell.
func New(run *proc.Runner, shell ScriptRunner, opts Options) *Service {
	return &Service{
		run: run, shell: shell, opts: opts,
		contexts: make(map[string]*codeContext),
		kernels:  make(map[string]*KernelSpec),
	}
}

// codeContext is a stateful interpreter (POST /code/context) run by one of
// the built-in drivers (repl_drivers.go). It runs one execution at a time.
type codeContext struct {
	id, language, cwd string

	mu       sync.Mutex // guards below
	proc     *proc.Proc
	busy     bool
	dead     bool
	req      *os.File      // driver fd 4
	ctl      *bufio.Reader // driver fd 3
	ctlFile  *os.File
	out, err *syncPipe
	runs     int
	kernel   *kernelClient // set when a Jupyter kernel backs the context
}

func (c *codeContext) process() *proc.Proc {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.proc
}

// ContextInfo is the context JSON shape.
type ContextInfo struct {
	ID       string `json:"id"`
	Language string `json:"language"`
	Cwd      string `json:"cwd,omitempty"`
}

// interpreter returns the argv of the driver for language.
func (s *Service) interpreter(language, stateDir string) ([]string, error) {
	env := s.run.BaseEnv()
	switch language {
	case "python":
		for _, name := range []string{"python3", "python"} {
			if p, err := proc.LookPath(name, env); err == nil {
				return []string{p, "-u", "-c", pythonDriver}, nil
			}
		}
		return nil, errdefs.WithPublic(errdefs.ErrFailedPrecondition, wire.CodeRuntimeError, "language runtime not available: python3 is not installed in this image")
	case "javascript":
		for _, name := range []string{"node", "nodejs"} {
			if p, err := proc.LookPath(name, env); err == nil {
				return []string{p, "-e", nodeDriver}, nil
			}
		}
		return nil, errdefs.WithPublic(errdefs.ErrFailedPrecondition, wire.CodeRuntimeError, "language runtime not available: node is not installed in this image")
	case "bash":
		return []string{s.run.Shell(), "-c", bashDriver}, nil
	case "typescript", "java", "go", "sql":
		return nil, errdefs.WithPublic(errdefs.ErrNotImplemented, wire.CodeRuntimeError,
			"language runtime server not configured, please check your image runtime (built-in interpreters: bash, python, javascript)")
	default:
		return nil, errdefs.Invalid(wire.CodeInvalidRequestBody, "unknown language "+fmt.Sprintf("%q", language))
	}
}

// startContext starts c's interpreter: the image's Jupyter kernel for the
// language if it has one (kernelspec.go), else the built-in driver.
func (s *Service) startContext(ctx context.Context, c *codeContext) error {
	if ks := s.kernelFor(ctx, c.language); ks != nil {
		return s.startKernel(ctx, c, ks)
	}
	argv, err := s.interpreter(c.language, s.run.Dir())
	if err != nil {
		return err
	}
	devnull, err := os.Open(os.DevNull)
	if err != nil {
		return wire.Runtime(err, "")
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
		return wire.Runtime(err, "")
	}
	toClose = append(toClose, outW, errW, ctlW, reqR)
	proc, err := s.run.Start(proc.Spec{
		Path: argv[0], Args: argv, Env: s.run.Env(nil), Dir: c.cwd,
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
		return wire.Runtime(err, "error starting "+c.language+" interpreter: "+err.Error())
	}
	c.proc, c.req, c.ctlFile, c.ctl = proc, reqW, ctlR, bufio.NewReaderSize(ctlR, 64<<10)
	c.out, c.err = newSyncPipe(outR), newSyncPipe(errR)
	s.run.Go(c.out.run)
	s.run.Go(c.err.run)
	s.run.Go(func() {
		<-proc.Done()
		c.mu.Lock()
		c.dead = true
		c.mu.Unlock()
		reqW.Close()
		ctlR.Close()
	})
	return nil
}

func (s *Service) createContext(ctx context.Context, language, cwd string) (*codeContext, error) {
	c := &codeContext{id: wire.NewID(), language: language}
	if cwd != "" {
		c.cwd = s.run.Expand(cwd)
		if st, err := os.Stat(c.cwd); err != nil || !st.IsDir() {
			return nil, wire.BadBody("cwd %s is not a directory", c.cwd)
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

// CreateContext serves POST /code/context.
func (s *Service) CreateContext(w http.ResponseWriter, r *http.Request) error {
	var req struct {
		Language string `json:"language"`
		Cwd      string `json:"cwd"`
	}
	if err := wire.DecodeBody(r, &req, false); err != nil {
		return err
	}
	if req.Language == "" {
		return wire.BadBody("language is required")
	}
	c, err := s.createContext(r.Context(), req.Language, req.Cwd)
	if err != nil {
		return err
	}
	return wire.WriteJSON(w, ContextInfo{ID: c.id, Language: c.language, Cwd: c.cwd})
}

func (s *Service) listContexts(language string) []*codeContext {
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

// ListContexts serves GET /code/contexts[?language=].
func (s *Service) ListContexts(w http.ResponseWriter, r *http.Request) error {
	out := []ContextInfo{}
	for _, c := range s.listContexts(r.URL.Query().Get("language")) {
		out = append(out, ContextInfo{ID: c.id, Language: c.language})
	}
	return wire.WriteJSON(w, out)
}

func (s *Service) removeContext(c *codeContext) {
	s.mu.Lock()
	delete(s.contexts, c.id)
	s.mu.Unlock()
	if p := c.process(); p != nil {
		p.Signal(syscall.SIGKILL)
		<-p.Done()
	}
	if c.kernel != nil {
		c.kernel.removeFiles()
	}
}

// DeleteContexts serves DELETE /code/contexts?language=: it deletes every context of the language.
func (s *Service) DeleteContexts(w http.ResponseWriter, r *http.Request) error {
	lang := r.URL.Query().Get("language")
	if lang == "" {
		return wire.MissingQuery("language")
	}
	for _, c := range s.listContexts(lang) {
		s.removeContext(c)
	}
	w.WriteHeader(http.StatusOK)
	return nil
}

func (s *Service) getContext(id string) (*codeContext, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	c, ok := s.contexts[id]
	if !ok {
		return nil, wire.ContextNotFound("context", id)
	}
	return c, nil
}

// GetContext serves GET /code/contexts/{id}.
func (s *Service) GetContext(w http.ResponseWriter, r *http.Request) error {
	c, err := s.getContext(r.PathValue("id"))
	if err != nil {
		return err
	}
	return wire.WriteJSON(w, ContextInfo{ID: c.id, Language: c.language, Cwd: c.cwd})
}

// DeleteContext serves DELETE /code/contexts/{id}: it kills the interpreter.
func (s *Service) DeleteContext(w http.ResponseWriter, r *http.Request) error {
	c, err := s.getContext(r.PathValue("id"))
	if err != nil {
		return err
	}
	s.removeContext(c)
	w.WriteHeader(http.StatusOK)
	return nil
}

// Interrupt serves DELETE /code?id=: it sends SIGINT to the context's interpreter group.
func (s *Service) Interrupt(w http.ResponseWriter, r *http.Request) error {
	id := r.URL.Query().Get("id")
	if id == "" {
		return wire.MissingQuery("id")
	}
	c, err := s.getContext(id)
	if err != nil {
		return err
	}
	if c.kernel != nil {
		if err := c.kernel.interrupt(r.Context()); err != nil {
			return wire.Runtime(err, "error interrupting the kernel: "+err.Error())
		}
	} else if p := c.process(); p != nil {
		p.Signal(syscall.SIGINT)
	}
	w.WriteHeader(http.StatusOK)
	return nil
}

// defaultContext returns (creating it lazily) the default context of a
// language: the oldest one.
func (s *Service) defaultContext(ctx context.Context, language string) (*codeContext, error) {
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

// Run serves POST /code: it executes code in a context and streams Jupyter-shaped
// events: init(context id), stdout/stderr (raw text), execution_count +
// result for a value, then execution_complete, or status + error.
func (s *Service) Run(w http.ResponseWriter, r *http.Request) error {
	var req struct {
		Context *struct {
			ID       string `json:"id"`
			Language string `json:"language"`
		} `json:"context"`
		Code string `json:"code"`
	}
	if err := wire.DecodeBody(r, &req, false); err != nil {
		return err
	}
	if req.Code == "" {
		return wire.BadBody("code is required")
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
		return s.shell.RunScript(w, r, req.Code)
	}
	if err != nil {
		return err
	}
	c.mu.Lock()
	if c.busy {
		c.mu.Unlock()
		return wire.Runtime(fmt.Errorf("%w: session is busy", errdefs.ErrConflict), "session is busy")
	}
	if c.dead {
		c.mu.Unlock()
		return wire.Runtime(fmt.Errorf("%w: interpreter exited", errdefs.ErrFailedPrecondition), "context interpreter has exited; create a new context")
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
		cell := filepath.Join(s.run.Dir(), fmt.Sprintf("cell-%s-%d.sh", c.id, n))
		if err := os.WriteFile(cell, []byte(code+"\n"), 0o600); err != nil {
			return wire.Runtime(err, "")
		}
		defer os.Remove(cell)
		code = cell
	}
	line, _ := json.Marshal(map[string]string{"code": code})
	started := time.Now()
	stream := wire.NewStream(w)
	stream.Send(wire.Event{Type: wire.EvInit, Text: c.id})
	stream.StartPings()
	defer stream.StopPings()
	c.out.setSink(func(b []byte) { stream.Send(wire.Event{Type: wire.EvStdout, Text: string(b)}) })
	c.err.setSink(func(b []byte) { stream.Send(wire.Event{Type: wire.EvStderr, Text: string(b)}) })
	detach := func() {
		c.out.setSink(nil)
		c.err.setSink(nil)
	}
	if _, err := c.req.Write(append(line, '\n')); err != nil {
		detach()
		stream.Send(wire.Event{Type: wire.EvError, Error: &wire.EventError{EName: "RuntimeError", EValue: "interpreter is not running", Traceback: []string{err.Error()}}})
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

	var final wire.Event
	for {
		raw, err := c.ctl.ReadBytes('\n')
		if err != nil {
			final = wire.Event{Type: wire.EvError, Error: &wire.EventError{EName: "RuntimeError", EValue: "interpreter exited", Traceback: []string{"the " + c.language + " interpreter exited"}}}
			break
		}
		var m driverMsg
		if json.Unmarshal(raw, &m) != nil {
			continue
		}
		switch m.Type {
		case "stdout":
			stream.Send(wire.Event{Type: wire.EvStdout, Text: m.Text})
		case "stderr":
			stream.Send(wire.Event{Type: wire.EvStderr, Text: m.Text})
		case "result":
			results := map[string]any{}
			for k, v := range m.Data {
				if k == "text/plain" {
					k = "text" // upstream's rename (protocol §14.2)
				}
				results[k] = v
			}
			stream.Send(wire.Event{Type: wire.EvExecutionCount, ExecutionCount: n})
			stream.Send(wire.Event{Type: wire.EvResult, ExecutionCount: n, Results: results})
		case "error":
			final = wire.Event{Type: wire.EvError, Error: &wire.EventError{EName: m.EName, EValue: m.EValue, Traceback: m.Traceback}}
		case "done":
			if final.Type == "" {
				ms := time.Since(started).Milliseconds()
				final = wire.Event{Type: wire.EvExecutionComplete, ExecutionTime: &ms}
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
	if final.Type == wire.EvError {
		stream.Send(wire.Event{Type: wire.EvStatus, Text: "error"})
	}
	stream.Send(final)
	return nil
}

// Package code is the agent's code interpreter service (POST /code and
// /code/context): stateful contexts, each backed by the image's Jupyter
// kernel for its language (any language a kernelspec declares: jupyter.go,
// kernelspec.go) or else by a built-in driver (python, javascript,
// typescript, java through jshell, bash: driver.go, drivers.go), and the
// events their executions stream. Contexts are independent: each has its
// own interpreter process, ports, files and execution state.
package code

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"sync"
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
	ports *portPool

	contexts *proc.Registry[*codeContext]

	defaultMu sync.Mutex // serializes lazy creation of default contexts

	kernelMu sync.Mutex
	kernels  map[string]*KernelSpec // by language key; nil entry = none (guarded by kernelMu)
}

// New returns a Service that starts interpreters through run and hands
// language-less code to shell.
func New(run *proc.Runner, shell ScriptRunner, opts Options) *Service {
	return &Service{
		run: run, shell: shell, opts: opts, ports: newPortPool(),
		contexts: proc.NewRegistry[*codeContext](run, "context"),
		kernels:  make(map[string]*KernelSpec),
	}
}

// ContextInfo is the context JSON shape.
type ContextInfo struct {
	ID       string `json:"id"`
	Language string `json:"language"`
	Cwd      string `json:"cwd,omitempty"`
}

// createContext starts a context's interpreter and registers it.
func (s *Service) createContext(ctx context.Context, language, cwd string) (*codeContext, error) {
	c, err := s.startContext(ctx, wire.NewID(), "", language, cwd)
	if err != nil {
		return nil, err
	}
	if err := s.contexts.Add(c.id, c); err != nil {
		c.close()
		return nil, err
	}
	return c, nil
}

// startContext starts the interpreter of a context (not registered yet);
// gen tells a restarted context's files from its predecessor's.
func (s *Service) startContext(ctx context.Context, id, gen, language, cwd string) (*codeContext, error) {
	if !validLanguage(language) {
		return nil, wire.BadBody("invalid language %q", language)
	}
	if s.run.Closed() {
		return nil, wire.Unavailable()
	}
	c := &codeContext{id: id, language: language, key: languageKey(language), turn: make(chan struct{}, 1)}
	if cwd != "" {
		c.cwd = s.run.Expand(cwd)
		if st, err := os.Stat(c.cwd); err != nil || !st.IsDir() {
			return nil, wire.BadBody("cwd %s is not a directory", c.cwd)
		}
	}
	ks, d, err := s.backendFor(ctx, language)
	if err != nil {
		return nil, err
	}
	c.dir = filepath.Join(s.run.Dir(), "code-"+c.id+gen)
	if err := os.Mkdir(c.dir, 0o700); err != nil {
		return nil, wire.Runtime(err, "")
	}
	if ks != nil {
		c.backend, err = s.startKernel(ctx, c, ks)
	} else {
		c.backend, err = s.startDriver(ctx, c, d)
	}
	if err != nil {
		os.RemoveAll(c.dir)
		return nil, err
	}
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

// listContexts returns the contexts of language ("" = all) in creation
// order.
func (s *Service) listContexts(language string) []*codeContext {
	if language == "" {
		return s.contexts.List(nil)
	}
	key := languageKey(language)
	return s.contexts.List(func(c *codeContext) bool { return c.key == key })
}

// ListContexts serves GET /code/contexts[?language=].
func (s *Service) ListContexts(w http.ResponseWriter, r *http.Request) error {
	out := []ContextInfo{}
	for _, c := range s.listContexts(r.URL.Query().Get("language")) {
		out = append(out, ContextInfo{ID: c.id, Language: c.language})
	}
	return wire.WriteJSON(w, out)
}

// removeContext unregisters the context id, kills its interpreter and
// removes its files.
func (s *Service) removeContext(id string) error {
	c, err := s.contexts.Remove(id)
	if err != nil {
		return err
	}
	c.close()
	return nil
}

// DeleteContexts serves DELETE /code/contexts?language=: it deletes every
// context of the language.
func (s *Service) DeleteContexts(w http.ResponseWriter, r *http.Request) error {
	lang := r.URL.Query().Get("language")
	if lang == "" {
		return wire.MissingQuery("language")
	}
	for _, c := range s.listContexts(lang) {
		s.removeContext(c.id) // one deleted meanwhile is gone already
	}
	w.WriteHeader(http.StatusOK)
	return nil
}

// GetContext serves GET /code/contexts/{id}.
func (s *Service) GetContext(w http.ResponseWriter, r *http.Request) error {
	c, err := s.contexts.Get(r.PathValue("id"))
	if err != nil {
		return err
	}
	return wire.WriteJSON(w, ContextInfo{ID: c.id, Language: c.language, Cwd: c.cwd})
}

// DeleteContext serves DELETE /code/contexts/{id}: it kills the
// interpreter.
func (s *Service) DeleteContext(w http.ResponseWriter, r *http.Request) error {
	if err := s.removeContext(r.PathValue("id")); err != nil {
		return err
	}
	w.WriteHeader(http.StatusOK)
	return nil
}

// Interrupt serves DELETE /code?id=: it interrupts the context's running
// cell. An interrupt that arrives before the interpreter has begun the
// cell (right after the init event) is held and delivered when it begins.
func (s *Service) Interrupt(w http.ResponseWriter, r *http.Request) error {
	id := r.URL.Query().Get("id")
	if id == "" {
		return wire.MissingQuery("id")
	}
	c, err := s.contexts.Get(id)
	if err != nil {
		return err
	}
	if err := c.interrupt(r.Context()); err != nil {
		return wire.Runtime(err, "error interrupting the "+c.key+" interpreter: "+err.Error())
	}
	w.WriteHeader(http.StatusOK)
	return nil
}

// defaultContext returns (creating it lazily, once) the default context of
// a language: its oldest context.
func (s *Service) defaultContext(ctx context.Context, language string) (*codeContext, error) {
	if cs := s.listContexts(language); len(cs) > 0 {
		return cs[0], nil
	}
	s.defaultMu.Lock()
	defer s.defaultMu.Unlock()
	if cs := s.listContexts(language); len(cs) > 0 {
		return cs[0], nil
	}
	return s.createContext(ctx, language, "")
}

// Run serves POST /code: it executes code in a context and streams
// Jupyter-shaped events: init (the context id), stdout/stderr, then
// execution_count + result for a value, and execution_complete, or status
// "error" + error as the last event.
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
		c, err = s.contexts.Get(req.Context.ID)
	case req.Context != nil && req.Context.Language != "" && req.Context.Language != "command":
		c, err = s.defaultContext(r.Context(), req.Context.Language)
	default:
		// No language: run as a shell command, like POST /command.
		return s.shell.RunScript(w, r, req.Code)
	}
	if err != nil {
		return err
	}
	x, err := c.begin(s.run)
	if err != nil {
		return err
	}
	// x.end frees the context. It runs before the final event is sent,
	// so a client that starts its next cell as soon as it has read the
	// last event never finds the context busy.
	defer x.end()

	stream := wire.NewStream(w)
	stream.Send(wire.Event{Type: wire.EvInit, Text: c.id})
	stream.StartPings()
	defer stream.StopPings()

	started := time.Now()
	final := s.runCell(r.Context(), c, x, req.Code, stream)
	x.end()
	if final != nil {
		stream.Send(wire.Event{Type: wire.EvStatus, Text: "error"})
		stream.Send(wire.Event{Type: wire.EvError, Error: final})
		return nil
	}
	ms := time.Since(started).Milliseconds()
	stream.Send(wire.Event{Type: wire.EvExecutionComplete, ExecutionTime: &ms})
	return nil
}

// runCell runs code in x's context, streaming its events to sink, and
// returns the error that ended it (nil on success). A ctx that ends
// mid-execution (the client went away) interrupts the cell, so the
// context is usable again.
func (s *Service) runCell(ctx context.Context, c *codeContext, x *execution, code string, sink Sink) *wire.EventError {
	stopWatch := make(chan struct{})
	unwatch := sync.OnceFunc(func() { close(stopWatch) })
	defer unwatch()
	go func() {
		select {
		case <-ctx.Done():
			select {
			case <-stopWatch:
			default:
				x.cancel(s.run.Context())
			}
		case <-stopWatch:
		}
	}()
	final := c.backend.exec(ctx, x, code, sink)
	unwatch()
	if final == nil && x.cancelled() {
		final = &wire.EventError{EName: "ContextCancelled", EValue: "Interrupt kernel", Traceback: []string{}}
	}
	return final
}

// errBusy is the error of a second execution in a context that is
// running one (upstream's "session is busy").
func errBusy() error {
	return wire.Runtime(fmt.Errorf("%w: session is busy", errdefs.ErrConflict), "session is busy")
}

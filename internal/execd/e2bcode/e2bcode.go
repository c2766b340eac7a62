// Package e2bcode is the agent's E2B code interpreter: the HTTP API of
// E2B's code-interpreter server (port 49999: /execute streaming NDJSON,
// /contexts, /health) served over moat's own code contexts (package code),
// so that @e2b/code-interpreter's runCode and contexts reach every
// language the image has a Jupyter kernel or a built-in driver for. A
// context id is a moat code context id: a context made here is listed by
// the execd API too, and the other way round.
package e2bcode

import (
	"context"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync"

	"github.com/moat-sandbox/moat/internal/agentproto"
	"github.com/moat-sandbox/moat/internal/errdefs"
	"github.com/moat-sandbox/moat/internal/execd/code"
	"github.com/moat-sandbox/moat/internal/web"
)

// Options configure a Service.
type Options struct {
	// Token returns the current access token ("" = no auth), checked as
	// X-Access-Token on /execute (the one route the SDKs send it on).
	Token func() string
	// Workdir returns the cwd of a context created without one (E2B's
	// /home/user; the template's workdir).
	Workdir func() string
	// Log receives request logs (default slog.Default()).
	Log *slog.Logger
}

// Service serves the code interpreter over code's contexts.
type Service struct {
	code *code.Service
	opts Options

	// defaults are the contexts /execute uses for a language without a
	// context_id, made on first use (guarded by mu).
	mu       sync.Mutex
	defaults map[string]string
}

// New returns a Service over contexts.
func New(contexts *code.Service, opts Options) *Service {
	if opts.Token == nil {
		opts.Token = func() string { return "" }
	}
	if opts.Workdir == nil {
		opts.Workdir = func() string { return "/home/user" }
	}
	if opts.Log == nil {
		opts.Log = slog.Default()
	}
	return &Service{code: contexts, opts: opts, defaults: make(map[string]string)}
}

// Handler serves the code interpreter's routes. Unknown query parameters
// (the SDK's ?source=) are ignored; every response allows any origin.
func (s *Service) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /health", func(w http.ResponseWriter, r *http.Request) { writeJSON(w, "OK") })
	mux.HandleFunc("POST /execute", s.execute)
	mux.HandleFunc("POST /contexts", s.createContext)
	mux.HandleFunc("GET /contexts", s.listContexts)
	mux.HandleFunc("POST /contexts/{id}/restart", s.restartContext)
	mux.HandleFunc("DELETE /contexts/{id}", s.removeContext)
	return cors(mux)
}

// Context is E2B's context JSON.
type Context struct {
	ID       string `json:"id"`
	Language string `json:"language"`
	Cwd      string `json:"cwd"`
}

// normalizeLanguage is the server's normalize_language: no language is
// python, js and ts are javascript and typescript, case folds.
func normalizeLanguage(l string) string {
	switch l = strings.ToLower(strings.TrimSpace(l)); l {
	case "":
		return "python"
	case "js":
		return "javascript"
	case "ts":
		return "typescript"
	}
	return l
}

func (s *Service) createContext(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Language string `json:"language"`
		Cwd      string `json:"cwd"`
	}
	if err := decodeBody(r, &req, true); err != nil {
		writeText(w, http.StatusUnprocessableEntity, err.Error())
		return
	}
	c, err := s.create(r.Context(), normalizeLanguage(req.Language), req.Cwd)
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, c)
}

// create makes a context of language in cwd (default the workdir).
func (s *Service) create(ctx context.Context, language, cwd string) (Context, error) {
	if cwd == "" {
		cwd = s.opts.Workdir()
	}
	info, err := s.code.Create(ctx, language, cwd)
	if err != nil {
		return Context{}, err
	}
	return toContext(info), nil
}

func (s *Service) listContexts(w http.ResponseWriter, r *http.Request) {
	out := []Context{}
	for _, c := range s.code.Contexts() {
		out = append(out, toContext(c))
	}
	writeJSON(w, out)
}

func (s *Service) restartContext(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	if err := s.code.Restart(r.Context(), id); err != nil {
		writeContextError(w, id, err)
		return
	}
	writeJSON(w, nil)
}

func (s *Service) removeContext(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	if err := s.code.Remove(id); err != nil {
		writeContextError(w, id, err)
		return
	}
	s.mu.Lock()
	for l, d := range s.defaults {
		if d == id {
			delete(s.defaults, l)
		}
	}
	s.mu.Unlock()
	writeJSON(w, nil)
}

// defaultContext returns the id of language's default context, made (in
// the workdir) on first use or after it was removed.
func (s *Service) defaultContext(ctx context.Context, language string) (string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if id, ok := s.defaults[language]; ok {
		if _, err := s.code.Lookup(id); err == nil {
			return id, nil
		}
	}
	c, err := s.create(ctx, language, "")
	if err != nil {
		return "", err
	}
	s.defaults[language] = c.ID
	return c.ID, nil
}

// toContext is a moat context in E2B's shape (the language as E2B names
// it).
func toContext(c code.ContextInfo) Context {
	return Context{ID: c.ID, Language: normalizeLanguage(c.Language), Cwd: c.Cwd}
}

// authorized reports whether r carries the current token (always true
// when there is none).
func (s *Service) authorized(r *http.Request) bool {
	want := s.opts.Token()
	if want == "" {
		return true
	}
	got := r.Header.Get(agentproto.EnvdTokenHeader)
	return subtle.ConstantTimeCompare([]byte(got), []byte(want)) == 1
}

// decodeBody reads a JSON body into v; an empty body is {} when
// allowEmpty.
func decodeBody(r *http.Request, v any, allowEmpty bool) error {
	dec := json.NewDecoder(http.MaxBytesReader(nil, r.Body, web.MaxBodyBytes))
	if err := dec.Decode(v); err != nil {
		if errors.Is(err, io.EOF) && allowEmpty {
			return nil
		}
		if errors.Is(err, io.EOF) {
			return errors.New("request body is required")
		}
		return fmt.Errorf("invalid request body: %v", err)
	}
	return nil
}

// The server's error bodies are plain text, with the status the SDK maps
// (404 NotFoundError with the body, others SandboxError with the status).

func writeText(w http.ResponseWriter, status int, msg string) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.WriteHeader(status)
	io.WriteString(w, msg)
}

func writeJSON(w http.ResponseWriter, v any) {
	b, _ := json.Marshal(v)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusOK)
	w.Write(b)
}

// writeError writes err as text with the status of its class; the text is
// its public message when it has one.
func writeError(w http.ResponseWriter, err error) {
	status, _ := web.StatusOf(err)
	msg := err.Error()
	if p, ok := errdefs.PublicOf(err); ok {
		msg = p.Message
	}
	if errors.Is(err, errdefs.ErrNotImplemented) {
		// A language the image cannot run is bad input here: E2B has no
		// 501, and the SDK shows the status either way.
		status = http.StatusBadRequest
	}
	writeText(w, status, msg)
}

// writeContextError is a context route's error: E2B's "Context <id> not
// found" for an unknown id.
func writeContextError(w http.ResponseWriter, id string, err error) {
	if errors.Is(err, errdefs.ErrNotFound) {
		writeText(w, http.StatusNotFound, "Context "+id+" not found")
		return
	}
	writeError(w, err)
}

// cors lets any origin call the server, as E2B's does.
func cors(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		if r.Header.Get("Origin") != "" {
			h.Set("Access-Control-Allow-Origin", "*")
		}
		if r.Method == http.MethodOptions && r.Header.Get("Access-Control-Request-Method") != "" {
			h.Set("Access-Control-Allow-Methods", "GET, POST, DELETE, OPTIONS")
			h.Set("Access-Control-Allow-Headers", "*")
			h.Set("Access-Control-Max-Age", "7200")
			w.WriteHeader(http.StatusNoContent)
			return
		}
		next.ServeHTTP(w, r)
	})
}

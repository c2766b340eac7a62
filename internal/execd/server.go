// Package execd is moat's in-sandbox agent (`moat execd`): it runs as PID 1
// of every sandbox, starts the user entrypoint, reaps zombies, and serves
// the OpenSandbox execd HTTP API (commands, files, sessions, code contexts,
// PTY, metrics, port proxy) so that OpenSandbox SDKs work unchanged.
//
// The wire contract is /work/shared/reference/opensandbox-protocol.md §2.
// The package links only the standard library, x/sys, creack/pty,
// coder/websocket and go-zeromq/zmq4 (a pure-Go ZeroMQ, for Jupyter
// kernels).
package execd

import (
	"context"
	"crypto/rand"
	"crypto/subtle"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/moat-sandbox/moat/internal/errdefs"
	"github.com/moat-sandbox/moat/internal/web"
)

// Execd API error codes (protocol §2).
const (
	CodeInvalidRequestBody  = "INVALID_REQUEST_BODY"
	CodeMissingQuery        = "MISSING_QUERY"
	CodeRuntimeError        = "RUNTIME_ERROR"
	CodeInvalidFile         = "INVALID_FILE"
	CodeInvalidFileContent  = "INVALID_FILE_CONTENT"
	CodeInvalidFileMetadata = "INVALID_FILE_METADATA"
	CodeFileNotFound        = "FILE_NOT_FOUND"
	CodeUnknown             = "UNKNOWN"
	CodeContextNotFound     = "CONTEXT_NOT_FOUND"
	CodeNotSupported        = "NOT_SUPPORTED"
)

// TokenHeader carries the agent access token.
const TokenHeader = "X-EXECD-ACCESS-TOKEN"

// unauthorizedBody is upstream's exact 401 body (not the code/message shape).
const unauthorizedBody = `{"error":"Unauthorized: invalid or missing header X-EXECD-ACCESS-TOKEN"}`

// Options configure a Server.
type Options struct {
	// Token enables X-EXECD-ACCESS-TOKEN auth on every route when set.
	Token string
	// BaseEnv is the environment children inherit (already without the
	// agent's EXECD_*/MOAT_* variables).
	BaseEnv []string
	// EnvFile is read at each command start for extra KEY=VALUE lines.
	EnvFile string
	// StateDir is the parent of the server's private output directory
	// (default os.TempDir()).
	StateDir string
	// Grace is slept after a finished foreground command (default 0).
	Grace time.Duration
	// Reaper starts and reaps children (default: per-process waiting).
	Reaper *Reaper
	// Log receives request and process logs (default slog.Default()).
	Log *slog.Logger
	// KillGrace is how long DELETE /command waits between SIGTERM and
	// SIGKILL (default 3s).
	KillGrace time.Duration
	// NoKernels makes code contexts always use the built-in REPL drivers,
	// even when the image has Jupyter kernels.
	NoKernels bool
	// KernelDirs overrides the kernelspec search path (nil = Jupyter's:
	// $JUPYTER_PATH, ~/.local/share, /usr/local/share, /usr/share); a
	// non-nil list also disables the plain `python3 -m ipykernel_launcher`
	// probe.
	KernelDirs []string
}

// Server serves the execd API. Create it with NewServer and release it
// with Close, which kills every process it started.
type Server struct {
	opts    Options
	log     *slog.Logger
	reaper  *Reaper
	dir     string // private output directory, removed by Close
	shell   string // absolute path of bash, or sh
	handler http.Handler

	ctx    context.Context // cancelled by Close
	cancel context.CancelFunc

	mu       sync.Mutex
	commands map[string]*command     // guarded by mu
	sessions map[string]*session     // guarded by mu
	ptys     map[string]*ptySession  // guarded by mu
	contexts map[string]*codeContext // guarded by mu
	closed   bool

	wg sync.WaitGroup // background goroutines tied to processes

	envMu sync.RWMutex // guards opts.BaseEnv, which POST /moat/v1/env extends

	// token is the access token ("" = no auth); POST /moat/v1/token
	// replaces it.
	token atomic.Pointer[string]

	kernelMu sync.Mutex
	kernels  map[string]*kernelSpec // by language; nil entry = none (guarded by kernelMu)
}

// NewServer returns a Server.
func NewServer(opts Options) (*Server, error) {
	if opts.Log == nil {
		opts.Log = slog.Default()
	}
	if opts.Reaper == nil {
		opts.Reaper = NewReaper(false, opts.Log)
	}
	if opts.KillGrace == 0 {
		opts.KillGrace = 3 * time.Second
	}
	if opts.StateDir == "" {
		opts.StateDir = os.TempDir()
	}
	if err := os.MkdirAll(opts.StateDir, 0o755); err != nil {
		return nil, fmt.Errorf("execd state dir: %w", classifyOSError(err))
	}
	dir, err := os.MkdirTemp(opts.StateDir, "moat-execd-")
	if err != nil {
		return nil, fmt.Errorf("execd state dir: %w", classifyOSError(err))
	}
	ctx, cancel := context.WithCancel(context.Background())
	s := &Server{
		opts:     opts,
		log:      opts.Log,
		reaper:   opts.Reaper,
		dir:      dir,
		shell:    findShell(opts.BaseEnv),
		ctx:      ctx,
		cancel:   cancel,
		commands: make(map[string]*command),
		sessions: make(map[string]*session),
		ptys:     make(map[string]*ptySession),
		contexts: make(map[string]*codeContext),
		kernels:  make(map[string]*kernelSpec),
	}
	s.token.Store(&opts.Token)
	s.handler = s.routes()
	return s, nil
}

// ServeHTTP implements http.Handler.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) { s.handler.ServeHTTP(w, r) }

// Close kills every process group the server started (commands, sessions,
// PTYs, REPLs), waits for their output copiers, and removes the output
// directory. ctx bounds the wait.
func (s *Server) Close(ctx context.Context) error {
	s.mu.Lock()
	s.closed = true
	var procs []*Proc
	for _, c := range s.commands {
		procs = append(procs, c.proc)
	}
	for _, ss := range s.sessions {
		if p := ss.current(); p != nil {
			procs = append(procs, p)
		}
	}
	for _, p := range s.ptys {
		if pr := p.process(); pr != nil {
			procs = append(procs, pr)
		}
	}
	for _, c := range s.contexts {
		if pr := c.process(); pr != nil {
			procs = append(procs, pr)
		}
	}
	s.mu.Unlock()
	s.cancel()
	for _, p := range procs {
		if p != nil {
			p.Signal(sigKILL)
		}
	}
	done := make(chan struct{})
	go func() { s.wg.Wait(); close(done) }()
	var err error
	select {
	case <-done:
	case <-ctx.Done():
		err = ctx.Err()
	}
	os.RemoveAll(s.dir)
	return err
}

func (s *Server) routes() http.Handler {
	a := &web.Adapter{Log: s.log, Codes: codeOf}
	mux := http.NewServeMux()
	h := func(pattern string, f web.HandlerFunc) { mux.Handle(pattern, a.Handle(f)) }

	h("GET /ping", func(w http.ResponseWriter, r *http.Request) error { w.WriteHeader(http.StatusOK); return nil })

	h("POST /command", s.handleRunCommand)
	h("DELETE /command", s.handleInterruptCommand)
	// GET /command/status/{id} and GET /command/{id}/logs overlap as
	// ServeMux patterns, so one pattern dispatches both.
	h("GET /command/{a}/{b}", func(w http.ResponseWriter, r *http.Request) error {
		if a, b := r.PathValue("a"), r.PathValue("b"); a == "status" {
			return s.handleCommandStatus(w, r, b)
		} else if b == "logs" {
			return s.handleCommandLogs(w, r, a)
		}
		return errdefs.WithPublic(errdefs.ErrNotFound, CodeUnknown, "route not found: "+r.Method+" "+r.URL.Path)
	})

	s.fileRoutes(h)
	s.extraRoutes(h, mux)
	h("POST /moat/v1/env", s.handleSetEnv)
	h("POST /moat/v1/token", s.handleSetToken)

	mux.Handle("/", a.Handle(func(w http.ResponseWriter, r *http.Request) error {
		return errdefs.WithPublic(errdefs.ErrNotFound, CodeUnknown, "route not found: "+r.Method+" "+r.URL.Path)
	}))
	return web.Recover(s.log, s.auth(mux))
}

// auth enforces the access token on every route when one is configured.
// The comparison is constant-time.
func (s *Server) auth(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		want := *s.token.Load()
		if want == "" {
			next.ServeHTTP(w, r)
			return
		}
		got := r.Header.Get(TokenHeader)
		if subtle.ConstantTimeCompare([]byte(got), []byte(want)) != 1 {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusUnauthorized)
			io.WriteString(w, unauthorizedBody)
			return
		}
		next.ServeHTTP(w, r)
	})
}

// codeOf maps an error without a Public code to a status and execd code.
func codeOf(err error) (int, string) {
	status, _ := web.StatusOf(err)
	switch {
	case errors.Is(err, errdefs.ErrNotFound):
		return status, CodeFileNotFound
	case errors.Is(err, errdefs.ErrNotImplemented):
		return status, CodeNotSupported
	case status < 500:
		return status, CodeInvalidRequestBody
	default:
		return status, CodeRuntimeError
	}
}

// Error constructors with execd codes.
func errBody(format string, a ...any) error {
	return errdefs.Invalid(CodeInvalidRequestBody, fmt.Sprintf(format, a...))
}

func errMissingQuery(name string) error {
	return errdefs.Invalid(CodeMissingQuery, fmt.Sprintf("missing query parameter %q", name))
}

func errRuntime(err error, msg string) error {
	if msg == "" {
		msg = err.Error()
	}
	if !hasClass(err) {
		err = fmt.Errorf("%w: %v", errdefs.ErrInternal, err)
	}
	return errdefs.WithPublic(err, CodeRuntimeError, msg)
}

func errContextNotFound(kind, id string) error {
	return errdefs.WithPublic(fmt.Errorf("%s %q: %w", kind, id, errdefs.ErrNotFound), CodeContextNotFound, kind+" not found: "+id)
}

func hasClass(err error) bool {
	for _, c := range []error{errdefs.ErrNotFound, errdefs.ErrAlreadyExists, errdefs.ErrInvalidArgument,
		errdefs.ErrFailedPrecondition, errdefs.ErrConflict, errdefs.ErrUnauthenticated, errdefs.ErrPermissionDenied,
		errdefs.ErrUnavailable, errdefs.ErrNotImplemented, errdefs.ErrResourceExhausted, errdefs.ErrDeadlineExceeded,
		errdefs.ErrInternal} {
		if errors.Is(err, c) {
			return true
		}
	}
	return false
}

// decodeBody decodes a JSON body into v; allowEmpty accepts an empty body.
func decodeBody(r *http.Request, v any, allowEmpty bool) error {
	body := http.MaxBytesReader(nil, r.Body, web.MaxBodyBytes)
	dec := json.NewDecoder(body)
	if err := dec.Decode(v); err != nil {
		if errors.Is(err, io.EOF) && allowEmpty {
			return nil
		}
		if errors.Is(err, io.EOF) {
			return errBody("request body is required")
		}
		return errBody("error parsing request, invalid body format: %v", err)
	}
	return nil
}

// writeJSON writes v with status 200.
func writeJSON(w http.ResponseWriter, v any) error {
	web.WriteJSON(w, http.StatusOK, v)
	return nil
}

// newID returns a 32-hex random id (a uuid without dashes).
func newID() string {
	var b [16]byte
	rand.Read(b[:])
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return hex.EncodeToString(b[:])
}

const defaultPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// findShell returns bash from PATH, else sh, else /bin/sh.
func findShell(env []string) string {
	for _, name := range []string{"bash", "sh"} {
		if p, err := lookPath(name, env); err == nil {
			return p
		}
	}
	return "/bin/sh"
}

func lookupEnv(env []string, key string) string {
	for i := len(env) - 1; i >= 0; i-- {
		if k, v, ok := strings.Cut(env[i], "="); ok && k == key {
			return v
		}
	}
	return ""
}

// mergeEnv layers overlays over base; later keys win and keep the
// position of their first occurrence.
func mergeEnv(base []string, overlays ...[]string) []string {
	idx := make(map[string]int, len(base))
	out := make([]string, 0, len(base)+8)
	add := func(kv string) {
		k, _, _ := strings.Cut(kv, "=")
		if i, ok := idx[k]; ok {
			out[i] = kv
			return
		}
		idx[k] = len(out)
		out = append(out, kv)
	}
	for _, kv := range base {
		add(kv)
	}
	for _, o := range overlays {
		for _, kv := range o {
			add(kv)
		}
	}
	return out
}

// envFileLines reads KEY=VALUE lines from the EXECD_ENVS file (missing file
// = none; blank lines and # comments skipped).
func envFileLines(path string) []string {
	if path == "" {
		return nil
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return nil
	}
	var out []string
	for _, line := range strings.Split(string(data), "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		line = strings.TrimPrefix(line, "export ")
		if k, _, ok := strings.Cut(line, "="); ok && k != "" {
			out = append(out, line)
		}
	}
	return out
}

// commandEnv is the environment of a new child: base, env file, request.
func (s *Server) commandEnv(req map[string]string) []string {
	var extra []string
	for k, v := range req {
		extra = append(extra, k+"="+v)
	}
	return mergeEnv(s.baseEnv(), envFileLines(s.opts.EnvFile), extra)
}

// track runs f in a goroutine that Close waits for.
func (s *Server) track(f func()) {
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		f()
	}()
}

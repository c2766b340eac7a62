// Package execd is moat's in-sandbox agent: PID 1 of every sandbox, it
// starts the entrypoint, reaps zombies and serves the OpenSandbox execd API
// (protocol §2) so that OpenSandbox SDKs work unchanged. The API is split by
// service (command, files, pty, code, metrics, proxy, over the proc runner
// and wire framing); this package wires them, holds the route table, the
// token and moat extensions, and the main loop; cmd/moat-agent guards what
// it links. The E2B envd face (package envd) is served on a listener of its
// own over the same runner and token, and the E2B code interpreter
// (package e2bcode) on another, over the same code contexts.
package execd

import (
	"context"
	"crypto/subtle"
	"io"
	"log/slog"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/moat-sandbox/moat/internal/agentproto"
	"github.com/moat-sandbox/moat/internal/execd/code"
	"github.com/moat-sandbox/moat/internal/execd/command"
	"github.com/moat-sandbox/moat/internal/execd/e2bcode"
	"github.com/moat-sandbox/moat/internal/execd/envd"
	"github.com/moat-sandbox/moat/internal/execd/files"
	"github.com/moat-sandbox/moat/internal/execd/proc"
	"github.com/moat-sandbox/moat/internal/execd/proxy"
	"github.com/moat-sandbox/moat/internal/execd/pty"
	"github.com/moat-sandbox/moat/internal/web"
)

// TokenHeader carries the agent access token.
const TokenHeader = agentproto.TokenHeader

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
	Reaper *proc.Reaper
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
	// EnvdUser and EnvdWorkdir are the E2B envd face's default user
	// (default root) and working directory (default the user's home).
	EnvdUser, EnvdWorkdir string
}

// Server serves the execd API. Create it with NewServer and release it
// with Close, which kills every process it started.
type Server struct {
	log     *slog.Logger
	run     *proc.Runner
	handler http.Handler

	commands *command.Service
	files    *files.Service
	ptys     *pty.Service
	code     *code.Service
	proxy    *proxy.Handler
	envd     *envd.Service
	e2bcode  *e2bcode.Service

	// token is the access token ("" = no auth); POST /moat/v1/token
	// replaces it.
	token atomic.Pointer[string]
}

// NewServer returns a Server.
func NewServer(opts Options) (*Server, error) {
	if opts.Log == nil {
		opts.Log = slog.Default()
	}
	run, err := proc.NewRunner(proc.Options{
		Reaper: opts.Reaper, Log: opts.Log, BaseEnv: opts.BaseEnv, EnvFile: opts.EnvFile, StateDir: opts.StateDir,
	})
	if err != nil {
		return nil, err
	}
	commands := command.New(run, command.Options{Grace: opts.Grace, KillGrace: opts.KillGrace})
	s := &Server{
		log:      opts.Log,
		run:      run,
		commands: commands,
		files:    files.New(run),
		ptys:     pty.New(run),
		code:     code.New(run, commands, code.Options{NoKernels: opts.NoKernels, KernelDirs: opts.KernelDirs}),
		proxy:    &proxy.Handler{Log: opts.Log, TokenHeader: TokenHeader},
	}
	s.envd = envd.New(run, envd.Options{Token: s.currentToken, DefaultUser: opts.EnvdUser, DefaultWorkdir: opts.EnvdWorkdir})
	s.e2bcode = e2bcode.New(s.code, e2bcode.Options{Token: s.currentToken, Workdir: s.envd.DefaultWorkdir, Log: opts.Log})
	s.token.Store(&opts.Token)
	s.handler = s.routes()
	return s, nil
}

// currentToken is the access token ("" = no auth).
func (s *Server) currentToken() string { return *s.token.Load() }

// EnvdHandler serves the E2B envd face (its own listener): the same
// processes, runner and access token as the execd API.
func (s *Server) EnvdHandler() http.Handler { return web.Recover(s.log, s.envd.Handler()) }

// CodeInterpreterHandler serves the E2B code interpreter (its own
// listener) over the execd API's code contexts.
func (s *Server) CodeInterpreterHandler() http.Handler {
	return web.Recover(s.log, s.e2bcode.Handler())
}

// ServeHTTP implements http.Handler.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) { s.handler.ServeHTTP(w, r) }

// Close kills every process group the server started (commands, sessions,
// PTYs, interpreters), waits for their output copiers, and removes the
// output directory. ctx bounds the wait.
func (s *Server) Close(ctx context.Context) error { return s.run.Close(ctx) }

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

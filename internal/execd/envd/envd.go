// Package envd is the agent's E2B face: envd's Connect services (process
// and filesystem, JSON and binary codecs) and its HTTP routes (/files,
// /health, /envs) on their own listener, so that the E2B SDKs run against
// a moat sandbox unchanged. Processes start through the agent's proc
// Runner and live in its Registry under their in-sandbox pid; they outlive
// the stream that started them and can be reattached by pid or tag. Each
// request names its Linux user (Basic auth); relative paths resolve
// against that user's home and what envd creates is owned by that user.
package envd

import (
	"crypto/subtle"
	"errors"
	"log/slog"
	"net/http"
	"strings"

	"connectrpc.com/connect"

	"github.com/moat-sandbox/moat/internal/agentproto"
	"github.com/moat-sandbox/moat/internal/errdefs"
	"github.com/moat-sandbox/moat/internal/execd/envd/gen/filesystem/filesystemconnect"
	"github.com/moat-sandbox/moat/internal/execd/envd/gen/process/processconnect"
	"github.com/moat-sandbox/moat/internal/execd/proc"
)

// unauthorizedBody is envd's exact 401 body.
const unauthorizedBody = `{"code":401,"message":"unauthorized access, please provide a valid access token or method signing if supported"}`

// Options configure a Service.
type Options struct {
	// Token returns the current access token ("" = no auth); it is the
	// agent's execd token, which the control plane hands out as
	// envdAccessToken.
	Token func() string
	// DefaultUser is the user of a request that names none (default
	// root).
	DefaultUser string
	// DefaultWorkdir is the cwd of a process started without one and the
	// path an empty path means (default: the user's home).
	DefaultWorkdir string
}

// Service serves envd. Its processes and watchers belong to the Runner,
// whose Close kills them.
type Service struct {
	run  *proc.Runner
	log  *slog.Logger
	opts Options

	procs    *proc.Registry[*process]
	watchers *proc.Registry[*pollWatcher]
}

// New returns a Service that starts its processes through run.
func New(run *proc.Runner, opts Options) *Service {
	if opts.Token == nil {
		opts.Token = func() string { return "" }
	}
	if opts.DefaultUser == "" {
		opts.DefaultUser = "root"
	}
	return &Service{
		run:      run,
		log:      run.Log(),
		opts:     opts,
		procs:    proc.NewRegistry[*process](run, "process"),
		watchers: proc.NewRegistry[*pollWatcher](run, "watcher"),
	}
}

// Handler is envd's HTTP handler: the Connect services and /files behind
// the token check, /health and the CORS preflight open.
func (s *Service) Handler() http.Handler {
	mux := http.NewServeMux()
	path, h := processconnect.NewProcessHandler(&processServer{s: s})
	mux.Handle(path, s.auth(h))
	path, h = filesystemconnect.NewFilesystemHandler(&filesystemServer{s: s})
	mux.Handle(path, s.auth(h))
	mux.HandleFunc("GET /health", health)
	mux.Handle("GET /envs", s.auth(http.HandlerFunc(s.envs)))
	mux.HandleFunc("GET /files", s.download)
	mux.HandleFunc("POST /files", s.upload)
	return cors(mux)
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

// auth refuses requests without the access token (a Connect client maps
// the 401 to unauthenticated).
func (s *Service) auth(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !s.authorized(r) {
			writeRaw(w, http.StatusUnauthorized, unauthorizedBody)
			return
		}
		next.ServeHTTP(w, r)
	})
}

// cors answers browser preflights and lets any origin read the responses,
// as envd does.
func cors(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		if r.Header.Get("Origin") != "" {
			h.Set("Access-Control-Allow-Origin", "*")
			h.Set("Access-Control-Expose-Headers", "Connect-Protocol-Version, Connect-Timeout-Ms, Grpc-Status, Grpc-Message, Location, Cache-Control, X-Content-Type-Options, Content-Disposition, Content-Encoding")
		}
		if r.Method == http.MethodOptions && r.Header.Get("Access-Control-Request-Method") != "" {
			h.Set("Access-Control-Allow-Methods", "HEAD, GET, POST, PUT, PATCH, DELETE")
			h.Set("Access-Control-Allow-Headers", "*")
			h.Set("Access-Control-Max-Age", "7200")
			w.WriteHeader(http.StatusNoContent)
			return
		}
		next.ServeHTTP(w, r)
	})
}

// health answers the SDK's liveness probe.
func health(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(http.StatusNoContent)
}

// rpcError is the one place an error becomes a Connect error: its class
// picks the code, and a public message (errdefs.WithPublic) or the error
// text is the message.
func rpcError(err error) error {
	var ce *connect.Error
	if errors.As(err, &ce) {
		return ce
	}
	msg := err.Error()
	if p, ok := errdefs.PublicOf(err); ok {
		msg = p.Message
	}
	code := connect.CodeInternal
	for _, m := range []struct {
		class error
		code  connect.Code
	}{
		{errdefs.ErrNotFound, connect.CodeNotFound},
		{errdefs.ErrAlreadyExists, connect.CodeAlreadyExists},
		{errdefs.ErrInvalidArgument, connect.CodeInvalidArgument},
		{errdefs.ErrFailedPrecondition, connect.CodeFailedPrecondition},
		{errdefs.ErrConflict, connect.CodeAborted},
		{errdefs.ErrUnauthenticated, connect.CodeUnauthenticated},
		{errdefs.ErrPermissionDenied, connect.CodePermissionDenied},
		{errdefs.ErrUnavailable, connect.CodeUnavailable},
		{errdefs.ErrNotImplemented, connect.CodeUnimplemented},
		{errdefs.ErrResourceExhausted, connect.CodeResourceExhausted},
		{errdefs.ErrDeadlineExceeded, connect.CodeDeadlineExceeded},
	} {
		if errors.Is(err, m.class) {
			code = m.code
			break
		}
	}
	return connect.NewError(code, errors.New(strings.TrimSpace(msg)))
}

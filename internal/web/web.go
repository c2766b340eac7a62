// Package web is moat's small HTTP kit: an error-returning handler adapter
// that writes one JSON error envelope, JSON decode/encode helpers, request
// IDs, and server timeouts. Handlers decode, call a domain service, and
// encode; the mapping from error class to status happens only here.
package web

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"time"

	"github.com/moat-sandbox/moat/internal/errdefs"
)

// HandlerFunc is an HTTP handler that returns an error instead of writing
// one. A nil error means the handler wrote its response.
type HandlerFunc func(w http.ResponseWriter, r *http.Request) error

// ErrorBody is the JSON error envelope of every non-2xx response.
type ErrorBody struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

// CodeMapper returns the API error code and status for an error without a
// Public code. Each API picks its own code family.
type CodeMapper func(err error) (status int, code string)

// Adapter turns HandlerFuncs into http.Handlers.
type Adapter struct {
	Log   *slog.Logger
	Codes CodeMapper
	// Envelope, if set, is the error body of an API whose envelope is
	// not ErrorBody (E2B's {code: <status>, message}).
	Envelope func(status int, code, message string) any
}

// Handle adapts h.
func (a *Adapter) Handle(h HandlerFunc) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		err := h(w, r)
		if err == nil {
			return
		}
		a.WriteError(w, r, err)
	})
}

// WriteError writes err as the JSON error envelope and logs it once.
// Internal details are never sent: only a Public message, or the class name.
func (a *Adapter) WriteError(w http.ResponseWriter, r *http.Request, err error) {
	if errors.Is(err, context.Canceled) && r.Context().Err() != nil {
		return // client went away; nothing to write
	}
	status, code := StatusOf(err)
	if a.Codes != nil {
		status, code = a.Codes(err)
	}
	msg := http.StatusText(status)
	if p, ok := errdefs.PublicOf(err); ok {
		if p.Code != "" {
			code = p.Code
		}
		msg = p.Message
	} else if status < 500 {
		// Class-only errors below 500 are written by us with safe text.
		msg = err.Error()
	}
	log := a.Log
	if log == nil {
		log = slog.Default()
	}
	lvl := slog.LevelDebug
	if status >= 500 {
		lvl = slog.LevelError
	}
	log.Log(r.Context(), lvl, "request failed", "method", r.Method, "path", r.URL.Path,
		"status", status, "code", code, "err", err, "request_id", RequestID(r.Context()))
	if d, ok := errdefs.RetryAfterOf(err); ok {
		w.Header().Set("Retry-After", RetryAfter(d))
	}
	if a.Envelope != nil {
		WriteJSON(w, status, a.Envelope(status, code, msg))
		return
	}
	WriteJSON(w, status, ErrorBody{Code: code, Message: msg})
}

// StatusOf maps an error class to an HTTP status and a generic code.
func StatusOf(err error) (int, string) {
	switch {
	case errors.Is(err, errdefs.ErrNotFound):
		return http.StatusNotFound, "NOT_FOUND"
	case errors.Is(err, errdefs.ErrInvalidArgument):
		return http.StatusBadRequest, "INVALID_PARAMETER"
	case errors.Is(err, errdefs.ErrAlreadyExists):
		return http.StatusConflict, "ALREADY_EXISTS"
	case errors.Is(err, errdefs.ErrFailedPrecondition):
		return http.StatusConflict, "INVALID_STATE"
	case errors.Is(err, errdefs.ErrConflict):
		return http.StatusConflict, "CONFLICT"
	case errors.Is(err, errdefs.ErrUnauthenticated):
		return http.StatusUnauthorized, "UNAUTHENTICATED"
	case errors.Is(err, errdefs.ErrPermissionDenied):
		return http.StatusForbidden, "PERMISSION_DENIED"
	case errors.Is(err, errdefs.ErrNotImplemented):
		return http.StatusNotImplemented, "NOT_IMPLEMENTED"
	case errors.Is(err, errdefs.ErrResourceExhausted):
		return http.StatusServiceUnavailable, "RESOURCE_EXHAUSTED"
	case errors.Is(err, errdefs.ErrCapacity):
		return http.StatusTooManyRequests, "CAPACITY_EXHAUSTED"
	case errors.Is(err, errdefs.ErrUnavailable):
		return http.StatusServiceUnavailable, "UNAVAILABLE"
	case errors.Is(err, errdefs.ErrDeadlineExceeded), errors.Is(err, context.DeadlineExceeded):
		return http.StatusGatewayTimeout, "DEADLINE_EXCEEDED"
	default:
		return http.StatusInternalServerError, "UNKNOWN_ERROR"
	}
}

// WriteJSON writes v as JSON with status.
func WriteJSON(w http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		http.Error(w, `{"code":"UNKNOWN_ERROR","message":"encoding failed"}`, http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	w.Write(b)
	w.Write([]byte("\n"))
}

// MaxBodyBytes bounds JSON request bodies.
const MaxBodyBytes = 4 << 20

// DecodeJSON decodes the request body into v. An empty body is allowed only
// if allowEmpty; unknown fields are ignored (clients send extra fields).
// The Content-Type is not checked: clients such as a bare curl label JSON
// bodies as forms, and the body must parse as JSON anyway.
// Errors are ErrInvalidArgument with a public message.
func DecodeJSON(r *http.Request, v any, allowEmpty bool) error {
	body := http.MaxBytesReader(nil, r.Body, MaxBodyBytes)
	dec := json.NewDecoder(body)
	if err := dec.Decode(v); err != nil {
		if errors.Is(err, io.EOF) {
			if allowEmpty {
				return nil
			}
			return errdefs.Invalid("", "request body is required")
		}
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return errdefs.Invalid("", "request body too large")
		}
		return errdefs.Invalid("", "invalid JSON body: "+err.Error())
	}
	if dec.More() {
		return errdefs.Invalid("", "invalid JSON body: trailing data")
	}
	return nil
}

type ctxKey struct{}

// RequestID returns the request ID stored by WithRequestID.
func RequestID(ctx context.Context) string {
	s, _ := ctx.Value(ctxKey{}).(string)
	return s
}

// WithRequestID echoes X-Request-ID or makes one (32 hex chars), stores it
// in the context and sets it on the response.
func WithRequestID(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id := r.Header.Get("X-Request-ID")
		if id == "" || len(id) > 128 {
			var b [16]byte
			rand.Read(b[:])
			id = hex.EncodeToString(b[:])
		}
		w.Header().Set("X-Request-ID", id)
		next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), ctxKey{}, id)))
	})
}

// NotFoundJSON serves mux, but answers unrouted requests (404) and method
// mismatches (405, with Allow) with the JSON envelope instead of the
// mux's plain text.
func NotFoundJSON(mux *http.ServeMux, code404, code405 string) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h, pattern := mux.Handler(r)
		if pattern != "" {
			mux.ServeHTTP(w, r)
			return
		}
		probe := &statusProbe{header: http.Header{}}
		h.ServeHTTP(probe, r)
		if probe.status == http.StatusMethodNotAllowed {
			if a := probe.header.Get("Allow"); a != "" {
				w.Header().Set("Allow", a)
			}
			WriteJSON(w, http.StatusMethodNotAllowed, ErrorBody{Code: code405, Message: fmt.Sprintf("method %s is not allowed on %s", r.Method, r.URL.Path)})
			return
		}
		if probe.status != http.StatusNotFound && probe.status != 0 {
			mux.ServeHTTP(w, r) // e.g. a redirect for a cleaned path
			return
		}
		WriteJSON(w, http.StatusNotFound, ErrorBody{Code: code404, Message: fmt.Sprintf("no route for %s %s", r.Method, r.URL.Path)})
	})
}

type statusProbe struct {
	header http.Header
	status int
}

func (p *statusProbe) Header() http.Header         { return p.header }
func (p *statusProbe) Write(b []byte) (int, error) { return len(b), nil }
func (p *statusProbe) WriteHeader(code int)        { p.status = code }

// Recover turns a panic in a handler into a 500 with the generic envelope;
// the panic value is logged, never sent.
func Recover(log *slog.Logger, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		defer func() {
			if v := recover(); v != nil {
				if v == http.ErrAbortHandler {
					panic(v)
				}
				log.Error("handler panic", "method", r.Method, "path", r.URL.Path, "panic", v)
				WriteJSON(w, http.StatusInternalServerError, ErrorBody{Code: "UNKNOWN_ERROR", Message: "internal error"})
			}
		}()
		next.ServeHTTP(w, r)
	})
}

// NewServer returns an http.Server with production timeouts. WriteTimeout is
// left at zero because SSE and proxied streams are long-lived; streaming
// handlers set per-write deadlines with http.ResponseController.
func NewServer(addr string, h http.Handler, log *slog.Logger) *http.Server {
	return &http.Server{
		Addr:              addr,
		Handler:           h,
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       120 * time.Second,
		MaxHeaderBytes:    1 << 20,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}
}

// ServeUntil serves hs on ln until ctx ends, then shuts it down gracefully
// (10 s for in-flight requests, then a hard close). It returns the serve
// error, if serving stopped for any other reason.
func ServeUntil(ctx context.Context, hs *http.Server, ln net.Listener) error {
	errc := make(chan error, 1)
	go func() { errc <- hs.Serve(ln) }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	if err := hs.Shutdown(sctx); err != nil {
		hs.Close()
	}
	if err := <-errc; err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

// RetryAfter is d as a Retry-After value: whole seconds, rounded up, at
// least 1.
func RetryAfter(d time.Duration) string {
	return strconv.Itoa(max(1, int((d+time.Second-1)/time.Second)))
}

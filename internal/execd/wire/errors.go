package wire

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"

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

// CodeOf maps an error without a Public code to a status and execd code;
// it is the web.Adapter's CodeMapper for the whole agent.
func CodeOf(err error) (int, string) {
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

// BadBody is a 400 INVALID_REQUEST_BODY error.
func BadBody(format string, a ...any) error {
	return errdefs.Invalid(CodeInvalidRequestBody, fmt.Sprintf(format, a...))
}

// MissingQuery is the 400 MISSING_QUERY error for a query parameter.
func MissingQuery(name string) error {
	return errdefs.Invalid(CodeMissingQuery, fmt.Sprintf("missing query parameter %q", name))
}

// Runtime is a RUNTIME_ERROR carrying msg (err's text when msg is empty);
// an error without a class is an internal one (500).
func Runtime(err error, msg string) error {
	if msg == "" {
		msg = err.Error()
	}
	if !HasClass(err) {
		err = fmt.Errorf("%w: %v", errdefs.ErrInternal, err)
	}
	return errdefs.WithPublic(err, CodeRuntimeError, msg)
}

// Unavailable is the 503 error of a request that arrives while the agent
// shuts down.
func Unavailable() error {
	return errdefs.WithPublic(errdefs.ErrUnavailable, CodeRuntimeError, "agent is shutting down")
}

// ContextNotFound is the 404 CONTEXT_NOT_FOUND error of an unknown
// command, session, PTY or code context id.
func ContextNotFound(kind, id string) error {
	return errdefs.WithPublic(fmt.Errorf("%s %q: %w", kind, id, errdefs.ErrNotFound), CodeContextNotFound, kind+" not found: "+id)
}

// HasClass reports whether err carries an errdefs class.
func HasClass(err error) bool { return errdefs.HasClass(err) }

// DecodeBody decodes a JSON body into v; allowEmpty accepts an empty body.
func DecodeBody(r *http.Request, v any, allowEmpty bool) error {
	body := http.MaxBytesReader(nil, r.Body, web.MaxBodyBytes)
	dec := json.NewDecoder(body)
	if err := dec.Decode(v); err != nil {
		if errors.Is(err, io.EOF) && allowEmpty {
			return nil
		}
		if errors.Is(err, io.EOF) {
			return BadBody("request body is required")
		}
		return BadBody("error parsing request, invalid body format: %v", err)
	}
	return nil
}

// WriteJSON writes v with status 200.
func WriteJSON(w http.ResponseWriter, v any) error {
	web.WriteJSON(w, http.StatusOK, v)
	return nil
}

// NewID returns a 32-hex random id (a uuid without dashes).
func NewID() string {
	var b [16]byte
	rand.Read(b[:])
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return hex.EncodeToString(b[:])
}

// Route is one line of the agent's route table: an http.ServeMux pattern
// and the handler that serves it. Each service lists its own routes; the
// agent mounts them all on one mux.
type Route struct {
	Pattern string
	Handler web.HandlerFunc
}

// Mux mounts routes on a new ServeMux, writing handler errors as the
// execd {code, message} envelope.
func Mux(log *slog.Logger, routes ...[]Route) *http.ServeMux {
	a := &web.Adapter{Log: log, Codes: CodeOf}
	mux := http.NewServeMux()
	for _, rs := range routes {
		for _, rt := range rs {
			mux.Handle(rt.Pattern, a.Handle(rt.Handler))
		}
	}
	return mux
}

// Package errdefs defines the fixed set of error classes used across moat.
//
// Code adds context by wrapping a class with %w, e.g.
//
//	fmt.Errorf("sandbox %q: %w", id, errdefs.ErrNotFound)
//
// and only the edges (HTTP handlers, CLI) map a class to a status or exit
// code. Messages of wrapped errors are meant for operators; the public text
// sent to API clients comes from WithPublic or from the class alone.
package errdefs

import (
	"errors"
	"fmt"
	"time"
)

// Error classes. Every error returned by a moat package should wrap one of
// these (an unclassified error is treated as ErrInternal at the edge).
var (
	ErrNotFound           = errors.New("not found")
	ErrAlreadyExists      = errors.New("already exists")
	ErrInvalidArgument    = errors.New("invalid argument")
	ErrFailedPrecondition = errors.New("failed precondition") // wrong state for the operation
	ErrConflict           = errors.New("conflict")            // concurrent modification, resource in use
	ErrUnauthenticated    = errors.New("unauthenticated")
	ErrPermissionDenied   = errors.New("permission denied")
	ErrUnavailable        = errors.New("unavailable") // backend temporarily unreachable
	ErrNotImplemented     = errors.New("not implemented")
	ErrResourceExhausted  = errors.New("resource exhausted")
	ErrCapacity           = errors.New("capacity exhausted") // back-pressure: retry later (429)
	ErrDeadlineExceeded   = errors.New("deadline exceeded")
	ErrInternal           = errors.New("internal error")
)

// classes are every class above, for HasClass.
var classes = []error{ErrNotFound, ErrAlreadyExists, ErrInvalidArgument, ErrFailedPrecondition, ErrConflict,
	ErrUnauthenticated, ErrPermissionDenied, ErrUnavailable, ErrNotImplemented, ErrResourceExhausted,
	ErrCapacity, ErrDeadlineExceeded, ErrInternal}

// HasClass reports whether err carries one of the classes.
func HasClass(err error) bool {
	for _, c := range classes {
		if errors.Is(err, c) {
			return true
		}
	}
	return false
}

// IsNotFound reports whether err is of class ErrNotFound.
func IsNotFound(err error) bool { return errors.Is(err, ErrNotFound) }

// IsAlreadyExists reports whether err is of class ErrAlreadyExists.
func IsAlreadyExists(err error) bool { return errors.Is(err, ErrAlreadyExists) }

// IsInvalidArgument reports whether err is of class ErrInvalidArgument.
func IsInvalidArgument(err error) bool { return errors.Is(err, ErrInvalidArgument) }

// IsFailedPrecondition reports whether err is of class ErrFailedPrecondition.
func IsFailedPrecondition(err error) bool { return errors.Is(err, ErrFailedPrecondition) }

// IsConflict reports whether err is of class ErrConflict.
func IsConflict(err error) bool { return errors.Is(err, ErrConflict) }

// IsNotImplemented reports whether err is of class ErrNotImplemented.
func IsNotImplemented(err error) bool { return errors.Is(err, ErrNotImplemented) }

// Public is an error that carries a client-safe code and message next to the
// (possibly sensitive) internal cause. The HTTP edge sends Code and Message;
// logs get the full chain.
type Public struct {
	// Code is the API error code, e.g. "SANDBOX::INVALID_PARAMETER".
	Code string
	// Message is safe to show to API clients.
	Message string
	// Err is the wrapped cause; it should wrap an error class.
	Err error
}

func (e *Public) Error() string {
	if e.Err == nil {
		return e.Message
	}
	return e.Message + ": " + e.Err.Error()
}

func (e *Public) Unwrap() error { return e.Err }

// WithPublic wraps err (which should carry a class) with a public code and
// message.
func WithPublic(err error, code, message string) error {
	return &Public{Code: code, Message: message, Err: err}
}

// Newf returns an error of class whose message is safe for API clients,
// without an API code: the API edge chooses the code from the class (and
// from the reasons it knows). Backends and other domain packages use it;
// only the edge speaks wire codes.
func Newf(class error, format string, args ...any) error {
	return &Public{Message: fmt.Sprintf(format, args...), Err: class}
}

// Invalid returns an ErrInvalidArgument with a public message.
func Invalid(code, message string) error {
	return &Public{Code: code, Message: message, Err: ErrInvalidArgument}
}

// PublicOf returns the outermost Public error in err's chain, if any.
func PublicOf(err error) (*Public, bool) {
	var p *Public
	if errors.As(err, &p) {
		return p, true
	}
	return nil, false
}

// Retry is an error the client may retry after After: the HTTP edge sends
// it as Retry-After (whole seconds, at least 1).
type Retry struct {
	After time.Duration
	Err   error
}

func (e *Retry) Error() string { return e.Err.Error() }

func (e *Retry) Unwrap() error { return e.Err }

// WithRetryAfter marks err (which should carry a class, usually
// ErrUnavailable) as worth retrying after d.
func WithRetryAfter(err error, d time.Duration) error { return &Retry{After: d, Err: err} }

// RetryAfterOf returns how long the client should wait before retrying
// err, if err says so (WithRetryAfter).
func RetryAfterOf(err error) (time.Duration, bool) {
	var r *Retry
	if errors.As(err, &r) {
		return r.After, true
	}
	return 0, false
}

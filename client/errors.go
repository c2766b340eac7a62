package client

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"
)

// Error classes matched by errors.Is against an *APIError.
var (
	// ErrNotFound: 404 (no such sandbox, pool, file, command).
	ErrNotFound = errors.New("not found")
	// ErrConflict: 409 (wrong state, already exists).
	ErrConflict = errors.New("conflict")
	// ErrInvalid: 400, 413, 416 or 422 (the request was rejected as malformed).
	ErrInvalid = errors.New("invalid request")
	// ErrUnauthorized: 401 or 403 (missing, wrong or revoked API key or
	// access token, or a role that may not make the call), except a
	// quota refusal.
	ErrUnauthorized = errors.New("unauthorized")
	// ErrQuotaExceeded: 403 TENANT::QUOTA_EXCEEDED (a create or claim
	// beyond the tenant's quota; retrying does not help until sandboxes
	// are deleted or the quota raised).
	ErrQuotaExceeded = errors.New("quota exceeded")
	// ErrNotImplemented: 501 (the server does not offer the feature).
	ErrNotImplemented = errors.New("not implemented")
)

const codeQuotaExceeded = "TENANT::QUOTA_EXCEEDED"

// APIError is a non-2xx answer of the lifecycle server, the agent or the
// egress API.
type APIError struct {
	// StatusCode is the HTTP status.
	StatusCode int
	// Code is the machine code (e.g. "SANDBOX::NOT_FOUND", "FILE_NOT_FOUND");
	// empty when the body had none (egress errors are plain text).
	Code string
	// Message is the server's client-safe message, or the plain-text body.
	Message string
	// RequestID is the X-Request-ID of the answer, if any.
	RequestID string

	retryAfter time.Duration
}

func (e *APIError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "moat: %d", e.StatusCode)
	if e.Code != "" {
		b.WriteString(" " + e.Code)
	}
	if e.Message != "" {
		b.WriteString(": " + e.Message)
	}
	if e.RequestID != "" {
		b.WriteString(" (request " + e.RequestID + ")")
	}
	return b.String()
}

// Is matches the class sentinels by status code.
func (e *APIError) Is(target error) bool {
	switch target {
	case ErrNotFound:
		return e.StatusCode == http.StatusNotFound
	case ErrConflict:
		return e.StatusCode == http.StatusConflict
	case ErrInvalid:
		switch e.StatusCode {
		case http.StatusBadRequest, http.StatusRequestEntityTooLarge, http.StatusRequestedRangeNotSatisfiable, http.StatusUnprocessableEntity:
			return true
		}
	case ErrUnauthorized:
		return e.StatusCode == http.StatusUnauthorized || (e.StatusCode == http.StatusForbidden && e.Code != codeQuotaExceeded)
	case ErrQuotaExceeded:
		return e.StatusCode == http.StatusForbidden && e.Code == codeQuotaExceeded
	case ErrNotImplemented:
		return e.StatusCode == http.StatusNotImplemented
	}
	return false
}

// IsNotFound reports whether err is a 404 answer.
func IsNotFound(err error) bool { return errors.Is(err, ErrNotFound) }

// IsConflict reports whether err is a 409 answer.
func IsConflict(err error) bool { return errors.Is(err, ErrConflict) }

// IsInvalid reports whether err is an answer rejecting the request as invalid.
func IsInvalid(err error) bool { return errors.Is(err, ErrInvalid) }

// IsUnauthorized reports whether err is a 401 or 403 answer.
func IsUnauthorized(err error) bool { return errors.Is(err, ErrUnauthorized) }

// readAPIError consumes and closes resp.Body. Bodies are {code, message}
// (lifecycle, agent), {error} (agent 401) or plain text (egress).
func readAPIError(resp *http.Response) error {
	defer resp.Body.Close()
	raw, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	e := &APIError{StatusCode: resp.StatusCode, RequestID: resp.Header.Get("X-Request-ID"), retryAfter: retryAfter(resp.Header)}
	var body struct {
		Code    string `json:"code"`
		Message string `json:"message"`
		Error   string `json:"error"`
	}
	if json.Unmarshal(raw, &body) == nil && (body.Code != "" || body.Message != "" || body.Error != "") {
		e.Code, e.Message = body.Code, body.Message
		if e.Message == "" {
			e.Message = body.Error
		}
	} else {
		e.Message = strings.TrimSpace(string(raw))
	}
	if e.Message == "" {
		e.Message = http.StatusText(resp.StatusCode)
	}
	return e
}

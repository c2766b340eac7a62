package mcp

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"

	"github.com/moat-sandbox/moat/client"
)

// Codes of errors raised by this package (server and agent errors keep the
// code they were answered with, e.g. SANDBOX::NOT_FOUND).
const (
	codeInvalidArgument = "MCP::INVALID_ARGUMENT"
	codeTimeout         = "MCP::TIMEOUT"
	codeCanceled        = "MCP::CANCELED"
	codeSandboxFailed   = "MCP::SANDBOX_NOT_RUNNING"
	codeUpstream        = "MCP::UPSTREAM_ERROR"
	codeInternal        = "MCP::INTERNAL"
)

// toolError is the failure of a tool call as the model sees it: its
// Error text is the JSON object {"code","message"}, which the SDK puts into
// the IsError result.
type toolError struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

func (e *toolError) Error() string {
	b, err := json.Marshal(e)
	if err != nil {
		return fmt.Sprintf(`{"code":%q,"message":%q}`, e.Code, e.Message)
	}
	return string(b)
}

func invalidf(format string, args ...any) error {
	return &toolError{Code: codeInvalidArgument, Message: fmt.Sprintf(format, args...)}
}

// toToolError classifies err once, at the tool boundary. Answers of the
// lifecycle server and the agent keep their {code, message}; transport and
// client-side failures become MCP::* codes. ctx tells a timeout of the
// call from other failures.
func toToolError(ctx context.Context, err error) error {
	if err == nil {
		return nil
	}
	return classify(ctx, err)
}

// classify is toToolError for a non-nil err.
func classify(ctx context.Context, err error) *toolError {
	var te *toolError
	if errors.As(err, &te) {
		return te
	}
	var ae *client.APIError
	if errors.As(err, &ae) {
		code := ae.Code
		if code == "" {
			code = fmt.Sprintf("HTTP::%d", ae.StatusCode)
		}
		msg := ae.Message
		if msg == "" {
			msg = http.StatusText(ae.StatusCode)
		}
		return &toolError{Code: code, Message: msg}
	}
	switch {
	case errors.Is(err, context.DeadlineExceeded) || errors.Is(ctx.Err(), context.DeadlineExceeded):
		return &toolError{Code: codeTimeout, Message: err.Error()}
	case errors.Is(err, context.Canceled) || ctx.Err() != nil:
		return &toolError{Code: codeCanceled, Message: "the call was cancelled"}
	}
	// Errors of this process (a refused connection, a cut stream): the
	// text names only moat's own endpoints and is what the operator needs.
	return &toolError{Code: codeUpstream, Message: err.Error()}
}

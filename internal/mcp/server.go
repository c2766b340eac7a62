// Package mcp is moat's Model Context Protocol server (`moat mcp`): it
// exposes sandboxes to an LLM agent as MCP tools (create, list, get,
// delete, pause, resume, exec, file read/write/list), built on the official
// Go SDK (github.com/modelcontextprotocol/go-sdk) and driving a running
// `moat serve` through the moat Go SDK (./client).
//
// Every failure of a tool — bad arguments, an error answer of the lifecycle
// server or the agent, an unreachable server — is returned as a tool result
// with IsError set and a {"code","message"} JSON text, so the model can read
// it and correct itself; only unknown tools and malformed protocol messages
// are protocol errors (the SDK's own).
package mcp

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"time"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/moat-sandbox/moat/client"
)

// Options configures a Server.
type Options struct {
	// Client talks to the lifecycle server. Required.
	Client *client.Client
	// Version is reported as the server implementation version
	// (default "dev").
	Version string
	// SandboxTimeout is the expiry given to sandboxes created without
	// timeout_seconds; 0 creates them without expiry (manual cleanup).
	SandboxTimeout time.Duration
	// WaitTimeout bounds how long sandbox_create waits for Running
	// (default 5m).
	WaitTimeout time.Duration
	// Logger receives SDK diagnostics (default: discarded). In stdio mode
	// it must not write to stdout.
	Logger *slog.Logger
}

// Server is the moat MCP server. One Server serves any number of sessions
// (stdio serves one; the HTTP handler one per client).
type Server struct {
	srv  *sdk.Server
	opts Options
}

// instructions is sent to the client at initialization; MCP hosts put it
// into the model's context.
const instructions = `This server runs commands in isolated moat sandboxes (Linux containers with their own filesystem, network and process tree).

Typical flow:
1. sandbox_create with an OCI image (e.g. "docker.io/library/python:3.12"); it returns when the sandbox is Running. Keep the returned id.
2. exec to run shell commands (bash -c, or sh -c when the image has no bash). A non-zero exit is not a tool error: read exit_code, stdout and stderr.
3. file_write / file_read / file_list to move files in and out without shell quoting.
4. sandbox_delete when done. Sandboxes also expire on their own after their timeout.

Errors come back as tool results with a JSON text {"code": ..., "message": ...}; e.g. SANDBOX::NOT_FOUND means the id is wrong or the sandbox is gone (create a new one), MCP::INVALID_ARGUMENT means the arguments must be fixed. Output of exec and file_read is capped; truncated=true tells you part was omitted, so narrow the command (head, tail, grep) or raise the cap.`

// New builds the server and registers its tools.
func New(opts Options) (*Server, error) {
	if opts.Client == nil {
		return nil, errors.New("mcp: Options.Client is required")
	}
	if opts.Version == "" {
		opts.Version = "dev"
	}
	if opts.WaitTimeout <= 0 {
		opts.WaitTimeout = 5 * time.Minute
	}
	srv := sdk.NewServer(&sdk.Implementation{Name: "moat", Title: "moat sandboxes", Version: opts.Version}, &sdk.ServerOptions{
		Instructions: instructions,
		Logger:       opts.Logger,
		// No logging capability: tools report through their results.
		Capabilities: &sdk.ServerCapabilities{},
	})
	s := &Server{srv: srv, opts: opts}
	srv.AddReceivingMiddleware(toolErrorEnvelope(opts.Logger))
	s.addTools()
	return s, nil
}

// MCP returns the underlying SDK server (for Connect with any transport).
func (s *Server) MCP() *sdk.Server { return s.srv }

// ServeStdio serves one session on stdin/stdout until the client closes
// stdin or ctx is cancelled.
func (s *Server) ServeStdio(ctx context.Context) error {
	err := s.srv.Run(ctx, &sdk.StdioTransport{})
	if ctx.Err() != nil {
		return nil
	}
	return err
}

// sessionIdle closes HTTP sessions that sent nothing for this long, so
// clients that vanish do not pin memory.
const sessionIdle = 30 * time.Minute

// Handler serves the MCP streamable HTTP transport (every path). The SDK
// rejects requests that reach a loopback listener with a non-loopback Host
// header (DNS rebinding protection).
func (s *Server) Handler() http.Handler {
	return sdk.NewStreamableHTTPHandler(func(*http.Request) *sdk.Server { return s.srv },
		&sdk.StreamableHTTPOptions{Logger: s.opts.Logger, SessionTimeout: sessionIdle})
}

// toolErrorEnvelope makes every failed tool call read the same way and
// keeps a panicking handler from killing the process:
//   - the SDK's own argument checks (JSON schema validation, decoding)
//     answer plain text; it is wrapped as MCP::INVALID_ARGUMENT;
//   - a panic becomes an MCP::INTERNAL tool error (logged, not echoed).
func toolErrorEnvelope(log *slog.Logger) sdk.Middleware {
	return func(next sdk.MethodHandler) sdk.MethodHandler {
		return func(ctx context.Context, method string, req sdk.Request) (res sdk.Result, err error) {
			if method != "tools/call" {
				return next(ctx, method, req)
			}
			defer func() {
				if v := recover(); v != nil {
					if log != nil {
						log.Error("mcp: tool handler panicked", "panic", fmt.Sprint(v))
					}
					res, err = errorResult(&toolError{Code: codeInternal, Message: "internal error in the moat MCP server"}), nil
				}
			}()
			res, err = next(ctx, method, req)
			if r, ok := res.(*sdk.CallToolResult); ok && err == nil && r.IsError && len(r.Content) == 1 {
				if t, ok := r.Content[0].(*sdk.TextContent); ok && !strings.HasPrefix(t.Text, `{"code":`) {
					t.Text = (&toolError{Code: codeInvalidArgument, Message: t.Text}).Error()
				}
			}
			return res, err
		}
	}
}

func errorResult(e *toolError) *sdk.CallToolResult {
	return &sdk.CallToolResult{Content: []sdk.Content{&sdk.TextContent{Text: e.Error()}}, IsError: true}
}

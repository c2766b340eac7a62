package client

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"
)

// SandboxHandle talks to the agent (execd) and the egress API of one
// sandbox through the endpoints the server resolves. It is safe for
// concurrent use.
type SandboxHandle struct {
	// ID is the sandbox id.
	ID string

	c     *Client
	agent *transport

	mu     sync.Mutex
	egress *transport // resolved on first use
}

// Sandbox resolves the agent endpoint of sandbox id (port 44772, through
// the server proxy with WithServerProxy) and returns a handle to it.
func (c *Client) Sandbox(ctx context.Context, id string) (*SandboxHandle, error) {
	t, err := c.endpointTransport(ctx, id, AgentPort, c.serverProxy)
	if err != nil {
		return nil, fmt.Errorf("sandbox %q: agent endpoint: %w", id, err)
	}
	return &SandboxHandle{ID: id, c: c, agent: t}, nil
}

// Ping checks that the agent answers.
func (s *SandboxHandle) Ping(ctx context.Context) error {
	return s.agent.json(ctx, &call{method: http.MethodGet, path: "/ping"}, nil, nil)
}

// RunOptions tunes Run.
type RunOptions struct {
	// Cwd is the working directory (default: the agent's).
	Cwd string
	// Env is layered over the agent's environment.
	Env map[string]string
	// Timeout kills the command's process group after this long (0: none).
	Timeout time.Duration
	// Background returns right after the start; the merged output is read
	// with CommandLogs and the state with CommandStatus.
	Background bool
}

// Handlers receive stream events as they arrive, on the calling
// goroutine. Any may be nil.
type Handlers struct {
	// OnInit receives the command id.
	OnInit func(id string)
	// OnStdout and OnStderr receive one line each, without its terminator.
	OnStdout func(line string)
	OnStderr func(line string)
	// OnError receives the failure of the command: for a non-zero exit,
	// Value is the exit code as a decimal string.
	OnError func(e *ExecutionError)
	// OnComplete is called once when the stream ends normally.
	OnComplete func(x *Execution)
}

// ExecutionError is the error event of a run.
type ExecutionError struct {
	Name      string   `json:"ename"`
	Value     string   `json:"evalue"`
	Traceback []string `json:"traceback"`
}

func (e *ExecutionError) Error() string {
	return fmt.Sprintf("%s: %s", e.Name, e.Value)
}

// Execution is the outcome of Run.
type Execution struct {
	// ID is the command id (for CommandStatus, CommandLogs, Interrupt).
	ID string
	// ExitCode is the exit status; -1 if the command did not start or the
	// error carried no exit code (see Error).
	ExitCode int
	// Stdout and Stderr hold every line streamed, each followed by "\n".
	Stdout, Stderr string
	// Error is the error event, if any (a non-zero exit sets it too).
	Error *ExecutionError
	// Elapsed is the execution time the agent reported on completion.
	Elapsed time.Duration
}

// Run runs cmd with bash -c (sh -c without bash) and streams its output
// to h until it exits. A non-zero exit is not an error: see ExitCode.
// Run is never retried.
func (s *SandboxHandle) Run(ctx context.Context, cmd string, opts RunOptions, h Handlers) (*Execution, error) {
	var stdout, stderr strings.Builder
	inner := h
	inner.OnStdout = func(line string) {
		stdout.WriteString(line + "\n")
		if h.OnStdout != nil {
			h.OnStdout(line)
		}
	}
	inner.OnStderr = func(line string) {
		stderr.WriteString(line + "\n")
		if h.OnStderr != nil {
			h.OnStderr(line)
		}
	}
	// OnComplete sees the collected output, as before.
	inner.OnComplete = func(x *Execution) {
		x.Stdout, x.Stderr = stdout.String(), stderr.String()
		if h.OnComplete != nil {
			h.OnComplete(x)
		}
	}
	x, err := s.Stream(ctx, cmd, opts, inner)
	if x != nil {
		x.Stdout, x.Stderr = stdout.String(), stderr.String()
	}
	return x, err
}

// CommandStatus is the state of a command started by Run.
type CommandStatus struct {
	ID string `json:"id"`
	// Content is the command line.
	Content string `json:"content"`
	Running bool   `json:"running"`
	// ExitCode is nil while running or when the command did not start.
	ExitCode   *int       `json:"exit_code,omitempty"`
	Error      string     `json:"error,omitempty"`
	StartedAt  time.Time  `json:"started_at"`
	FinishedAt *time.Time `json:"finished_at,omitempty"`
}

// CommandStatus returns the state of command id.
func (s *SandboxHandle) CommandStatus(ctx context.Context, id string) (*CommandStatus, error) {
	var st CommandStatus
	if err := s.agent.json(ctx, &call{method: http.MethodGet, path: "/command/status/" + url.PathEscape(id)}, nil, &st); err != nil {
		return nil, err
	}
	return &st, nil
}

// CommandLogs returns the merged output of command id from byte offset
// cursor, and the cursor to pass next time.
func (s *SandboxHandle) CommandLogs(ctx context.Context, id string, cursor int64) (string, int64, error) {
	q := url.Values{}
	if cursor > 0 {
		q.Set("cursor", strconv.FormatInt(cursor, 10))
	}
	resp, err := s.agent.do(ctx, &call{method: http.MethodGet, path: "/command/" + url.PathEscape(id) + "/logs", query: q})
	if err != nil {
		return "", cursor, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return "", cursor, fmt.Errorf("client: command logs: %w", err)
	}
	next := cursor + int64(len(b))
	if v := resp.Header.Get("EXECD-COMMANDS-TAIL-CURSOR"); v != "" {
		if n, err := strconv.ParseInt(v, 10, 64); err == nil {
			next = n
		}
	}
	return string(b), next, nil
}

// Interrupt stops command id (SIGTERM, then SIGKILL, to its process group).
func (s *SandboxHandle) Interrupt(ctx context.Context, id string) error {
	return s.agent.json(ctx, &call{method: http.MethodDelete, path: "/command", query: url.Values{"id": {id}}}, nil, nil)
}

package client

import (
	"context"
	"encoding/json"
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
	in := struct {
		Command    string            `json:"command"`
		Cwd        string            `json:"cwd,omitempty"`
		Background bool              `json:"background,omitempty"`
		Timeout    int64             `json:"timeout,omitempty"`
		Envs       map[string]string `json:"envs,omitempty"`
	}{Command: cmd, Cwd: opts.Cwd, Background: opts.Background, Envs: opts.Env}
	if opts.Timeout > 0 {
		in.Timeout = max(1, opts.Timeout.Milliseconds())
	}
	b, err := json.Marshal(in)
	if err != nil {
		return nil, fmt.Errorf("client: encode command: %w", err)
	}
	resp, err := s.agent.do(ctx, &call{method: http.MethodPost, path: "/command", body: b, contentType: "application/json",
		header: http.Header{"Accept": {"text/event-stream"}}})
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	x := &Execution{ExitCode: -1}
	var stdout, stderr strings.Builder
	done := false
	err = readEvents(resp.Body, func(ev *streamEvent) error {
		switch ev.Type {
		case "init":
			x.ID = ev.Text
			if h.OnInit != nil {
				h.OnInit(ev.Text)
			}
		case "stdout":
			stdout.WriteString(ev.Text + "\n")
			if h.OnStdout != nil {
				h.OnStdout(ev.Text)
			}
		case "stderr":
			stderr.WriteString(ev.Text + "\n")
			if h.OnStderr != nil {
				h.OnStderr(ev.Text)
			}
		case "error":
			e := ev.Error
			if e == nil {
				e = &ExecutionError{Value: ev.Text}
			}
			x.Error = e
			if n, err := strconv.Atoi(strings.TrimSpace(e.Value)); err == nil {
				x.ExitCode = n
			}
			if h.OnError != nil {
				h.OnError(e)
			}
			done = true
		case "execution_complete":
			if x.Error == nil {
				x.ExitCode = 0
			}
			x.Elapsed = time.Duration(ev.ExecutionTime) * time.Millisecond
			done = true
		}
		return nil
	})
	x.Stdout, x.Stderr = stdout.String(), stderr.String()
	if err != nil {
		return x, fmt.Errorf("client: command stream: %w", err)
	}
	if !done {
		return x, fmt.Errorf("client: command stream ended before completion: %w", io.ErrUnexpectedEOF)
	}
	if h.OnComplete != nil {
		h.OnComplete(x)
	}
	return x, nil
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

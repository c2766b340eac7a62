package mcp

import (
	"context"
	"strconv"
	"strings"
	"time"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/moat-sandbox/moat/client"
)

// Bounds of exec.
const (
	defaultExecTimeout = 120 // seconds
	maxExecTimeout     = 3600
	defaultOutputBytes = 32 << 10 // per stream
	maxOutputBytes     = 1 << 20
)

// ExecInput are the arguments of exec.
type ExecInput struct {
	SandboxID      string            `json:"sandbox_id" jsonschema:"Id of a Running sandbox."`
	Command        string            `json:"command" jsonschema:"Shell command line, run with bash -c (sh -c when the image has no bash); pipes, redirects, && and ; work. Stdin is empty, so interactive programs must be given their input another way."`
	Cwd            string            `json:"cwd,omitempty" jsonschema:"Working directory (absolute path). Default: the agent's working directory."`
	Env            map[string]string `json:"env,omitempty" jsonschema:"Extra environment variables for this command only."`
	TimeoutSeconds int               `json:"timeout_seconds,omitempty" jsonschema:"Kill the command (its whole process group) after this many seconds, 1 to 3600 (default 120)."`
	MaxOutputBytes int               `json:"max_output_bytes,omitempty" jsonschema:"Cap on the stdout and on the stderr returned, each (default 32768, at most 1048576). Beyond it the middle of the stream is dropped and truncated is set."`
}

// ExecOutput is the result of exec.
type ExecOutput struct {
	ExitCode   int    `json:"exit_code" jsonschema:"Exit status of the command; -1 when it was killed by a signal (e.g. on timeout) or did not start."`
	Stdout     string `json:"stdout" jsonschema:"Standard output."`
	Stderr     string `json:"stderr" jsonschema:"Standard error."`
	Truncated  bool   `json:"truncated" jsonschema:"True when stdout or stderr exceeded max_output_bytes and its middle was dropped."`
	TimedOut   bool   `json:"timed_out" jsonschema:"True when the command was killed because it ran past timeout_seconds."`
	Error      string `json:"error,omitempty" jsonschema:"Why the command failed to start or was killed, when the agent says so."`
	DurationMs int64  `json:"duration_ms" jsonschema:"Wall time of the call in milliseconds."`
}

func (s *Server) addExecTools() {
	sdk.AddTool(s.srv, &sdk.Tool{
		Name:  "exec",
		Title: "Run command",
		Description: "Run a shell command in a sandbox and wait for it to finish; returns exit_code, stdout and stderr. " +
			"A non-zero exit_code is a normal result, not a tool error. Each call is a fresh shell: cd and exported variables do not carry over, so use cwd/env or chain with &&. " +
			"Output is capped (see max_output_bytes); start long-running servers in the background with output redirected (nohup CMD > /tmp/CMD.log 2>&1 &) and poll the log.",
		Annotations: &sdk.ToolAnnotations{DestructiveHint: hint(true), OpenWorldHint: hint(true)},
	}, s.exec)
}

func (s *Server) exec(ctx context.Context, _ *sdk.CallToolRequest, in ExecInput) (*sdk.CallToolResult, ExecOutput, error) {
	if err := checkID(in.SandboxID); err != nil {
		return nil, ExecOutput{}, err
	}
	switch {
	case strings.TrimSpace(in.Command) == "":
		return nil, ExecOutput{}, invalidf("command is required")
	case in.TimeoutSeconds < 0 || in.TimeoutSeconds > maxExecTimeout:
		return nil, ExecOutput{}, invalidf("timeout_seconds must be between 1 and %d", maxExecTimeout)
	case in.MaxOutputBytes < 0 || in.MaxOutputBytes > maxOutputBytes:
		return nil, ExecOutput{}, invalidf("max_output_bytes must be between 1 and %d", maxOutputBytes)
	}
	timeout := time.Duration(orDefault(in.TimeoutSeconds, defaultExecTimeout)) * time.Second
	limit := orDefault(in.MaxOutputBytes, defaultOutputBytes)

	// The agent enforces timeout; this deadline covers an agent that does
	// not answer at all (a frozen, Paused sandbox).
	ctx, cancel := context.WithTimeout(ctx, timeout+agentGrace)
	defer cancel()
	sb, err := s.opts.Client.Sandbox(ctx, in.SandboxID)
	if err != nil {
		return nil, ExecOutput{}, agentError(ctx, err)
	}
	stdout, stderr := newCapture(limit), newCapture(limit)
	start := time.Now()
	x, err := sb.Stream(ctx, in.Command, client.RunOptions{Cwd: in.Cwd, Env: in.Env, Timeout: timeout},
		client.Handlers{OnStdout: stdout.line, OnStderr: stderr.line})
	elapsed := time.Since(start)
	if err != nil {
		return nil, ExecOutput{}, agentError(ctx, err)
	}
	out := ExecOutput{
		ExitCode:   x.ExitCode,
		Stdout:     stdout.String(),
		Stderr:     stderr.String(),
		Truncated:  stdout.truncated() || stderr.truncated(),
		DurationMs: elapsed.Milliseconds(),
	}
	if e := x.Error; e != nil {
		if _, numeric := strconv.Atoi(strings.TrimSpace(e.Value)); numeric != nil || x.ExitCode < 0 {
			// Not a plain exit status: the traceback says what happened
			// (e.g. "signal: killed", or why the shell did not start).
			out.Error = strings.TrimSpace(strings.Join(append([]string{e.Value}, e.Traceback...), ": "))
		}
		// The agent kills the process group at the deadline; the stream
		// then ends with a signal exit.
		out.TimedOut = x.ExitCode < 0 && elapsed >= timeout
	}
	return nil, out, nil
}

// agentGrace is how long past its own deadline an agent call may take
// before this side gives up on it.
const agentGrace = 30 * time.Second

// fileCallTimeout bounds one file tool call.
const fileCallTimeout = 2 * time.Minute

// agentError is toToolError for calls to a sandbox agent: a deadline says
// what the likely cause is.
func agentError(ctx context.Context, err error) error {
	te := classify(ctx, err)
	if te.Code == codeTimeout {
		te.Message = "the sandbox agent did not answer in time (a Paused sandbox must be resumed with sandbox_resume first): " + te.Message
	}
	return te
}

// orDefault returns v, or def when v is zero (an omitted optional argument).
func orDefault(v, def int) int {
	if v == 0 {
		return def
	}
	return v
}

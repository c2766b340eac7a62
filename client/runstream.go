package client

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// Stream is Run without keeping the output: lines reach only the handlers,
// and the returned Execution has empty Stdout and Stderr. Use it when the
// output may be large and the caller keeps what it needs (a bounded buffer,
// a file), so memory does not grow with the command's output. Stream is
// never retried. A stream that falls silent (the agent pings every 3 s)
// while the server reports the sandbox ended (Failed, e.g. killed for
// running out of memory) is cut at once with an error wrapping
// ErrSandboxEnded that says why, rather than left to a TCP timeout.
func (s *SandboxHandle) Stream(ctx context.Context, cmd string, opts RunOptions, h Handlers) (*Execution, error) {
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
	body, stop := s.watchStream(ctx, resp.Body)
	defer stop()
	x := &Execution{ExitCode: -1}
	done := false
	err = readEvents(body, func(ev *streamEvent) error {
		switch ev.Type {
		case "init":
			x.ID = ev.Text
			if h.OnInit != nil {
				h.OnInit(ev.Text)
			}
		case "stdout":
			if h.OnStdout != nil {
				h.OnStdout(ev.Text)
			}
		case "stderr":
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
	if err == nil && !done {
		err = fmt.Errorf("ended before completion: %w", io.ErrUnexpectedEOF)
	}
	if err != nil {
		if !errors.Is(err, ErrSandboxEnded) && ctx.Err() == nil {
			// A stream cut short: say so if it is because the sandbox died.
			if e := s.endedSoon(ctx); e != nil {
				err = e
			}
		}
		return x, fmt.Errorf("client: command stream: %w", err)
	}
	if h.OnComplete != nil {
		h.OnComplete(x)
	}
	return x, nil
}

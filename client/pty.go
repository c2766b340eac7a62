package client

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"

	"github.com/coder/websocket"
)

// PTY frame kinds of the agent's PTY WebSocket (first byte of a binary
// frame).
const (
	ptyFrameStdin  = 0x00
	ptyFrameStdout = 0x01
	ptyFrameStderr = 0x02
	ptyFrameReplay = 0x03
)

// PTYStatus is the state of a PTY session.
type PTYStatus struct {
	ID      string `json:"session_id"`
	Running bool   `json:"running"`
	// OutputOffset is the number of output bytes produced so far (pass it
	// as AttachOptions.Since to resume without repeats).
	OutputOffset int64 `json:"output_offset"`
}

// CreatePTY creates a PTY session running command with the agent's shell
// (`$SHELL -c command`), or an interactive shell if command is empty. The
// process starts on the first AttachPTY, not here.
func (s *SandboxHandle) CreatePTY(ctx context.Context, cwd, command string) (string, error) {
	in := struct {
		Cwd     string `json:"cwd,omitempty"`
		Command string `json:"command,omitempty"`
	}{cwd, command}
	var out struct {
		ID string `json:"session_id"`
	}
	if err := s.agent.json(ctx, &call{method: http.MethodPost, path: "/pty", want: []int{http.StatusOK, http.StatusCreated}}, in, &out); err != nil {
		return "", err
	}
	if out.ID == "" {
		return "", errors.New("client: create pty: answer has no session_id")
	}
	return out.ID, nil
}

// PTYStatus returns the state of PTY session id.
func (s *SandboxHandle) PTYStatus(ctx context.Context, id string) (*PTYStatus, error) {
	var st PTYStatus
	if err := s.agent.json(ctx, &call{method: http.MethodGet, path: "/pty/" + url.PathEscape(id)}, nil, &st); err != nil {
		return nil, err
	}
	return &st, nil
}

// DeletePTY kills the process of PTY session id and forgets the session.
func (s *SandboxHandle) DeletePTY(ctx context.Context, id string) error {
	return s.agent.json(ctx, &call{method: http.MethodDelete, path: "/pty/" + url.PathEscape(id)}, nil, nil)
}

// AttachOptions tunes AttachPTY.
type AttachOptions struct {
	// Pipe selects pipe mode (?pty=0): no terminal, separate stdout and
	// stderr. It only takes effect on the attach that starts the process.
	Pipe bool
	// Replay asks for the buffered output from byte offset Since (see
	// PTYStatus.OutputOffset) before live output.
	Replay bool
	Since  int64
	// Takeover evicts a client already attached (else the attach fails
	// with a 409 ALREADY_CONNECTED).
	Takeover bool
}

// PTYEventType names a PTYEvent.
type PTYEventType string

// PTY event types.
const (
	PTYConnected PTYEventType = "connected" // Mode is set
	PTYStdout    PTYEventType = "stdout"    // Data is set
	PTYStderr    PTYEventType = "stderr"    // Data is set (pipe mode only)
	PTYReplay    PTYEventType = "replay"    // Data and Offset are set
	PTYExit      PTYEventType = "exit"      // ExitCode is set; the stream ends after it
	PTYError     PTYEventType = "error"     // Code and Message are set
	PTYPong      PTYEventType = "pong"
)

// PTYEvent is one frame from the agent.
type PTYEvent struct {
	Type PTYEventType
	// Data is the output of a stdout, stderr or replay frame.
	Data []byte
	// Offset is the absolute output offset of a replay frame's first byte.
	Offset int64
	// Mode is "pty" or "pipe" (connected).
	Mode string
	// ExitCode is the process's exit status (exit).
	ExitCode int
	// Code and Message describe an error frame (e.g. "TAKEN_OVER").
	Code, Message string
}

// PTYConn is one WebSocket attached to a PTY session. Next must be called
// from one goroutine; Write, Resize, Signal and Close may be called from
// any.
type PTYConn struct {
	ws  *websocket.Conn
	wmu sync.Mutex
}

// AttachPTY opens the WebSocket of PTY session id; this starts its process
// on the first attach. The first event is normally PTYConnected.
func (s *SandboxHandle) AttachPTY(ctx context.Context, id string, opts AttachOptions) (*PTYConn, error) {
	u, err := wsURL(s.agent.base + "/pty/" + url.PathEscape(id) + "/ws")
	if err != nil {
		return nil, err
	}
	q := url.Values{}
	if opts.Pipe {
		q.Set("pty", "0")
	}
	if opts.Replay {
		q.Set("since", strconv.FormatInt(max(opts.Since, 0), 10))
	}
	if opts.Takeover {
		q.Set("takeover", "1")
	}
	if len(q) > 0 {
		u += "?" + q.Encode()
	}
	ws, resp, err := websocket.Dial(ctx, u, &websocket.DialOptions{HTTPClient: s.agent.hc, HTTPHeader: s.agent.header.Clone()})
	if err != nil {
		if resp != nil && resp.StatusCode >= 300 {
			if resp.Body == nil {
				resp.Body = http.NoBody
			}
			return nil, readAPIError(resp)
		}
		return nil, fmt.Errorf("client: attach pty %s: %w", id, err)
	}
	ws.SetReadLimit(64 << 20)
	return &PTYConn{ws: ws}, nil
}

// wsURL turns an http(s) URL into a ws(s) one.
func wsURL(u string) (string, error) {
	switch {
	case strings.HasPrefix(u, "http://"):
		return "ws://" + strings.TrimPrefix(u, "http://"), nil
	case strings.HasPrefix(u, "https://"):
		return "wss://" + strings.TrimPrefix(u, "https://"), nil
	}
	return "", fmt.Errorf("client: agent URL %q is not http(s)", u)
}

// Next returns the next event. After PTYExit, or when the agent closes the
// socket, it returns io.EOF.
func (c *PTYConn) Next(ctx context.Context) (*PTYEvent, error) {
	for {
		typ, data, err := c.ws.Read(ctx)
		if err != nil {
			if st := websocket.CloseStatus(err); st == websocket.StatusNormalClosure || st == websocket.StatusGoingAway {
				return nil, io.EOF
			} else if st != -1 {
				return nil, fmt.Errorf("client: pty closed: status %d", st)
			}
			return nil, fmt.Errorf("client: pty read: %w", err)
		}
		if typ == websocket.MessageBinary {
			if len(data) == 0 {
				continue
			}
			switch data[0] {
			case ptyFrameStdout:
				return &PTYEvent{Type: PTYStdout, Data: data[1:]}, nil
			case ptyFrameStderr:
				return &PTYEvent{Type: PTYStderr, Data: data[1:]}, nil
			case ptyFrameReplay:
				if len(data) < 9 {
					return nil, errors.New("client: pty: short replay frame")
				}
				return &PTYEvent{Type: PTYReplay, Offset: int64(binary.BigEndian.Uint64(data[1:9])), Data: data[9:]}, nil
			}
			continue // unknown frame kinds are skipped
		}
		var m struct {
			Type      string `json:"type"`
			Mode      string `json:"mode"`
			ExitCode  int    `json:"exit_code"`
			Code      string `json:"code"`
			Message   string `json:"message"`
			SessionID string `json:"session_id"`
		}
		if err := json.Unmarshal(data, &m); err != nil {
			return nil, fmt.Errorf("client: pty: bad frame %.80q: %w", data, err)
		}
		switch PTYEventType(m.Type) {
		case PTYConnected:
			return &PTYEvent{Type: PTYConnected, Mode: m.Mode}, nil
		case PTYExit:
			return &PTYEvent{Type: PTYExit, ExitCode: m.ExitCode}, nil
		case PTYError:
			return &PTYEvent{Type: PTYError, Code: m.Code, Message: m.Message}, nil
		case PTYPong:
			return &PTYEvent{Type: PTYPong}, nil
		}
	}
}

func (c *PTYConn) write(ctx context.Context, typ websocket.MessageType, p []byte) error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if err := c.ws.Write(ctx, typ, p); err != nil {
		return fmt.Errorf("client: pty write: %w", err)
	}
	return nil
}

// Write sends p to the process's stdin.
func (c *PTYConn) Write(ctx context.Context, p []byte) error {
	return c.write(ctx, websocket.MessageBinary, append([]byte{ptyFrameStdin}, p...))
}

func (c *PTYConn) writeJSON(ctx context.Context, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	return c.write(ctx, websocket.MessageText, b)
}

// Resize sets the terminal size (PTY mode).
func (c *PTYConn) Resize(ctx context.Context, cols, rows int) error {
	return c.writeJSON(ctx, map[string]any{"type": "resize", "cols": cols, "rows": rows})
}

// Signal sends a signal ("SIGINT", "SIGTERM", ...) to the terminal's
// foreground process group (PTY mode) or the shell's (pipe mode).
func (c *PTYConn) Signal(ctx context.Context, name string) error {
	return c.writeJSON(ctx, map[string]string{"type": "signal", "signal": name})
}

// Ping asks the agent for a pong event.
func (c *PTYConn) Ping(ctx context.Context) error {
	return c.writeJSON(ctx, map[string]string{"type": "ping"})
}

// Close closes the WebSocket; the session and its process stay (see
// DeletePTY).
func (c *PTYConn) Close() error {
	return c.ws.Close(websocket.StatusNormalClosure, "")
}

// Package wire is the agent's wire format: the execd error codes and the
// {code, message} error constructors, JSON request decoding, and the event
// stream (OpenSandbox's ServerStreamEvent objects framed as compact JSON
// followed by a blank line, with pings), including the fast path that turns
// process output into stdout/stderr events. Every service writes its
// responses through it, so the framing lives in one place.
package wire

import (
	"bytes"
	"encoding/json"
	"net/http"
	"sync"
	"time"
)

// Event is one OpenSandbox ServerStreamEvent. Field order and omitempty
// match upstream execd; ExecutionTime is a pointer so that a 0 ms
// execution_complete still carries the field.
type Event struct {
	Type           string         `json:"type"`
	Text           string         `json:"text,omitempty"`
	ExecutionCount int            `json:"execution_count,omitempty"`
	ExecutionTime  *int64         `json:"execution_time,omitempty"`
	Timestamp      int64          `json:"timestamp,omitempty"`
	Results        map[string]any `json:"results,omitempty"`
	Error          *EventError    `json:"error,omitempty"`
}

// EventError is the error payload of an "error" event.
type EventError struct {
	EName     string   `json:"ename"`
	EValue    string   `json:"evalue"`
	Traceback []string `json:"traceback"`
}

// Event types.
const (
	EvInit              = "init"
	EvStatus            = "status"
	EvError             = "error"
	EvStdout            = "stdout"
	EvStderr            = "stderr"
	EvResult            = "result"
	EvExecutionComplete = "execution_complete"
	EvExecutionCount    = "execution_count"
	EvPing              = "ping"
)

const (
	pingInterval = 3 * time.Second
	WriteWindow  = time.Minute // per-write deadline for stream writes
)

// Stream writes execd's stream framing: each event is one compact JSON
// object followed by "\n\n", with no "data:" prefix (OpenSandbox SDKs parse
// this form; see protocol §2.2 and §14.1). Headers are committed lazily with
// the first event, so a handler can still return a JSON error before that.
// It is safe for concurrent use; after the first write error every Send is
// a no-op and OnBroken (if set) is called once, in its own goroutine.
type Stream struct {
	w  http.ResponseWriter
	rc *http.ResponseController

	mu      sync.Mutex
	started bool
	err     error
	// OnBroken is called once when a write fails (the client is gone).
	// Set it before the first Send.
	OnBroken func()
	pingStop chan struct{}
	pingDone chan struct{}
}

// NewStream returns a Stream that writes to w.
func NewStream(w http.ResponseWriter) *Stream {
	return &Stream{w: w, rc: http.NewResponseController(w)}
}

func nowMs() int64 { return time.Now().UnixMilli() }

// AppendEvent appends ev, framed, to b (stamping the time if unset).
func AppendEvent(b []byte, ev Event) []byte {
	if ev.Timestamp == 0 {
		ev.Timestamp = nowMs()
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	enc.Encode(ev) // cannot fail: only strings, ints and JSON-able maps
	b = append(b, bytes.TrimSuffix(buf.Bytes(), []byte("\n"))...)
	return append(b, '\n', '\n')
}

// send writes and flushes one event.
func (s *Stream) Send(ev Event) error {
	return s.Write(AppendEvent(nil, ev))
}

// write writes pre-framed events and flushes.
func (s *Stream) Write(frames []byte) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.err != nil {
		return s.err
	}
	if !s.started {
		h := s.w.Header()
		h.Set("Content-Type", "text/event-stream")
		h.Set("Cache-Control", "no-cache")
		h.Set("Connection", "keep-alive")
		h.Set("X-Accel-Buffering", "no")
		s.w.WriteHeader(http.StatusOK)
		s.started = true
	}
	s.rc.SetWriteDeadline(time.Now().Add(WriteWindow))
	_, err := s.w.Write(frames)
	if err == nil {
		err = s.rc.Flush()
	}
	if err != nil {
		s.err = err
		if s.OnBroken != nil {
			go s.OnBroken()
		}
	}
	return err
}

// startPings sends a ping event every 3 s until stopPings.
func (s *Stream) StartPings() {
	s.pingStop = make(chan struct{})
	s.pingDone = make(chan struct{})
	stop, done := s.pingStop, s.pingDone
	go func() {
		defer close(done)
		t := time.NewTicker(pingInterval)
		defer t.Stop()
		for {
			select {
			case <-stop:
				return
			case <-t.C:
				select {
				case <-stop: // both ready: never ping after stopPings
					return
				default:
				}
				if s.Send(Event{Type: EvPing, Text: "pong"}) != nil {
					return
				}
			}
		}
	}()
}

// stopPings stops the pinger and waits for it, so that no ping is written
// after the handler returns (the ResponseWriter is dead by then).
func (s *Stream) StopPings() {
	if s.pingStop != nil {
		close(s.pingStop)
		<-s.pingDone
		s.pingStop, s.pingDone = nil, nil
	}
}

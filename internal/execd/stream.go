package execd

import (
	"bytes"
	"encoding/json"
	"net/http"
	"strconv"
	"sync"
	"time"
	"unicode/utf8"
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
	evInit              = "init"
	evStatus            = "status"
	evError             = "error"
	evStdout            = "stdout"
	evStderr            = "stderr"
	evResult            = "result"
	evExecutionComplete = "execution_complete"
	evExecutionCount    = "execution_count"
	evPing              = "ping"
)

const (
	pingInterval      = 3 * time.Second
	streamWriteWindow = time.Minute // per-write deadline for stream writes
)

// eventStream writes execd's stream framing: each event is one compact JSON
// object followed by "\n\n", with no "data:" prefix (OpenSandbox SDKs parse
// this form; see protocol §2.2 and §14.1). Headers are committed lazily with
// the first event, so a handler can still return a JSON error before that.
// It is safe for concurrent use; after the first write error every send is
// a no-op and onBroken (if set) is called once.
type eventStream struct {
	w  http.ResponseWriter
	rc *http.ResponseController

	mu       sync.Mutex
	started  bool
	err      error
	onBroken func()
	pingStop chan struct{}
	pingDone chan struct{}
}

func newEventStream(w http.ResponseWriter) *eventStream {
	return &eventStream{w: w, rc: http.NewResponseController(w)}
}

func nowMs() int64 { return time.Now().UnixMilli() }

func appendEvent(b []byte, ev Event) []byte {
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
func (s *eventStream) send(ev Event) error {
	return s.write(appendEvent(nil, ev))
}

// write writes pre-framed events and flushes.
func (s *eventStream) write(frames []byte) error {
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
	s.rc.SetWriteDeadline(time.Now().Add(streamWriteWindow))
	_, err := s.w.Write(frames)
	if err == nil {
		err = s.rc.Flush()
	}
	if err != nil {
		s.err = err
		if s.onBroken != nil {
			go s.onBroken()
		}
	}
	return err
}

// startPings sends a ping event every 3 s until stopPings.
func (s *eventStream) startPings() {
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
				if s.send(Event{Type: evPing, Text: "pong"}) != nil {
					return
				}
			}
		}
	}()
}

// stopPings stops the pinger and waits for it, so that no ping is written
// after the handler returns (the ResponseWriter is dead by then).
func (s *eventStream) stopPings() {
	if s.pingStop != nil {
		close(s.pingStop)
		<-s.pingDone
		s.pingStop, s.pingDone = nil, nil
	}
}

// maxLine bounds one stdout/stderr event; longer lines are split.
const maxLine = 1 << 20

// lineSplitter turns a byte stream into line events the way upstream execd
// does: "\n", "\r" and "\r\n" end a line and are stripped; an empty line is
// reported as the text "\n" (so clients see the gap); the trailing partial
// line is emitted by flush.
type lineSplitter struct {
	typ    string
	buf    []byte
	lastCR bool
	ts     int64 // timestamp of the events of one write (one clock read per chunk)
}

// write appends the events for p to out.
func (l *lineSplitter) write(out []byte, p []byte) []byte {
	l.ts = nowMs()
	for len(p) > 0 {
		i := bytes.IndexAny(p, "\r\n")
		if i < 0 {
			l.buf = append(l.buf, p...)
			l.lastCR = false
			if len(l.buf) >= maxLine {
				out = l.emit(out, string(l.buf))
				l.buf = l.buf[:0]
			}
			return out
		}
		b := p[i]
		l.buf = append(l.buf, p[:i]...)
		if i > 0 {
			l.lastCR = false
		}
		switch {
		case len(l.buf) > 0:
			out = l.emit(out, string(l.buf))
			l.buf = l.buf[:0]
		case b == '\n' && l.lastCR:
			// second half of "\r\n", already emitted at "\r"
		default:
			out = l.emit(out, "\n")
		}
		l.lastCR = b == '\r'
		p = p[i+1:]
	}
	return out
}

func (l *lineSplitter) flush(out []byte) []byte {
	l.ts = nowMs()
	if len(l.buf) > 0 {
		out = l.emit(out, string(l.buf))
		l.buf = l.buf[:0]
	}
	return out
}

// emit appends one output event. It is the hot path of streaming, so it
// writes the same bytes appendEvent would without reflection.
func (l *lineSplitter) emit(out []byte, text string) []byte {
	out = append(out, `{"type":"`...)
	out = append(out, l.typ...)
	out = append(out, `","text":`...)
	out = appendJSONString(out, text)
	out = append(out, `,"timestamp":`...)
	out = strconv.AppendInt(out, l.ts, 10)
	return append(out, "}\n\n"...)
}

// appendJSONString appends s as a JSON string exactly like encoding/json
// with SetEscapeHTML(false): invalid UTF-8 becomes U+FFFD, and U+2028 and
// U+2029 are escaped.
func appendJSONString(out []byte, s string) []byte {
	const hex = "0123456789abcdef"
	out = append(out, '"')
	start := 0
	for i := 0; i < len(s); {
		if b := s[i]; b < utf8.RuneSelf {
			if b >= 0x20 && b != '"' && b != '\\' {
				i++
				continue
			}
			out = append(out, s[start:i]...)
			switch b {
			case '"', '\\':
				out = append(out, '\\', b)
			case '\n':
				out = append(out, '\\', 'n')
			case '\r':
				out = append(out, '\\', 'r')
			case '\t':
				out = append(out, '\\', 't')
			case '\b':
				out = append(out, '\\', 'b')
			case '\f':
				out = append(out, '\\', 'f')
			default:
				out = append(out, '\\', 'u', '0', '0', hex[b>>4], hex[b&0xf])
			}
			i++
			start = i
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 {
			out = append(out, s[start:i]...)
			out = append(out, `\ufffd`...)
			i += size
			start = i
			continue
		}
		if r == '\u2028' || r == '\u2029' {
			out = append(out, s[start:i]...)
			out = append(out, '\\', 'u', '2', '0', '2', hex[r&0xf])
			i += size
			start = i
			continue
		}
		i += size
	}
	out = append(out, s[start:]...)
	return append(out, '"')
}

// Package exectest holds the HTTP test helpers shared by the agent's
// service packages: a client for an agent under test, the strict event
// stream parser and the {code, message} error check. Only tests import it.
package exectest

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/moat-sandbox/moat/internal/execd/wire"
)

// Hex32 matches the agent's ids (a uuid without dashes).
var Hex32 = regexp.MustCompile(`^[0-9a-f]{32}$`)

// Env is a client of an agent under test.
type Env struct {
	T      testing.TB
	URL    string
	Client *http.Client
}

// Serve serves routes on an httptest server for the rest of the test.
func Serve(t testing.TB, routes ...[]wire.Route) *Env {
	t.Helper()
	ts := httptest.NewServer(wire.Mux(slog.New(slog.NewTextHandler(io.Discard, nil)), routes...))
	t.Cleanup(func() {
		ts.CloseClientConnections()
		ts.Close()
	})
	return &Env{T: t, URL: ts.URL, Client: ts.Client()}
}

// Do sends a request; a body that is not a string or []byte is sent as
// JSON.
func (e *Env) Do(method, path string, body any) *http.Response {
	e.T.Helper()
	var rd io.Reader
	switch b := body.(type) {
	case nil:
	case string:
		rd = strings.NewReader(b)
	case []byte:
		rd = bytes.NewReader(b)
	default:
		data, _ := json.Marshal(b)
		rd = bytes.NewReader(data)
	}
	req, err := http.NewRequest(method, e.URL+path, rd)
	if err != nil {
		e.T.Fatal(err)
	}
	if rd != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := e.Client.Do(req)
	if err != nil {
		e.T.Fatal(err)
	}
	return resp
}

// Call does a request and returns status and body.
func (e *Env) Call(method, path string, body any) (int, []byte) {
	e.T.Helper()
	resp := e.Do(method, path, body)
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		e.T.Fatal(err)
	}
	return resp.StatusCode, data
}

// Events posts req to path and returns the whole stream's events, pings
// dropped; a status other than 200 fails the test.
func (e *Env) Events(path string, req any) []wire.Event {
	e.T.Helper()
	resp := e.Do("POST", path, req)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		e.T.Fatal(err)
	}
	if resp.StatusCode != 200 {
		e.T.Fatalf("POST %s: status %d: %s", path, resp.StatusCode, body)
	}
	var out []wire.Event
	for _, ev := range ReadEvents(e.T, body) {
		if ev.Type != wire.EvPing {
			out = append(out, ev)
		}
	}
	return out
}

// WantError asserts an execd {code, message} error.
func WantError(t testing.TB, status int, body []byte, wantStatus int, wantCode string) {
	t.Helper()
	if status != wantStatus {
		t.Fatalf("status = %d, want %d; body %s", status, wantStatus, body)
	}
	var eb struct{ Code, Message string }
	if err := json.Unmarshal(body, &eb); err != nil {
		t.Fatalf("error body %q: %v", body, err)
	}
	if eb.Code != wantCode || eb.Message == "" {
		t.Fatalf("error = %+v, want code %s and a message", eb, wantCode)
	}
}

// ReadEvents parses a whole execd stream, checking the exact framing:
// compact JSON objects each followed by exactly "\n\n".
func ReadEvents(t testing.TB, body []byte) []wire.Event {
	t.Helper()
	var evs []wire.Event
	rest := body
	for len(rest) > 0 {
		i := bytes.Index(rest, []byte("\n\n"))
		if i < 0 {
			t.Fatalf("unterminated frame %q", rest)
		}
		frame := rest[:i]
		rest = rest[i+2:]
		if len(frame) == 0 || frame[0] != '{' || bytes.ContainsAny(frame, "\n") {
			t.Fatalf("bad frame %q", frame)
		}
		var compact bytes.Buffer
		if err := json.Compact(&compact, frame); err != nil || !bytes.Equal(compact.Bytes(), frame) {
			t.Fatalf("frame is not compact JSON: %q (%v)", frame, err)
		}
		var ev wire.Event
		if err := json.Unmarshal(frame, &ev); err != nil {
			t.Fatal(err)
		}
		evs = append(evs, ev)
	}
	return evs
}

// StreamReader reads events incrementally from a live stream, skipping
// pings.
type StreamReader struct {
	t  testing.TB
	br *bufio.Reader
}

// NewStreamReader reads events from r.
func NewStreamReader(t testing.TB, r io.Reader) *StreamReader {
	return &StreamReader{t: t, br: bufio.NewReader(r)}
}

// Next returns the next event that is not a ping; the end of the stream
// fails the test.
func (s *StreamReader) Next() wire.Event {
	s.t.Helper()
	ev, err := s.next()
	if err != nil {
		s.t.Fatal(err)
	}
	return ev
}

func (s *StreamReader) next() (wire.Event, error) {
	for {
		line, err := s.br.ReadBytes('\n')
		if err != nil {
			return wire.Event{}, fmt.Errorf("stream ended: %v (%q)", err, line)
		}
		line = bytes.TrimSpace(line)
		if len(line) == 0 {
			continue
		}
		var ev wire.Event
		if err := json.Unmarshal(line, &ev); err != nil {
			return wire.Event{}, fmt.Errorf("bad event %q: %v", line, err)
		}
		if ev.Type != wire.EvPing {
			return ev, nil
		}
	}
}

// Final reads up to the stream's final event (error or
// execution_complete) and returns it; it fails the test if the stream
// breaks or nothing final arrives within d (the caller closes the body).
func (s *StreamReader) Final(d time.Duration) wire.Event {
	s.t.Helper()
	type result struct {
		ev  wire.Event
		err error
	}
	done := make(chan result, 1)
	go func() {
		for {
			ev, err := s.next()
			if err != nil || ev.Type == wire.EvError || ev.Type == wire.EvExecutionComplete {
				done <- result{ev, err}
				return
			}
		}
	}()
	select {
	case r := <-done:
		if r.err != nil {
			s.t.Fatal(r.err)
		}
		return r.ev
	case <-time.After(d):
		s.t.Fatalf("no final event in %s: the cell still runs", d)
		return wire.Event{}
	}
}

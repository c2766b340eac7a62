package execd

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	if os.Getenv(helperEnv) != "" {
		os.Exit(runHelper())
	}
	goleak.VerifyTestMain(m)
}

type testEnv struct {
	t   *testing.T
	srv *Server
	ts  *httptest.Server
	dir string
}

func newTestEnv(t *testing.T, mod ...func(*Options)) *testEnv {
	t.Helper()
	dir := t.TempDir()
	opts := Options{
		BaseEnv:   childEnv(os.Environ()),
		StateDir:  dir,
		Log:       slog.New(slog.NewTextHandler(io.Discard, nil)),
		KillGrace: 500 * time.Millisecond,
	}
	for _, f := range mod {
		f(&opts)
	}
	srv, err := NewServer(opts)
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(srv)
	t.Cleanup(func() {
		ts.CloseClientConnections()
		ts.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := srv.Close(ctx); err != nil {
			t.Errorf("server close: %v", err)
		}
	})
	return &testEnv{t: t, srv: srv, ts: ts, dir: dir}
}

func (e *testEnv) do(method, path string, body any) *http.Response {
	e.t.Helper()
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
	req, err := http.NewRequest(method, e.ts.URL+path, rd)
	if err != nil {
		e.t.Fatal(err)
	}
	if rd != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := e.ts.Client().Do(req)
	if err != nil {
		e.t.Fatal(err)
	}
	return resp
}

// call does a request and returns status and body.
func (e *testEnv) call(method, path string, body any) (int, []byte) {
	e.t.Helper()
	resp := e.do(method, path, body)
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		e.t.Fatal(err)
	}
	return resp.StatusCode, data
}

// wantError asserts an execd {code, message} error.
func wantError(t *testing.T, status int, body []byte, wantStatus int, wantCode string) {
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

// readEvents parses a whole execd stream, checking the exact framing:
// compact JSON objects each followed by exactly "\n\n".
func readEvents(t *testing.T, body []byte) []Event {
	t.Helper()
	var evs []Event
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
		var ev Event
		if err := json.Unmarshal(frame, &ev); err != nil {
			t.Fatal(err)
		}
		evs = append(evs, ev)
	}
	return evs
}

// runStream posts a command and returns its events (pings dropped).
func (e *testEnv) runStream(req map[string]any) []Event {
	e.t.Helper()
	resp := e.do("POST", "/command", req)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		e.t.Fatal(err)
	}
	if resp.StatusCode != 200 {
		e.t.Fatalf("status %d: %s", resp.StatusCode, body)
	}
	var out []Event
	for _, ev := range readEvents(e.t, body) {
		if ev.Type != evPing {
			out = append(out, ev)
		}
	}
	return out
}

// streamReader reads events incrementally from a live stream.
type streamReader struct {
	t  *testing.T
	br *bufio.Reader
}

func (s *streamReader) next() Event {
	s.t.Helper()
	for {
		line, err := s.br.ReadBytes('\n')
		if err != nil {
			s.t.Fatalf("stream ended: %v (%q)", err, line)
		}
		line = bytes.TrimSpace(line)
		if len(line) == 0 {
			continue
		}
		var ev Event
		if err := json.Unmarshal(line, &ev); err != nil {
			s.t.Fatalf("bad event %q: %v", line, err)
		}
		if ev.Type == evPing {
			continue
		}
		return ev
	}
}

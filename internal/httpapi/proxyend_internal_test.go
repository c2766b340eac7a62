package httpapi

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/moat-sandbox/moat/internal/lifecycle"
	"github.com/moat-sandbox/moat/internal/web"
)

// hangingBackend answers like a sandbox that died mid-answer without
// resetting its connections: it sends headers and one line (unless
// silent), then nothing, until the test ends.
func hangingBackend(t *testing.T, contentType string, silent bool) string {
	t.Helper()
	quit := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !silent {
			w.Header().Set("Content-Type", contentType)
			io.WriteString(w, `{"type":"stdout","text":"allocating"}`+"\n\n")
			w.(http.Flusher).Flush()
		}
		select {
		case <-quit:
		case <-r.Context().Done():
		}
	}))
	t.Cleanup(func() { close(quit); srv.Close() })
	return strings.TrimPrefix(srv.URL, "http://")
}

// endingProxy serves the proxy to addr for a sandbox that ends when the
// returned function is called.
func endingProxy(t *testing.T, addr string, agent bool) (*httptest.Server, func()) {
	t.Helper()
	log := slog.New(slog.DiscardHandler)
	p := newProxy(nil, &web.Adapter{Log: log, Codes: codeOf}, log)
	ended := make(chan struct{})
	ep := lifecycle.Endpoint{Address: addr, Ended: ended, EndStatus: func() lifecycle.Status {
		return lifecycle.Status{State: lifecycle.StateFailed, Reason: lifecycle.ReasonOOMKilled, Message: "the sandbox agent was killed by the OOM killer (out of memory)"}
	}}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx := context.WithValue(r.Context(), targetKey{}, target{addr: addr, path: "/command"})
		p.serveUntilEnded(w, r.WithContext(ctx), "sb-1", ep, agent)
	}))
	t.Cleanup(srv.Close)
	return srv, func() { close(ended) }
}

// An agent's event stream through the proxy ends, when the sandbox does,
// with an error event naming the reason, and cleanly.
func TestProxyEndsAgentStreamOfEndedSandbox(t *testing.T) {
	srv, end := endingProxy(t, hangingBackend(t, "text/event-stream", false), true)
	resp, err := http.Post(srv.URL, "application/json", strings.NewReader(`{"command":"x"}`))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	br := bufio.NewReader(resp.Body)
	if line, err := br.ReadString('\n'); err != nil || !strings.Contains(line, "allocating") {
		t.Fatalf("first event %q %v", line, err)
	}
	end()
	done := make(chan struct{})
	var rest []byte
	go func() { defer close(done); rest, err = io.ReadAll(br) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("the stream did not end within 10s of the sandbox")
	}
	if err != nil {
		t.Fatalf("stream ended with %v, want a clean end after the error event", err)
	}
	var ev struct {
		Type  string `json:"type"`
		Error struct {
			EName  string `json:"ename"`
			EValue string `json:"evalue"`
		} `json:"error"`
	}
	if err := json.Unmarshal([]byte(strings.TrimSpace(string(rest))), &ev); err != nil {
		t.Fatalf("rest of the stream %q: %v", rest, err)
	}
	if ev.Type != "error" || ev.Error.EName != lifecycle.ReasonOOMKilled || !strings.Contains(ev.Error.EValue, "sandbox sb-1 is Failed: the sandbox agent was killed by the OOM killer") {
		t.Fatalf("last event %+v", ev)
	}
}

// Any other answer under way is cut; one not started yet is the API error
// of an ended sandbox.
func TestProxyCutsOtherExchangesOfEndedSandbox(t *testing.T) {
	for _, c := range []struct {
		name          string
		contentType   string
		silent, agent bool
	}{
		{"stream of a service", "text/event-stream", false, false},
		{"chunked answer of the agent", "application/octet-stream", false, true},
		{"no answer yet", "", true, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			srv, end := endingProxy(t, hangingBackend(t, c.contentType, c.silent), c.agent)
			type result struct {
				resp *http.Response
				body []byte
				err  error
			}
			got := make(chan result, 1)
			go func() {
				resp, err := http.Get(srv.URL)
				if err != nil {
					got <- result{err: err}
					return
				}
				defer resp.Body.Close()
				body, err := io.ReadAll(resp.Body)
				got <- result{resp, body, err}
			}()
			time.Sleep(200 * time.Millisecond) // the request is under way
			end()
			var res result
			select {
			case res = <-got:
			case <-time.After(10 * time.Second):
				t.Fatal("the exchange did not end within 10s of the sandbox")
			}
			if c.silent {
				var m map[string]string
				json.Unmarshal(res.body, &m)
				if res.err != nil || res.resp.StatusCode != http.StatusConflict || m["code"] != "SANDBOX::NOT_RUNNING" || !strings.Contains(m["message"], "OOM killer") {
					t.Fatalf("answer %v %s (%v), want 409 SANDBOX::NOT_RUNNING with the reason", res.resp, res.body, res.err)
				}
				return
			}
			if res.err == nil {
				t.Fatalf("the cut answer read cleanly: %q", res.body)
			}
		})
	}
}

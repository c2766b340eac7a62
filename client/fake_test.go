package client

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
)

// fake is an httptest lifecycle server whose agent lives under /agent and
// whose egress API under /sandboxes/{id}/proxy/18080, all on loopback.
type fake struct {
	t   *testing.T
	srv *httptest.Server
	mux *http.ServeMux

	mu   sync.Mutex
	reqs []recorded
}

type recorded struct {
	Method, Path, RawQuery string
	Header                 http.Header
	Body                   []byte
}

const (
	agentToken  = "agent-token"
	egressToken = "egress-token"
)

func newFake(t *testing.T) *fake {
	t.Helper()
	f := &fake{t: t, mux: http.NewServeMux()}
	f.srv = httptest.NewServer(http.HandlerFunc(f.serve))
	t.Cleanup(f.srv.Close)
	return f
}

func (f *fake) host() string { return strings.TrimPrefix(f.srv.URL, "http://") }

func (f *fake) serve(w http.ResponseWriter, r *http.Request) {
	rec := recorded{Method: r.Method, Path: r.URL.Path, RawQuery: r.URL.RawQuery, Header: r.Header.Clone()}
	if !strings.HasPrefix(r.Header.Get("Content-Type"), "multipart/") {
		rec.Body, _ = io.ReadAll(r.Body)
		r.Body = io.NopCloser(strings.NewReader(string(rec.Body)))
	}
	f.mu.Lock()
	f.reqs = append(f.reqs, rec)
	f.mu.Unlock()
	w.Header().Set("X-Request-ID", "req-1")
	f.mux.ServeHTTP(w, r)
}

// handle registers a handler for a ServeMux pattern.
func (f *fake) handle(pattern string, h http.HandlerFunc) { f.mux.HandleFunc(pattern, h) }

// requests returns the recorded requests whose path has the prefix.
func (f *fake) requests(prefix string) []recorded {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []recorded
	for _, r := range f.reqs {
		if strings.HasPrefix(r.Path, prefix) {
			out = append(out, r)
		}
	}
	return out
}

func (f *fake) last(prefix string) recorded {
	f.t.Helper()
	rs := f.requests(prefix)
	if len(rs) == 0 {
		f.t.Fatalf("no request to %s", prefix)
	}
	return rs[len(rs)-1]
}

// withEndpoints serves the endpoint route: the agent port resolves to
// /agent on this server, the egress port to the server's egress route.
func (f *fake) withEndpoints() {
	f.handle("GET /v1/sandboxes/{id}/endpoints/{port}", func(w http.ResponseWriter, r *http.Request) {
		id := r.PathValue("id")
		switch r.PathValue("port") {
		case "44772":
			writeJSON(w, 200, map[string]any{"endpoint": f.host() + "/agent", "headers": map[string]string{"X-EXECD-ACCESS-TOKEN": agentToken}})
		case "18080":
			writeJSON(w, 200, map[string]any{"endpoint": f.host() + "/sandboxes/" + id + "/proxy/18080", "headers": map[string]string{"OPENSANDBOX-EGRESS-AUTH": egressToken}})
		default:
			writeJSON(w, 404, map[string]string{"code": "SANDBOX::NOT_FOUND", "message": "no"})
		}
	})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

func mustClient(t *testing.T, url string, opts ...Option) *Client {
	t.Helper()
	c, err := New(url, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func decodeBody(t *testing.T, b []byte) map[string]any {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatalf("body %q: %v", b, err)
	}
	return m
}

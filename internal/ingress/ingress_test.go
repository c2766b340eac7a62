package ingress

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"
	"go.uber.org/goleak"

	"github.com/moat-sandbox/moat/internal/errdefs"
	"github.com/moat-sandbox/moat/internal/web/webtest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// fakeResolver serves sandboxes from a map; sandbox ids map to a target
// template whose Addr is used for every port.
type fakeResolver struct {
	mu        sync.Mutex
	sandboxes map[string]Target
	errs      map[string]error // forced Resolve errors by id
	resolved  []candidate
	touches   map[string]int
}

func newFakeResolver() *fakeResolver {
	return &fakeResolver{sandboxes: map[string]Target{}, errs: map[string]error{}, touches: map[string]int{}}
}

func (f *fakeResolver) add(id string, t Target) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.sandboxes[id] = t
}

func (f *fakeResolver) Resolve(ctx context.Context, id string, port int) (Target, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.resolved = append(f.resolved, candidate{id, port})
	if err := f.errs[id]; err != nil {
		return Target{}, err
	}
	t, ok := f.sandboxes[id]
	if !ok {
		return Target{}, fmt.Errorf("sandbox %q: %w", id, errdefs.ErrNotFound)
	}
	return t, nil
}

func (f *fakeResolver) Touch(ctx context.Context, id string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.touches[id]++
}

func (f *fakeResolver) touchCount(id string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.touches[id]
}

// echo is what the echo backend reports about the request it got.
type echo struct {
	Backend string      `json:"backend"`
	Method  string      `json:"method"`
	URI     string      `json:"uri"`
	Host    string      `json:"host"`
	Header  http.Header `json:"header"`
	Body    string      `json:"body"`
}

// newBackend starts an HTTP echo backend named name on 127.0.0.1. Besides
// echoing, it serves /ws (WebSocket echo) and /sse (see sseBackend).
func newBackend(t testing.TB, name string) *httptest.Server {
	t.Helper()
	mux := http.NewServeMux()
	mux.HandleFunc("/ws", func(w http.ResponseWriter, r *http.Request) {
		c, err := websocket.Accept(w, r, nil)
		if err != nil {
			return
		}
		defer c.CloseNow()
		ctx := context.Background()
		for {
			typ, msg, err := c.Read(ctx)
			if err != nil {
				return
			}
			if err := c.Write(ctx, typ, append([]byte(name+":"), msg...)); err != nil {
				return
			}
		}
	})
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		w.Header().Set(PoweredByHeader, "backend")
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(echo{Backend: name, Method: r.Method, URI: r.RequestURI, Host: r.Host, Header: r.Header, Body: string(body)})
	})
	ts := httptest.NewServer(mux)
	t.Cleanup(ts.Close)
	return ts
}

func addrOf(ts *httptest.Server) string { return strings.TrimPrefix(ts.URL, "http://") }

type env struct {
	t   testing.TB
	res *fakeResolver
	gw  *Gateway
	ts  *httptest.Server // the gateway
	cl  *http.Client     // dials the gateway for any host name
}

func newEnv(t testing.TB) *env {
	t.Helper()
	return newEnvConfig(t, Config{Domain: testDomain, DialTimeout: 2 * time.Second})
}

func newEnvConfig(t testing.TB, cfg Config) *env {
	t.Helper()
	res := newFakeResolver()
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	gw := New(cfg, res, log)
	ts := httptest.NewServer(gw)
	tr := &http.Transport{
		DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "tcp", addrOf(ts)) // every name is the gateway
		},
		MaxIdleConnsPerHost: 256,
	}
	t.Cleanup(func() {
		tr.CloseIdleConnections()
		ts.CloseClientConnections()
		ts.Close()
		gw.CloseIdleConnections()
	})
	return &env{t: t, res: res, gw: gw, ts: ts, cl: &http.Client{Transport: tr}}
}

// do sends a request to url (host names resolve to the gateway).
func (e *env) do(method, url string, hdr map[string]string, body string) (*http.Response, []byte) {
	e.t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		e.t.Fatal(err)
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := e.cl.Do(req)
	if err != nil {
		e.t.Fatal(err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		e.t.Fatal(err)
	}
	return resp, data
}

// echoOf decodes an echo response, failing unless the status is 200.
func echoOf(t testing.TB, resp *http.Response, body []byte) echo {
	t.Helper()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d, body %s", resp.StatusCode, body)
	}
	var e echo
	if err := json.Unmarshal(body, &e); err != nil {
		t.Fatalf("body %q: %v", body, err)
	}
	return e
}

// echo sends a request and decodes the echo reply (status must be 200).
func (e *env) echo(t testing.TB, method, url string, hdr map[string]string, body string) echo {
	t.Helper()
	resp, data := e.do(method, url, hdr, body)
	return echoOf(t, resp, data)
}

// wantError checks a {code, message} error envelope.
func wantError(t testing.TB, resp *http.Response, body []byte, status int, code string) {
	t.Helper()
	if resp.StatusCode != status {
		t.Fatalf("status = %d, want %d; body %s", resp.StatusCode, status, body)
	}
	var eb struct{ Code, Message string }
	if err := json.Unmarshal(body, &eb); err != nil {
		t.Fatalf("error body %q: %v", body, err)
	}
	if eb.Code != code || eb.Message == "" {
		t.Fatalf("error = %+v, want code %s and a message", eb, code)
	}
	if got := resp.Header.Get(PoweredByHeader); got != PoweredBy {
		t.Fatalf("%s = %q on an error", PoweredByHeader, got)
	}
}

func TestRoutingModes(t *testing.T) {
	e := newEnv(t)
	a, b := newBackend(t, "a"), newBackend(t, "b")
	e.res.add("sb-a", Target{Addr: addrOf(a)})
	e.res.add("3f2a9c1e-7b4d-4e8a-9c2f-1a2b3c4d5e6f", Target{Addr: addrOf(b)})
	gw := e.ts.URL
	tests := []struct {
		name    string
		url     string
		hdr     map[string]string
		backend string
		uri     string
	}{
		{"1 header", gw + "/some/path?x=1&y=2", map[string]string{HeaderIngressTo: "sb-a-8080"}, "a", "/some/path?x=1&y=2"},
		{"2 host port-id", "http://8080-3f2a9c1e-7b4d-4e8a-9c2f-1a2b3c4d5e6f." + testDomain + "/p?q", nil, "b", "/p?q"},
		{"3 host id-port", "http://3f2a9c1e-7b4d-4e8a-9c2f-1a2b3c4d5e6f-8080." + testDomain + "/p", nil, "b", "/p"},
		{"4 path", gw + "/sb-a/3000/api/v1/x%2Fy?k=v&k=w", nil, "a", "/api/v1/x%2Fy?k=v&k=w"},
		{"5 path no rest", gw + "/sb-a/3000", nil, "a", "/"},
		{"6 path trailing slash", gw + "/sb-a/3000/", nil, "a", "/"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			resp, body := e.do("POST", tc.url, tc.hdr, "payload")
			got := echoOf(t, resp, body)
			if got.Backend != tc.backend || got.URI != tc.uri || got.Method != "POST" || got.Body != "payload" {
				t.Fatalf("upstream saw %+v, want backend %s uri %s", got, tc.backend, tc.uri)
			}
			if got.Header.Get(HeaderIngressTo) != "" {
				t.Fatalf("%s reached the sandbox", HeaderIngressTo)
			}
			if v := resp.Header.Values(PoweredByHeader); len(v) != 1 || v[0] != PoweredBy {
				t.Fatalf("%s = %q, want exactly [%s]", PoweredByHeader, v, PoweredBy)
			}
		})
	}
}

func TestHostAmbiguity(t *testing.T) {
	e := newEnv(t)
	a := newBackend(t, "a")
	url := "http://8080-web-3000." + testDomain + "/"

	// Only "8080-web" exists: the <port>-<id> reading (sandbox web-3000)
	// misses, so the upstream reading (port 3000) is used.
	e.res.add("8080-web", Target{Addr: addrOf(a)})
	e.echo(t, "GET", url, nil, "")
	if got := e.res.resolved; len(got) != 2 || got[0] != (candidate{"web-3000", 8080}) || got[1] != (candidate{"8080-web", 3000}) {
		t.Fatalf("resolved %v", got)
	}

	// Both exist: <port>-<id> wins and the other is never asked.
	e.res.add("web-3000", Target{Addr: addrOf(a)})
	e.res.resolved = nil
	e.echo(t, "GET", url, nil, "")
	if got := e.res.resolved; len(got) != 1 || got[0] != (candidate{"web-3000", 8080}) {
		t.Fatalf("resolved %v", got)
	}
}

func TestErrors(t *testing.T) {
	e := newEnv(t)
	a := newBackend(t, "a")
	e.res.add("up", Target{Addr: addrOf(a)})
	// A port nobody listens on: bind, note the address, close.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := ln.Addr().String()
	ln.Close()
	e.res.add("dead", Target{Addr: dead})
	e.res.add("noaddr", Target{})
	e.res.errs["stopped"] = fmt.Errorf("sandbox stopped is Paused with secret-internal-detail: %w", errdefs.ErrFailedPrecondition)
	e.res.errs["broken"] = fmt.Errorf("store: secret-internal-detail: %w", errdefs.ErrInternal)
	gw := e.ts.URL
	tests := []struct {
		name   string
		url    string
		hdr    map[string]string
		status int
		code   string
	}{
		{"1 root", gw + "/", nil, 400, codeInvalidRoute},
		{"2 missing port", gw + "/up", nil, 400, codeInvalidRoute},
		{"3 bad port", gw + "/up/abc/", nil, 400, codeInvalidRoute},
		{"4 port zero", gw + "/up/0/", nil, 400, codeInvalidRoute},
		{"5 port out of range", gw + "/up/70000/", nil, 400, codeInvalidRoute},
		{"6 header missing id", gw + "/", map[string]string{HeaderIngressTo: "-80"}, 400, codeInvalidRoute},
		{"7 header bad port", gw + "/up/80/", map[string]string{HeaderIngressTo: "up-http"}, 400, codeInvalidRoute},
		{"8 host bad", "http://up." + testDomain + "/", nil, 400, codeInvalidRoute},
		{"9 unknown sandbox", gw + "/nope/80/", nil, 404, codeNotFound},
		{"10 unknown via host", "http://80-nope." + testDomain + "/", nil, 404, codeNotFound},
		{"11 not running", gw + "/stopped/80/", nil, 503, codeNotRunning},
		{"12 no address", gw + "/noaddr/80/", nil, 503, codeNotRunning},
		{"13 resolver failure", gw + "/broken/80/", nil, 502, codeBadGateway},
		{"14 unreachable backend", gw + "/dead/80/", nil, 502, codeBadGateway},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			resp, body := e.do("GET", tc.url, tc.hdr, "")
			wantError(t, resp, body, tc.status, tc.code)
			if strings.Contains(string(body), "secret") || strings.Contains(string(body), "127.0.0.1") {
				t.Fatalf("internal detail leaked: %s", body)
			}
		})
	}
	for _, id := range []string{"nope", "stopped", "noaddr", "broken"} {
		if n := e.res.touchCount(id); n != 0 {
			t.Errorf("Touch(%s) called %d times on a failed resolve", id, n)
		}
	}
}

func TestHealth(t *testing.T) {
	e := newEnv(t)
	resp, body := e.do("GET", e.ts.URL+HealthPath, nil, "")
	if resp.StatusCode != 200 || string(body) != "OK" {
		t.Fatalf("health: %d %q", resp.StatusCode, body)
	}
	// On a sandbox host, /status.ok belongs to the sandbox.
	a := newBackend(t, "a")
	e.res.add("sb", Target{Addr: addrOf(a)})
	got := e.echo(t, "GET", "http://80-sb."+testDomain+HealthPath, nil, "")
	if got.Backend != "a" || got.URI != HealthPath {
		t.Fatalf("upstream saw %+v", got)
	}
}

func TestSecureAccess(t *testing.T) {
	e := newEnv(t)
	a := newBackend(t, "a")
	const tok = "s3cr3t-token"
	e.res.add("sec", Target{Addr: addrOf(a), AccessToken: tok})
	e.res.add("open", Target{Addr: addrOf(a)})
	gw := e.ts.URL
	deny := []struct {
		name string
		url  string
		hdr  map[string]string
	}{
		{"1 missing", gw + "/sec/80/", nil},
		{"2 wrong header", gw + "/sec/80/", map[string]string{HeaderSecureAccess: "s3cr3t-tokem"}},
		{"3 prefix of token", gw + "/sec/80/", map[string]string{HeaderSecureAccess: "s3cr3t"}},
		{"4 wrong query", gw + "/sec/80/?access_token=nope", nil},
		{"5 empty query", gw + "/sec/80/?access_token=", nil},
		{"6 host mode missing", "http://80-sec." + testDomain + "/", nil},
	}
	for _, tc := range deny {
		t.Run(tc.name, func(t *testing.T) {
			resp, body := e.do("GET", tc.url, tc.hdr, "")
			wantError(t, resp, body, 401, codeUnauthorized)
			if strings.Contains(string(body), tok) {
				t.Fatal("token in error body")
			}
		})
	}
	if n := e.res.touchCount("sec"); n != 0 {
		t.Fatalf("Touch called %d times for unauthorised requests", n)
	}

	t.Run("7 header", func(t *testing.T) {
		got := e.echo(t, "GET", gw+"/sec/80/x?a=1", map[string]string{HeaderSecureAccess: tok}, "")
		if got.Header.Get(HeaderSecureAccess) != "" || got.URI != "/x?a=1" {
			t.Fatalf("upstream saw %+v", got)
		}
	})
	t.Run("8 query", func(t *testing.T) {
		got := e.echo(t, "GET", gw+"/sec/80/x?z=9&access_token="+tok+"&a=%2B1", nil, "")
		if got.URI != "/x?z=9&a=%2B1" {
			t.Fatalf("upstream uri %q: token not stripped or query reordered", got.URI)
		}
	})
	t.Run("9 host mode header", func(t *testing.T) {
		got := e.echo(t, "GET", "http://sec-80."+testDomain+"/", map[string]string{HeaderSecureAccess: tok}, "")
		if got.Header.Get(HeaderSecureAccess) != "" {
			t.Fatal("token reached the sandbox")
		}
	})
	t.Run("10 open sandbox ignores and strips header, keeps app query", func(t *testing.T) {
		got := e.echo(t, "GET", gw+"/open/80/?access_token=app", map[string]string{HeaderSecureAccess: "whatever"}, "")
		if got.Header.Get(HeaderSecureAccess) != "" || got.URI != "/?access_token=app" {
			t.Fatalf("upstream saw %+v", got)
		}
	})
	if n := e.res.touchCount("sec"); n != 3 {
		t.Fatalf("Touch(sec) = %d, want 3 (one per authorised request)", n)
	}
}

func TestForwardedAndStrippedHeaders(t *testing.T) {
	e := newEnv(t)
	a := newBackend(t, "a")
	e.res.add("sb", Target{Addr: addrOf(a), Headers: map[string]string{"X-EXECD-ACCESS-TOKEN": "agent-tok"}})
	hdr := map[string]string{
		"X-Forwarded-For":      "203.0.113.9",
		"X-Forwarded-Host":     "evil.test",
		"X-Forwarded-Proto":    "https",
		"Forwarded":            "for=203.0.113.9",
		"OPEN-SANDBOX-API-KEY": "server-key",
		"X-EXECD-ACCESS-TOKEN": "client-guess",
		"Authorization":        "Bearer app-token",
		"Cookie":               "app=1",
		"X-Custom":             "kept",
	}
	host := "80-sb." + testDomain
	got := e.echo(t, "GET", "http://"+host+"/h", hdr, "")
	h := got.Header
	checks := []struct{ name, got, want string }{
		{"X-Forwarded-For", strings.Join(h.Values("X-Forwarded-For"), ","), "127.0.0.1"},
		{"X-Forwarded-Host", h.Get("X-Forwarded-Host"), host},
		{"X-Forwarded-Proto", h.Get("X-Forwarded-Proto"), "http"},
		{"Forwarded", h.Get("Forwarded"), ""},
		{"OPEN-SANDBOX-API-KEY", h.Get("OPEN-SANDBOX-API-KEY"), ""},
		{"X-EXECD-ACCESS-TOKEN", strings.Join(h.Values("X-EXECD-ACCESS-TOKEN"), ","), "agent-tok"},
		{"Authorization", h.Get("Authorization"), "Bearer app-token"},
		{"Cookie", h.Get("Cookie"), "app=1"},
		{"X-Custom", h.Get("X-Custom"), "kept"},
		{"Host", got.Host, addrOf(a)},
	}
	for _, c := range checks {
		if c.got != c.want {
			t.Errorf("upstream %s = %q, want %q", c.name, c.got, c.want)
		}
	}
	if n := e.res.touchCount("sb"); n != 1 {
		t.Fatalf("Touch = %d, want 1", n)
	}
}

// wsClient returns a websocket HTTP client that reaches the gateway for
// any host name.
func (e *env) wsDial(ctx context.Context, url string) (*websocket.Conn, error) {
	c, _, err := websocket.Dial(ctx, url, &websocket.DialOptions{HTTPClient: e.cl})
	return c, err
}

func wsEcho(ctx context.Context, c *websocket.Conn, msg string) (string, error) {
	if err := c.Write(ctx, websocket.MessageText, []byte(msg)); err != nil {
		return "", err
	}
	_, got, err := c.Read(ctx)
	return string(got), err
}

func TestWebSocket(t *testing.T) {
	e := newEnv(t)
	a := newBackend(t, "a")
	e.res.add("sb", Target{Addr: addrOf(a)})
	e.res.add("sec", Target{Addr: addrOf(a), AccessToken: "tok"})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, url := range []string{
		strings.Replace(e.ts.URL, "http", "ws", 1) + "/sb/8080/ws",
		"ws://8080-sb." + testDomain + "/ws",
		"ws://80-sec." + testDomain + "/ws?access_token=tok",
	} {
		t.Run(url, func(t *testing.T) {
			c, err := e.wsDial(ctx, url)
			if err != nil {
				t.Fatal(err)
			}
			defer c.CloseNow()
			for i := range 3 {
				msg := fmt.Sprintf("hello %d", i)
				got, err := wsEcho(ctx, c, msg)
				if err != nil || got != "a:"+msg {
					t.Fatalf("echo %q = %q, %v", msg, got, err)
				}
			}
			if err := c.Close(websocket.StatusNormalClosure, ""); err != nil {
				t.Fatalf("close: %v", err)
			}
		})
	}
	// Without the token the upgrade is refused with 401.
	_, resp, err := websocket.Dial(ctx, "ws://80-sec."+testDomain+"/ws", &websocket.DialOptions{HTTPClient: e.cl})
	if err == nil || resp == nil || resp.StatusCode != 401 {
		t.Fatalf("dial without token: resp %v, err %v", resp, err)
	}
}

func TestSSEFlushesImmediately(t *testing.T) {
	e := newEnv(t)
	release := make(chan struct{})
	done := make(chan struct{})
	be := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		defer close(done)
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprint(w, "event: first\ndata: 1\n\n")
		w.(http.Flusher).Flush()
		select { // hold the stream open until the client saw event 1
		case <-release:
		case <-r.Context().Done():
			return
		}
		fmt.Fprint(w, "event: second\ndata: 2\n\n")
	}))
	t.Cleanup(be.Close)
	e.res.add("sb", Target{Addr: addrOf(be)})

	req, _ := http.NewRequest("GET", e.ts.URL+"/sb/80/events", nil)
	start := time.Now()
	resp, err := e.cl.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	br := bufio.NewReader(resp.Body)
	lines := make(chan string)
	go func() {
		defer close(lines)
		for {
			l, err := br.ReadString('\n')
			if err != nil {
				return
			}
			lines <- strings.TrimSpace(l)
		}
	}()
	select {
	case l := <-lines:
		if l != "event: first" {
			t.Fatalf("first line %q", l)
		}
	case <-time.After(5 * time.Second):
		close(release)
		t.Fatal("first event not delivered while the backend stream is open (buffered?)")
	}
	lat := time.Since(start)
	select {
	case <-done:
		t.Fatal("backend finished before the first event arrived")
	default:
	}
	t.Logf("first SSE event through the gateway after %v", lat)
	close(release)
	var rest []string
	for l := range lines {
		rest = append(rest, l)
	}
	if want := "data: 1,,event: second,data: 2,"; strings.Join(rest, ",") != want {
		t.Fatalf("rest of stream %q, want %q", strings.Join(rest, ","), want)
	}
}

// An answer that starts while the request body is still arriving (an
// upload that reports progress) goes through whole (web.ServeProxy).
func TestFullDuplex(t *testing.T) {
	e := newEnv(t)
	e.res.add("sb", Target{Addr: addrOf(webtest.DuplexBackend(t))})
	webtest.CheckDuplex(t, e.cl, e.ts.URL+"/sb/80/upload", nil)
}

func TestConcurrentRequests(t *testing.T) {
	e := newEnv(t)
	const sandboxes, n = 4, 200
	for i := range sandboxes {
		e.res.add(fmt.Sprintf("sb%d", i), Target{Addr: addrOf(newBackend(t, fmt.Sprintf("b%d", i)))})
	}
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := range n {
		wg.Go(func() {
			sb := i % sandboxes
			url := fmt.Sprintf("%s/sb%d/80/req/%d", e.ts.URL, sb, i)
			if i%2 == 1 {
				url = fmt.Sprintf("http://80-sb%d.%s/req/%d", sb, testDomain, i)
			}
			resp, err := e.cl.Get(url)
			if err != nil {
				errs <- err
				return
			}
			defer resp.Body.Close()
			var got echo
			if err := json.NewDecoder(resp.Body).Decode(&got); err != nil {
				errs <- fmt.Errorf("request %d: status %d: %v", i, resp.StatusCode, err)
				return
			}
			if got.Backend != fmt.Sprintf("b%d", sb) || got.URI != fmt.Sprintf("/req/%d", i) {
				errs <- fmt.Errorf("request %d routed to %s %s", i, got.Backend, got.URI)
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	total := 0
	for i := range sandboxes {
		total += e.res.touchCount(fmt.Sprintf("sb%d", i))
	}
	if total != n {
		t.Fatalf("Touch called %d times, want %d", total, n)
	}
}

func TestServe(t *testing.T) {
	res := newFakeResolver()
	a := newBackend(t, "a")
	res.add("sb", Target{Addr: addrOf(a)})
	gw := New(Config{}, res, slog.New(slog.NewTextHandler(io.Discard, nil)))
	defer gw.CloseIdleConnections()

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	errc := make(chan error, 1)
	go func() { errc <- gw.ServeListener(ctx, ln) }()
	base := "http://" + ln.Addr().String()

	cl := &http.Client{Transport: &http.Transport{}}
	defer cl.CloseIdleConnections()
	resp, err := cl.Get(base + HealthPath)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("health %d", resp.StatusCode)
	}

	// An open WebSocket must not keep shutdown (or goroutines) alive.
	wctx, wcancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer wcancel()
	c, _, err := websocket.Dial(wctx, "ws://"+ln.Addr().String()+"/sb/80/ws", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer c.CloseNow()
	if got, err := wsEcho(wctx, c, "x"); err != nil || got != "a:x" {
		t.Fatalf("echo = %q, %v", got, err)
	}
	cancel()
	select {
	case err := <-errc:
		if err != nil {
			t.Fatalf("ServeListener: %v", err)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("ServeListener did not return after cancel")
	}
	if _, err := wsEcho(wctx, c, "y"); err == nil {
		t.Fatal("WebSocket still proxied after shutdown")
	}

	// Serve reports a listen failure.
	if err := gw.Serve(context.Background(), "127.0.0.1:-1"); err == nil {
		t.Fatal("Serve on a bad address succeeded")
	}
}

func TestStatusOf(t *testing.T) {
	for _, tc := range []struct {
		err    error
		status int
	}{
		{errdefs.ErrNotFound, 404},
		{fmt.Errorf("x: %w", errdefs.ErrFailedPrecondition), 503},
		{errdefs.ErrUnavailable, 503},
		{errdefs.ErrUnauthenticated, 401},
		{errdefs.Invalid("", "bad"), 400},
		{context.DeadlineExceeded, 504},
		{errors.New("anything"), 502},
	} {
		if got, _ := statusOf(tc.err); got != tc.status {
			t.Errorf("statusOf(%v) = %d, want %d", tc.err, got, tc.status)
		}
	}
}

// newRawUpgradeBackend answers "Upgrade: echo" with 101 and then echoes
// bytes until the client half-closes, then closes.
func newRawUpgradeBackend(t testing.TB) *httptest.Server {
	t.Helper()
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Upgrade") != "echo" {
			http.Error(w, "want Upgrade: echo", 400)
			return
		}
		conn, brw, err := http.NewResponseController(w).Hijack()
		if err != nil {
			return
		}
		defer conn.Close()
		brw.WriteString("HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: echo\r\n\r\n")
		brw.Flush()
		io.Copy(conn, brw) // brw reads its buffer, then conn
	}))
	t.Cleanup(ts.Close)
	return ts
}

func TestUpgradeRelay(t *testing.T) {
	e := newEnv(t)
	e.res.add("sb", Target{Addr: addrOf(newRawUpgradeBackend(t))})
	conn, err := net.DialTimeout("tcp", addrOf(e.ts), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(10 * time.Second))
	// The request and the first bytes of the new protocol in one write:
	// they land in the gateway's read buffer together and must not be lost.
	if _, err := io.WriteString(conn, "GET /sb/80/ HTTP/1.1\r\nHost: gw\r\nConnection: Upgrade\r\nUpgrade: echo\r\n\r\nEARLY|"); err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != 101 || resp.Header.Get(PoweredByHeader) != PoweredBy {
		t.Fatalf("upgrade response %d %v", resp.StatusCode, resp.Header)
	}
	// Then a payload much larger than the relay buffer, both ways at once.
	big := strings.Repeat("0123456789abcdef", 64<<10) // 1 MiB
	werr := make(chan error, 1)
	go func() {
		_, err := io.WriteString(conn, big)
		if err == nil {
			err = conn.(*net.TCPConn).CloseWrite() // half-close: the backend sees EOF and closes
		}
		werr <- err
	}()
	got, err := io.ReadAll(br) // ends when the backend's close reaches us
	if err != nil {
		t.Fatal(err)
	}
	if err := <-werr; err != nil {
		t.Fatal(err)
	}
	if want := "EARLY|" + big; string(got) != want {
		t.Fatalf("echoed %d bytes (prefix %q), want %d", len(got), got[:min(len(got), 16)], len(want))
	}
}

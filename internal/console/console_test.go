package console_test

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"
	"testing/fstest"
	"time"

	"github.com/coder/websocket"
	"go.uber.org/goleak"

	"github.com/moat-sandbox/moat/internal/console"
	"github.com/moat-sandbox/moat/internal/errdefs"
	"github.com/moat-sandbox/moat/internal/tenant"
	"github.com/moat-sandbox/moat/internal/web"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const goodKey = "the-real-api-key-0123456789"

// keys stands in for tenant.Registry.
type keys struct {
	mu      sync.Mutex
	revoked map[string]bool
}

func (k *keys) Authenticate(key string) (tenant.Principal, error) {
	if key != goodKey {
		return tenant.Principal{}, errdefs.WithPublic(errdefs.ErrUnauthenticated, "INVALID_API_KEY", "invalid API key")
	}
	return k.PrincipalOf("k1")
}

func (k *keys) PrincipalOf(id string) (tenant.Principal, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if id != "k1" || k.revoked[id] {
		return tenant.Principal{}, errdefs.WithPublic(errdefs.ErrUnauthenticated, "INVALID_API_KEY", "API key "+id+" has been revoked")
	}
	return tenant.Principal{KeyID: "k1", Tenant: "t1", Role: tenant.RoleOperator}, nil
}

func (k *keys) revoke(id string) {
	k.mu.Lock()
	k.revoked[id] = true
	k.mu.Unlock()
}

// apiStub stands in for the Lifecycle API: it records what reached it and
// authenticates as the API does, through the session resolver when no
// key header is present.
type apiStub struct {
	sessions *console.Sessions
	mu       sync.Mutex
	reqs     []*http.Request
	// principals are the principals of the recorded requests.
	principals []tenant.Principal
}

func (a *apiStub) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	var p tenant.Principal
	ok := false
	if r.Header.Get("OPEN-SANDBOX-API-KEY") == "" && a.sessions != nil {
		var err error
		p, ok, err = a.sessions.ResolveSession(r)
		if err != nil {
			web.WriteJSON(w, http.StatusUnauthorized, web.ErrorBody{Code: "INVALID_API_KEY", Message: err.Error()})
			return
		}
	}
	a.mu.Lock()
	a.reqs = append(a.reqs, r.Clone(context.Background()))
	a.principals = append(a.principals, p)
	a.mu.Unlock()
	if !ok {
		w.WriteHeader(http.StatusUnauthorized)
		return
	}
	if strings.HasSuffix(r.URL.Path, "/ws") {
		c, err := websocket.Accept(w, r, nil)
		if err != nil {
			return
		}
		defer c.CloseNow()
		typ, b, err := c.Read(r.Context())
		if err == nil {
			c.Write(r.Context(), typ, append([]byte("echo:"), b...))
		}
		c.Close(websocket.StatusNormalClosure, "")
		return
	}
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(map[string]string{"path": r.URL.Path, "query": r.URL.RawQuery})
}

func (a *apiStub) last() (*http.Request, tenant.Principal) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if len(a.reqs) == 0 {
		return nil, tenant.Principal{}
	}
	return a.reqs[len(a.reqs)-1], a.principals[len(a.principals)-1]
}

func (a *apiStub) count() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return len(a.reqs)
}

type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *clock) add(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

var app = fstest.MapFS{
	"index.html":        {Data: []byte(`<!doctype html><head><meta name="moat-csrf" content=""><script type="module" src="/console/assets/app-1.js"></script></head>`)},
	"assets/app-1.js":   {Data: []byte(`console.log("app")`)},
	"assets/.hidden.js": {Data: []byte(`secret`)},
}

type harness struct {
	t     *testing.T
	srv   *httptest.Server
	api   *apiStub
	keys  *keys
	clock *clock
}

func newHarness(t *testing.T, mod func(*console.Options, *console.SessionOptions)) *harness {
	t.Helper()
	h := &harness{t: t, keys: &keys{revoked: map[string]bool{}}, clock: &clock{t: time.Date(2026, 12, 3, 10, 0, 0, 0, time.UTC)}}
	sopt := console.SessionOptions{Keys: h.keys, IdleTimeout: 10 * time.Minute, MaxLifetime: time.Hour, Now: h.clock.now}
	opt := console.Options{Assets: app, Log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	if mod != nil {
		mod(&opt, &sopt)
	}
	opt.Sessions = console.NewSessions(sopt)
	h.api = &apiStub{sessions: opt.Sessions}
	opt.API = h.api
	c, err := console.New(opt)
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle("/console", c)
	mux.Handle("/console/", c)
	h.srv = httptest.NewServer(mux)
	t.Cleanup(h.srv.Close)
	return h
}

type resp struct {
	code   int
	body   string
	header http.Header
	json   map[string]any
	cookie *http.Cookie
}

// do sends a request; hdr are name, value pairs.
func (h *harness) do(method, path, body string, hdr ...string) resp {
	h.t.Helper()
	var r io.Reader
	if body != "" {
		r = strings.NewReader(body)
	}
	req, _ := http.NewRequest(method, h.srv.URL+path, r)
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	res, err := (&http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}).Do(req)
	if err != nil {
		h.t.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	out := resp{code: res.StatusCode, body: string(b), header: res.Header}
	json.Unmarshal(b, &out.json)
	for _, c := range res.Cookies() {
		if c.Name == console.CookieName {
			out.cookie = c
		}
	}
	return out
}

// signIn signs in with goodKey and returns the cookie value and CSRF token.
func (h *harness) signIn() (string, string) {
	h.t.Helper()
	r := h.do("POST", "/console/session", `{"apiKey":"`+goodKey+`"}`, "Content-Type", "application/json")
	if r.code != 200 || r.cookie == nil {
		h.t.Fatalf("sign-in: %d %s", r.code, r.body)
	}
	tok, _ := r.json["csrfToken"].(string)
	if tok == "" {
		h.t.Fatalf("sign-in returned no CSRF token: %s", r.body)
	}
	return r.cookie.Value, tok
}

func cookieHdr(id string) string { return console.CookieName + "=" + id }

func TestSignIn(t *testing.T) {
	h := newHarness(t, nil)
	for i, tc := range []struct {
		body, ct, origin string
		code             int
		errCode          string
	}{
		{`{"apiKey":"wrong"}`, "application/json", "", 401, "CONSOLE::INVALID_API_KEY"},
		{`{"apiKey":""}`, "application/json", "", 400, "CONSOLE::INVALID_PARAMETER"},
		{`{"apiKey":`, "application/json", "", 400, "CONSOLE::INVALID_PARAMETER"},
		{"apiKey=" + goodKey, "application/x-www-form-urlencoded", "", 400, "CONSOLE::INVALID_PARAMETER"},
		{`{"apiKey":"` + goodKey + `"}`, "application/json", "http://evil.example", 403, "CONSOLE::ORIGIN_REFUSED"},
	} {
		hdr := []string{"Content-Type", tc.ct}
		if tc.origin != "" {
			hdr = append(hdr, "Origin", tc.origin)
		}
		r := h.do("POST", "/console/session", tc.body, hdr...)
		if r.code != tc.code || r.json["code"] != tc.errCode || r.cookie != nil {
			t.Errorf("%d: got %d %s (cookie %v), want %d %s", i, r.code, r.body, r.cookie, tc.code, tc.errCode)
		}
	}
	// Cross-site by fetch metadata, even without an Origin.
	if r := h.do("POST", "/console/session", `{"apiKey":"`+goodKey+`"}`, "Content-Type", "application/json", "Sec-Fetch-Site", "cross-site"); r.code != 403 {
		t.Errorf("cross-site sign-in: %d", r.code)
	}

	r := h.do("POST", "/console/session", `{"apiKey":"`+goodKey+`"}`, "Content-Type", "application/json", "Origin", h.srv.URL)
	if r.code != 200 || r.cookie == nil {
		t.Fatalf("sign-in: %d %s", r.code, r.body)
	}
	c := r.cookie
	if !c.HttpOnly || c.SameSite != http.SameSiteStrictMode || c.Path != "/console" || c.Secure || c.MaxAge != 3600 {
		t.Errorf("cookie attributes: %+v", c)
	}
	if strings.Contains(c.Value, goodKey) || len(c.Value) < 40 {
		t.Errorf("cookie value %q must be a random id, not the key", c.Value)
	}
	if strings.Contains(r.body, goodKey) {
		t.Errorf("sign-in answer echoes the key: %s", r.body)
	}
	p, _ := r.json["principal"].(map[string]any)
	if p["role"] != "operator" || p["tenant"] != "t1" || p["keyId"] != "k1" {
		t.Errorf("principal: %v", r.json)
	}
	if r.json["csrfToken"] == c.Value {
		t.Error("the CSRF token equals the session id")
	}
}

func TestSecureCookie(t *testing.T) {
	h := newHarness(t, func(o *console.Options, _ *console.SessionOptions) { o.SecureCookie = true })
	r := h.do("POST", "/console/session", `{"apiKey":"`+goodKey+`"}`, "Content-Type", "application/json")
	if r.cookie == nil || !r.cookie.Secure {
		t.Fatalf("cookie not Secure: %+v", r.cookie)
	}
	// Over TLS it is Secure without the option.
	// Without Keys (--insecure-no-auth) any key signs in, as the anonymous admin.
	c, err := console.New(console.Options{API: &apiStub{}, Assets: app, Sessions: console.NewSessions(console.SessionOptions{})})
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewTLSServer(c)
	defer ts.Close()
	res, err := ts.Client().Post(ts.URL+"/console/session", "application/json", strings.NewReader(`{"apiKey":"x"}`))
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if ck := res.Cookies(); len(ck) != 1 || !ck[0].Secure {
		t.Fatalf("TLS cookie: %+v", ck)
	}
}

func TestForwardNeedsSessionAndCSRF(t *testing.T) {
	h := newHarness(t, nil)
	id, tok := h.signIn()
	for i, tc := range []struct {
		method string
		hdr    []string
		code   int
		errC   string
	}{
		{"GET", nil, 401, "CONSOLE::SIGNED_OUT"},
		{"GET", []string{"Cookie", cookieHdr("forged")}, 401, "CONSOLE::SIGNED_OUT"},
		{"GET", []string{console.CSRFHeader, tok}, 401, "CONSOLE::SIGNED_OUT"},
		// Reads need the token too: sandbox pages share this origin.
		{"GET", []string{"Cookie", cookieHdr(id)}, 403, "CONSOLE::CSRF_TOKEN_INVALID"},
		{"POST", []string{"Cookie", cookieHdr(id)}, 403, "CONSOLE::CSRF_TOKEN_INVALID"},
		{"DELETE", []string{"Cookie", cookieHdr(id), console.CSRFHeader, tok + "x"}, 403, "CONSOLE::CSRF_TOKEN_INVALID"},
		{"DELETE", []string{"Cookie", cookieHdr(id), console.CSRFHeader, id}, 403, "CONSOLE::CSRF_TOKEN_INVALID"},
	} {
		before := h.api.count()
		r := h.do(tc.method, "/console/api/v1/sandboxes", "", tc.hdr...)
		if r.code != tc.code || r.json["code"] != tc.errC {
			t.Errorf("%d: %d %s, want %d %s", i, r.code, r.body, tc.code, tc.errC)
		}
		if h.api.count() != before {
			t.Errorf("%d: a refused request reached the API", i)
		}
	}

	r := h.do("GET", "/console/api/v1/sandboxes?state=Running&metadata=a%3Db", "", "Cookie", cookieHdr(id), console.CSRFHeader, tok,
		"Authorization", "Bearer other", "X-EXECD-ACCESS-TOKEN", "forged", "OPEN-SANDBOX-API-KEY", "forged")
	if r.code != 200 || r.json["path"] != "/v1/sandboxes" || r.json["query"] != "state=Running&metadata=a%3Db" {
		t.Fatalf("forwarded: %d %s", r.code, r.body)
	}
	got, p := h.api.last()
	if p.KeyID != "k1" || p.Tenant != "t1" || p.Role != tenant.RoleOperator {
		t.Errorf("the API did not see the session's principal: %+v", p)
	}
	// The browser's credentials never reach the API: it authenticates
	// the call by the session alone (a forged key header is dropped).
	for _, hd := range []string{"Cookie", console.CSRFHeader, "Authorization", "X-EXECD-ACCESS-TOKEN", "OPEN-SANDBOX-API-KEY", "X-API-Key"} {
		if got.Header.Get(hd) != "" {
			t.Errorf("%s reached the API: %q", hd, got.Header.Get(hd))
		}
	}
	if csp := r.header.Get("Content-Security-Policy"); !strings.Contains(csp, "sandbox") {
		t.Errorf("forwarded answers must be sandboxed documents, CSP %q", csp)
	}
	// Escaped path elements stay escaped.
	r = h.do("GET", "/console/api/v1/sandboxes/a%2Fb/endpoints/80", "", "Cookie", cookieHdr(id), console.CSRFHeader, tok)
	if got, _ := h.api.last(); r.code != 200 || got.URL.EscapedPath() != "/v1/sandboxes/a%2Fb/endpoints/80" {
		t.Errorf("escaped path: %d %q", r.code, got.URL.EscapedPath())
	}
}

func TestSessionInfoAndSignOut(t *testing.T) {
	h := newHarness(t, nil)
	id, tok := h.signIn()
	auth := []string{"Cookie", cookieHdr(id), console.CSRFHeader, tok}
	r := h.do("GET", "/console/session", "", auth...)
	if p, _ := r.json["principal"].(map[string]any); r.code != 200 || p["role"] != "operator" || r.json["csrfToken"] != nil {
		t.Fatalf("session info: %d %s", r.code, r.body)
	}
	if r := h.do("DELETE", "/console/session", "", "Cookie", cookieHdr(id)); r.code != 403 {
		t.Fatalf("sign-out without CSRF: %d", r.code)
	}
	r = h.do("DELETE", "/console/session", "", auth...)
	if r.code != 204 || r.cookie == nil || r.cookie.MaxAge >= 0 {
		t.Fatalf("sign-out: %d %+v", r.code, r.cookie)
	}
	// The old cookie and token are dead server-side.
	if r := h.do("GET", "/console/api/v1/sandboxes", "", auth...); r.code != 401 {
		t.Fatalf("after sign-out: %d %s", r.code, r.body)
	}
	if r := h.do("PUT", "/console/session", "", auth...); r.code != 405 || r.header.Get("Allow") == "" {
		t.Fatalf("PUT /console/session: %d", r.code)
	}
}

func TestSessionExpiry(t *testing.T) {
	h := newHarness(t, nil)
	id, tok := h.signIn()
	auth := []string{"Cookie", cookieHdr(id), console.CSRFHeader, tok}
	// Used every 9 minutes, it outlives the 10-minute idle timeout...
	for range 6 {
		h.clock.add(9 * time.Minute)
		if r := h.do("GET", "/console/api/v1/x", "", auth...); r.code != 200 {
			t.Fatalf("active session refused at %v: %d", h.clock.now(), r.code)
		}
	}
	// ...but not its 1-hour lifetime (54 minutes so far).
	h.clock.add(7 * time.Minute)
	if r := h.do("GET", "/console/api/v1/x", "", auth...); r.code != 401 {
		t.Fatalf("session past its lifetime: %d", r.code)
	}
	id, tok = h.signIn()
	h.clock.add(11 * time.Minute)
	if r := h.do("GET", "/console/api/v1/x", "", "Cookie", cookieHdr(id), console.CSRFHeader, tok); r.code != 401 {
		t.Fatalf("idle session: %d", r.code)
	}
}

func TestRevokedKeyEndsSession(t *testing.T) {
	h := newHarness(t, nil)
	id, tok := h.signIn()
	auth := []string{"Cookie", cookieHdr(id), console.CSRFHeader, tok}
	if r := h.do("GET", "/console/api/v1/sandboxes", "", auth...); r.code != 200 {
		t.Fatalf("before revocation: %d", r.code)
	}
	h.keys.revoke("k1")
	// The next call is refused with the registry's reason, and the
	// session is gone (sign in again, which the revoked key cannot).
	if r := h.do("GET", "/console/api/v1/sandboxes", "", auth...); r.code != 401 || !strings.Contains(r.body, "revoked") {
		t.Fatalf("after revocation: %d %s", r.code, r.body)
	}
	if r := h.do("GET", "/console/session", "", auth...); r.code != 401 || r.json["code"] != "CONSOLE::SIGNED_OUT" {
		t.Fatalf("session survived a revoked key: %d %s", r.code, r.body)
	}
	if r := h.do("POST", "/console/session", `{"apiKey":"`+goodKey+`"}`, "Content-Type", "application/json"); r.code != 401 {
		t.Fatalf("a revoked key signed in: %d", r.code)
	}
}

func TestSessionInfoFollowsRevocation(t *testing.T) {
	h := newHarness(t, nil)
	id, tok := h.signIn()
	h.keys.revoke("k1")
	if r := h.do("GET", "/console/session", "", "Cookie", cookieHdr(id), console.CSRFHeader, tok); r.code != 401 {
		t.Fatalf("session info of a revoked key: %d %s", r.code, r.body)
	}
}

func TestResolveSessionIgnoresOtherRequests(t *testing.T) {
	s := console.NewSessions(console.SessionOptions{Keys: &keys{revoked: map[string]bool{}}})
	// A request from outside, even with a console cookie, has no session
	// in its context: the API then asks for a key.
	r := httptest.NewRequest("GET", "/v1/sandboxes", nil)
	r.Header.Set("Cookie", console.CookieName+"=whatever")
	if _, ok, err := s.ResolveSession(r); ok || err != nil {
		t.Fatalf("ResolveSession of a plain request: ok=%v err=%v", ok, err)
	}
}

func TestNewSignInReplacesSession(t *testing.T) {
	h := newHarness(t, nil)
	id, tok := h.signIn()
	r := h.do("POST", "/console/session", `{"apiKey":"`+goodKey+`"}`, "Content-Type", "application/json", "Cookie", cookieHdr(id))
	if r.code != 200 || r.cookie.Value == id {
		t.Fatalf("re-sign-in: %d", r.code)
	}
	if r := h.do("GET", "/console/api/v1/x", "", "Cookie", cookieHdr(id), console.CSRFHeader, tok); r.code != 401 {
		t.Fatalf("the replaced session still works: %d", r.code)
	}
}

func TestMaxSessions(t *testing.T) {
	h := newHarness(t, func(_ *console.Options, so *console.SessionOptions) { so.MaxSessions = 2 })
	h.signIn()
	h.signIn()
	r := h.do("POST", "/console/session", `{"apiKey":"`+goodKey+`"}`, "Content-Type", "application/json")
	if r.code != 503 || r.json["code"] != "CONSOLE::TOO_MANY_SESSIONS" {
		t.Fatalf("third session: %d %s", r.code, r.body)
	}
	h.clock.add(11 * time.Minute) // both idle out
	h.signIn()
}

func TestWebSocketTicket(t *testing.T) {
	h := newHarness(t, nil)
	id, tok := h.signIn()
	ticket := func() string {
		r := h.do("POST", "/console/session/ticket", "", "Cookie", cookieHdr(id), console.CSRFHeader, tok)
		if r.code != 200 || r.json["ticket"] == "" {
			t.Fatalf("ticket: %d %s", r.code, r.body)
		}
		return r.json["ticket"].(string)
	}
	if r := h.do("POST", "/console/session/ticket", "", "Cookie", cookieHdr(id)); r.code != 403 {
		t.Fatalf("ticket without CSRF: %d", r.code)
	}
	wsURL := "ws" + strings.TrimPrefix(h.srv.URL, "http") + "/console/api/v1/sandboxes/s1/proxy/44772/pty/p1/ws"
	dial := func(tk, origin, cookie string) (*websocket.Conn, int) {
		hdr := http.Header{}
		if origin != "" {
			hdr.Set("Origin", origin)
		}
		if cookie != "" {
			hdr.Set("Cookie", cookieHdr(cookie))
		}
		u := wsURL
		if tk != "" {
			u += "?since=0&ticket=" + url.QueryEscape(tk)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		c, res, err := websocket.Dial(ctx, u, &websocket.DialOptions{HTTPHeader: hdr})
		if err != nil {
			if res == nil {
				t.Fatal(err)
			}
			return nil, res.StatusCode
		}
		return c, 101
	}
	tk := ticket()
	for i, tc := range []struct{ tk, origin, cookie string }{
		{"", h.srv.URL, id},                // no ticket
		{tk + "x", h.srv.URL, id},          // unknown ticket
		{ticket(), "http://evil.test", id}, // foreign origin
		{ticket(), "", id},                 // no origin
		{ticket(), h.srv.URL, ""},          // no cookie
	} {
		if c, code := dial(tc.tk, tc.origin, tc.cookie); code != 403 && code != 401 {
			c.CloseNow()
			t.Errorf("%d: handshake %d, want refused", i, code)
		}
	}
	// A ticket is bound to its session.
	other, _ := h.signIn()
	if c, code := dial(tk, h.srv.URL, other); code == 101 {
		c.CloseNow()
		t.Fatal("a ticket worked with another session's cookie")
	}
	tk = ticket()
	c, code := dial(tk, h.srv.URL, id)
	if code != 101 {
		t.Fatalf("handshake: %d", code)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := c.Write(ctx, websocket.MessageText, []byte("hi")); err != nil {
		t.Fatal(err)
	}
	_, b, err := c.Read(ctx)
	if err != nil || string(b) != "echo:hi" {
		t.Fatalf("echo: %q %v", b, err)
	}
	c.Close(websocket.StatusNormalClosure, "")
	got, p := h.api.last()
	if got.URL.Query().Get("ticket") != "" || got.URL.Query().Get("since") != "0" || p.KeyID != "k1" {
		t.Errorf("forwarded handshake: %s %v %+v", got.URL, got.Header, p)
	}
	// Single use.
	if c, code := dial(tk, h.srv.URL, id); code == 101 {
		c.CloseNow()
		t.Fatal("a ticket was accepted twice")
	}
	// Expired.
	tk = ticket()
	h.clock.add(31 * time.Second)
	if c, code := dial(tk, h.srv.URL, id); code == 101 {
		c.CloseNow()
		t.Fatal("an expired ticket was accepted")
	}
}

func TestIndexCarriesTokenOnlyOnNavigation(t *testing.T) {
	h := newHarness(t, nil)
	id, tok := h.signIn()
	nav := []string{"Sec-Fetch-Dest", "document", "Sec-Fetch-Mode", "navigate", "Sec-Fetch-Site", "same-origin"}
	for i, tc := range []struct {
		hdr  []string
		want bool
	}{
		{append([]string{"Cookie", cookieHdr(id)}, nav...), true},
		{nav, false}, // no session
		{[]string{"Cookie", cookieHdr(id)}, false},
		{[]string{"Cookie", cookieHdr(id), "Sec-Fetch-Dest", "empty", "Sec-Fetch-Mode", "cors"}, false},      // fetch()
		{[]string{"Cookie", cookieHdr(id), "Sec-Fetch-Dest", "iframe", "Sec-Fetch-Mode", "navigate"}, false}, // framed
	} {
		r := h.do("GET", "/console/", "", tc.hdr...)
		if r.code != 200 || !strings.Contains(r.body, `<script type="module"`) {
			t.Fatalf("%d: index: %d %s", i, r.code, r.body)
		}
		if has := strings.Contains(r.body, `content="`+tok+`"`); has != tc.want {
			t.Errorf("%d: token in page %v, want %v: %s", i, has, tc.want, r.body)
		}
		if !tc.want && !strings.Contains(r.body, `<meta name="moat-csrf" content="">`) {
			t.Errorf("%d: %s", i, r.body)
		}
	}
	r := h.do("GET", "/console/", "")
	for k, want := range map[string]string{
		"Content-Security-Policy":    "script-src 'self'",
		"X-Frame-Options":            "DENY",
		"Cross-Origin-Opener-Policy": "same-origin",
		"X-Content-Type-Options":     "nosniff",
		"Cache-Control":              "no-store",
		"Referrer-Policy":            "no-referrer",
	} {
		if !strings.Contains(r.header.Get(k), want) {
			t.Errorf("%s = %q, want %q", k, r.header.Get(k), want)
		}
	}
	if csp := r.header.Get("Content-Security-Policy"); !strings.Contains(csp, "frame-ancestors 'none'") || strings.Contains(csp, "unsafe-eval") {
		t.Errorf("CSP %q", csp)
	}
	if r := h.do("GET", "/console", ""); r.code != 301 || r.header.Get("Location") != "/console/" {
		t.Errorf("/console: %d %v", r.code, r.header)
	}
}

func TestStaticAssets(t *testing.T) {
	h := newHarness(t, nil)
	r := h.do("GET", "/console/assets/app-1.js", "")
	if r.code != 200 || r.body != `console.log("app")` || !strings.Contains(r.header.Get("Content-Type"), "javascript") ||
		!strings.Contains(r.header.Get("Cache-Control"), "immutable") {
		t.Fatalf("asset: %d %v %q", r.code, r.header, r.body)
	}
	for _, p := range []string{"/console/assets/.hidden.js", "/console/assets/nope.js", "/console/assets", "/console/assets/..%2f..%2fgo.mod", "/console/%2e%2e/x"} {
		if r := h.do("GET", p, ""); r.code != 404 && r.code != 301 {
			t.Errorf("%s: %d %s", p, r.code, r.body)
		} else if r.code == 404 && r.json["code"] != "CONSOLE::NOT_FOUND" {
			t.Errorf("%s: %s", p, r.body)
		}
	}
	if r := h.do("POST", "/console/assets/app-1.js", "x"); r.code != 405 {
		t.Errorf("POST asset: %d", r.code)
	}
}

func TestNotBuilt(t *testing.T) {
	h := newHarness(t, func(o *console.Options, _ *console.SessionOptions) { o.Assets = fstest.MapFS{} })
	r := h.do("GET", "/console/", "")
	if r.code != 503 || !strings.Contains(r.body, "make build") {
		t.Fatalf("unbuilt console: %d %s", r.code, r.body)
	}
	// The API gateway works without the app.
	id, tok := h.signIn()
	if r := h.do("GET", "/console/api/v1/sandboxes", "", "Cookie", cookieHdr(id), console.CSRFHeader, tok); r.code != 200 {
		t.Fatalf("gateway: %d", r.code)
	}
	if _, err := console.New(console.Options{API: &apiStub{}, Sessions: console.NewSessions(console.SessionOptions{}),
		Assets: fstest.MapFS{"index.html": {Data: []byte("<html>no meta</html>")}}}); err == nil {
		t.Fatal("an index.html without the CSRF meta tag was accepted")
	}
}

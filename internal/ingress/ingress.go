// Package ingress is moat's ingress gateway: one public listener that
// routes HTTP, SSE and WebSocket traffic to ports inside sandboxes, the
// counterpart of OpenSandbox's components/ingress.
//
// A request names its sandbox and port in one of three ways, tried in this
// order (the first form present wins; a malformed one is an error, it never
// falls through):
//
//  1. header: "OpenSandbox-Ingress-To: <id>-<port>" (split at the last '-'),
//     or E2B's "E2b-Sandbox-Id" and "E2b-Sandbox-Port" on a localhost, IP or
//     sandbox.* host (errors then in E2B's edge bodies);
//  2. host:   "<port>-<id>.<Domain>", or upstream's "<id>-<port>.<Domain>";
//  3. path:   "/<id>/<port>/<rest>", proxied as "/<rest>" (query kept).
//
// Header and host routing keep the request path as is. "/status.ok" is the
// health endpoint when neither header nor host routing applies.
//
// A sandbox with a secure-access token (Target.AccessToken) requires it in
// the OpenSandbox-Secure-Access header or the access_token query parameter;
// both are removed before the request reaches the sandbox. A signed route
// (OSEP-0011, sign.go) whose signature and deadline verify is accepted
// instead of the token; a signed route that does not verify is refused
// (401) whatever the sandbox.
//
// Path routing puts every sandbox on the gateway's own origin, so browser
// cookies and storage are shared between sandboxes; host routing gives each
// sandbox port its own origin and is the mode to expose to browsers.
package ingress

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"strings"
	"sync"
	"time"

	"github.com/moat-sandbox/moat/internal/errdefs"
	"github.com/moat-sandbox/moat/internal/web"
)

// Public error codes of the gateway.
const (
	codeInvalidRoute = "INGRESS::INVALID_ROUTE"        // 400
	codeUnauthorized = "INGRESS::UNAUTHORIZED"         // 401
	codeNotFound     = "INGRESS::SANDBOX_NOT_FOUND"    // 404
	codeNotRunning   = "INGRESS::SANDBOX_NOT_RUNNING"  // 503
	codeBadGateway   = "INGRESS::UPSTREAM_UNREACHABLE" // 502
)

// PoweredByHeader is added to every gateway response; its value is
// PoweredBy. Upstream sends the same header with "OpenSandbox-ingress".
const (
	PoweredByHeader = "Reverse-Proxy-Server-Powerby"
	PoweredBy       = "moat-ingress"
)

// HealthPath is the gateway's health endpoint.
const HealthPath = "/status.ok"

// Target is where a sandbox port is reached.
type Target struct {
	// Addr is the upstream "ip:port", dialled over plain TCP.
	Addr string
	// AccessToken is the sandbox's secure-access token; "" means the port
	// is open to anyone who can reach the gateway.
	AccessToken string
	// Headers are set on every upstream request, replacing client values
	// (e.g. the agent token for the agent port). The resolver decides who
	// may use them: whoever passes the gateway's checks gets them.
	Headers map[string]string
}

// Resolver maps a sandbox port to its upstream. It is called on every
// request and from many goroutines at once, so it must be safe for
// concurrent use and cheap (an in-memory lookup).
type Resolver interface {
	// Resolve returns the target of port in sandbox sandboxID. Errors are
	// classified: errdefs.ErrNotFound (no such sandbox) answers 404,
	// errdefs.ErrFailedPrecondition or ErrUnavailable (not running) 503,
	// anything else 502. The error text is logged, never sent.
	Resolve(ctx context.Context, sandboxID string, port int) (Target, error)
	// Touch records an access for renew-on-access. It is called once per
	// authorised request, before proxying, and must not block: the
	// resolver throttles and persists on its own.
	Touch(ctx context.Context, sandboxID string)
}

// Waker is implemented by resolvers whose sandboxes may be paused for
// idleness. Wake is called once per authorised request, before proxying:
// it returns once the sandbox can answer, or the error to answer instead
// (classified as for Resolve; a Retry-After it carries is sent). done is
// called once the request is over.
type Waker interface {
	Wake(ctx context.Context, sandboxID string) (done func(), err error)
}

// Config configures a Gateway. The zero value is usable: host routing off,
// a 5 s dial timeout.
type Config struct {
	// Domain enables host routing for "<port>-<id>.<Domain>" and
	// "<id>-<port>.<Domain>", e.g. "sandbox.example.test" (case-insensitive,
	// no leading dot). Empty disables host routing.
	Domain string
	// DialTimeout bounds connecting to a sandbox. Default 5 s.
	DialTimeout time.Duration
	// MaxIdleConnsPerHost bounds kept-alive upstream connections per
	// sandbox port. Default 64.
	MaxIdleConnsPerHost int
	// Signer verifies signed routes (OSEP-0011). Nil: signed routes are
	// refused (401).
	Signer *Signer
	// SignedOnly refuses every route without a valid signature (401): the
	// gateway moat serve mounts on its API listener under /ingress serves
	// signed endpoints only, so that it opens no port the API key or the
	// server proxy's rules would not.
	SignedOnly bool
	// Credentials, if set, scopes requests that carry a moat API key to
	// the key's tenant (another tenant's sandbox is not found). Requests
	// without one are routed as before: the gateway is the data plane.
	Credentials Credentials
}

// Credentials scopes gateway requests by the moat API key they carry
// (internal/httpapi's Server.ScopeRequest).
type Credentials interface {
	// ScopeRequest returns the context to resolve r's route with: r's
	// context carrying the principal of r's API key, or r's context
	// unchanged when r carries none. An invalid, revoked or expired key is
	// an errdefs.ErrUnauthenticated error (401).
	ScopeRequest(r *http.Request) (context.Context, error)
}

// Validate reports a bad configuration.
func (c Config) Validate() error {
	d := c.Domain
	if d != "" && (strings.HasPrefix(d, ".") || strings.HasSuffix(d, ".") || strings.ContainsAny(d, "/:@ ") || !strings.Contains(d, ".")) {
		return fmt.Errorf("ingress domain %q: want a DNS name like sandbox.example.com: %w", d, errdefs.ErrInvalidArgument)
	}
	if c.DialTimeout < 0 || c.MaxIdleConnsPerHost < 0 {
		return fmt.Errorf("ingress: negative timeout or limit: %w", errdefs.ErrInvalidArgument)
	}
	return nil
}

// Gateway is the ingress http.Handler. It is safe for concurrent use.
type Gateway struct {
	domain     string
	signedOnly bool
	signer     *Signer
	creds      Credentials
	res        Resolver
	log        *slog.Logger
	web        *web.Adapter
	rp         *httputil.ReverseProxy
	h          http.Handler
}

// New returns a gateway routing through r. cfg should have passed
// Validate; the domain is lower-cased.
func New(cfg Config, r Resolver, log *slog.Logger) *Gateway {
	if log == nil {
		log = slog.Default()
	}
	if cfg.DialTimeout == 0 {
		cfg.DialTimeout = 5 * time.Second
	}
	if cfg.MaxIdleConnsPerHost == 0 {
		cfg.MaxIdleConnsPerHost = 64
	}
	g := &Gateway{
		domain:     strings.ToLower(cfg.Domain),
		signedOnly: cfg.SignedOnly,
		signer:     cfg.Signer,
		creds:      cfg.Credentials,
		res:        r,
		log:        log,
		web:        &web.Adapter{Log: log, Codes: statusOf},
	}
	g.rp = &httputil.ReverseProxy{
		Rewrite:       g.rewrite,
		FlushInterval: -1, // SSE and streamed bodies go out as produced
		Transport: &http.Transport{
			Proxy:                 nil, // never an environment proxy: targets are sandbox IPs
			DialContext:           (&net.Dialer{Timeout: cfg.DialTimeout, KeepAlive: 30 * time.Second}).DialContext,
			MaxIdleConns:          1024,
			MaxIdleConnsPerHost:   cfg.MaxIdleConnsPerHost,
			IdleConnTimeout:       90 * time.Second,
			ResponseHeaderTimeout: 0, // long polls and slow apps answer late
			ExpectContinueTimeout: time.Second,
		},
		ModifyResponse: func(resp *http.Response) error {
			// The gateway sets its own value on the ResponseWriter.
			resp.Header.Del(PoweredByHeader)
			return nil
		},
		BufferPool:   &bufferPool{},
		ErrorLog:     slog.NewLogLogger(log.Handler(), slog.LevelDebug),
		ErrorHandler: g.proxyError,
	}
	g.h = web.Recover(log, http.HandlerFunc(g.serve))
	return g
}

// errBadGateway marks a failed upstream exchange (dial, reset, bad reply).
var errBadGateway = errors.New("bad gateway")

// statusOf maps error classes to the gateway's statuses: upstream's 404
// for a missing sandbox, 503 when it is not running, 502 for the rest.
func statusOf(err error) (int, string) {
	switch {
	case errors.Is(err, errdefs.ErrInvalidArgument):
		return http.StatusBadRequest, codeInvalidRoute
	case errors.Is(err, errdefs.ErrUnauthenticated):
		return http.StatusUnauthorized, codeUnauthorized
	case errors.Is(err, errdefs.ErrNotFound):
		return http.StatusNotFound, codeNotFound
	case errors.Is(err, errdefs.ErrFailedPrecondition), errors.Is(err, errdefs.ErrUnavailable):
		return http.StatusServiceUnavailable, codeNotRunning
	case errors.Is(err, errdefs.ErrDeadlineExceeded), errors.Is(err, context.DeadlineExceeded):
		return http.StatusGatewayTimeout, "INGRESS::UPSTREAM_TIMEOUT"
	default:
		return http.StatusBadGateway, codeBadGateway
	}
}

// ServeHTTP routes and proxies one request.
func (g *Gateway) ServeHTTP(w http.ResponseWriter, r *http.Request) { g.h.ServeHTTP(w, r) }

// proxied is what serve hands to rewrite through the request context.
type proxied struct {
	t     Target
	rt    route
	query string // the upstream raw query
}

type proxiedKey struct{}

func (g *Gateway) serve(w http.ResponseWriter, r *http.Request) {
	w.Header().Set(PoweredByHeader, PoweredBy)
	if r.URL.Path == HealthPath && len(r.Header.Values(HeaderIngressTo)) == 0 {
		if _, isHost := hostLabel(r.Host, g.domain); !isHost {
			w.Header().Set("Content-Type", "text/plain; charset=utf-8")
			w.Write([]byte("OK"))
			return
		}
	}
	rt, err := parseRoute(r, g.domain)
	if err != nil {
		g.fail(w, r, rt, err)
		return
	}
	if rt.signed == nil && g.signedOnly {
		g.web.WriteError(w, r, errdefs.WithPublic(fmt.Errorf("unsigned route to %q: %w", rt.cands[0].id, errdefs.ErrUnauthenticated),
			codeUnauthorized, "only signed routes are served here (GET /v1/sandboxes/{id}/endpoints/{port}?expires=...)"))
		return
	}
	// A signed route is checked before the sandbox is looked up, so a bad
	// signature reveals nothing about which sandboxes exist. A valid one
	// stands in for the secure-access token.
	if rt.signed != nil {
		c := rt.cands[0]
		if g.signer == nil {
			g.fail(w, r, rt, errdefs.WithPublic(fmt.Errorf("signed route to %q: no signing keys: %w", c.id, errdefs.ErrUnauthenticated),
				codeUnauthorized, "signed routes are not enabled on this gateway"))
			return
		}
		if err := g.signer.Verify(c.id, c.port, rt.signed.expiresB36, rt.signed.signature); err != nil {
			g.fail(w, r, rt, err)
			return
		}
	}
	ctx := r.Context()
	if g.creds != nil {
		if ctx, err = g.creds.ScopeRequest(r); err != nil {
			g.fail(w, r, rt, err)
			return
		}
	}
	id, t, err := g.resolve(ctx, rt)
	if err != nil {
		g.fail(w, r, rt, err)
		return
	}
	p := proxied{t: t, rt: rt, query: r.URL.RawQuery}
	if t.AccessToken != "" && rt.signed == nil {
		q, ok := authorise(r, t.AccessToken)
		if !ok {
			g.fail(w, r, rt, errdefs.WithPublic(fmt.Errorf("sandbox %q: secure access: %w", id, errdefs.ErrUnauthenticated),
				codeUnauthorized, "this sandbox requires a valid "+HeaderSecureAccess+" header or "+QueryAccessToken+" parameter"))
			return
		}
		p.query = q
	}
	if wk, ok := g.res.(Waker); ok {
		done, err := wk.Wake(ctx, id)
		if err != nil {
			g.fail(w, r, rt, err)
			return
		}
		defer done()
	}
	g.res.Touch(r.Context(), id)
	if r.Header.Get("Upgrade") != "" {
		w = upgradeWriter{w}
	}
	web.ServeProxy(g.rp, w, r.WithContext(context.WithValue(r.Context(), proxiedKey{}, p)))
}

// resolve tries the route's candidates in order; a later one only when
// the earlier sandbox does not exist. Errors carry a public message.
func (g *Gateway) resolve(ctx context.Context, rt route) (string, Target, error) {
	var err error
	for i, c := range rt.cands {
		var t Target
		t, err = g.res.Resolve(ctx, c.id, c.port)
		if err == nil {
			if t.Addr == "" {
				return c.id, Target{}, errdefs.WithPublic(fmt.Errorf("sandbox %q port %d: no address: %w", c.id, c.port, errdefs.ErrUnavailable),
					codeNotRunning, "the sandbox is not running")
			}
			return c.id, t, nil
		}
		if errdefs.IsNotFound(err) && i < len(rt.cands)-1 {
			continue
		}
		err = fmt.Errorf("resolve sandbox %q port %d (%s route): %w", c.id, c.port, rt.mode, err)
		break
	}
	status, code := statusOf(err)
	msg := "the sandbox port cannot be reached"
	switch status {
	case http.StatusNotFound:
		msg = "sandbox not found"
	case http.StatusServiceUnavailable:
		msg = "the sandbox is not running"
	case http.StatusBadRequest:
		msg = "invalid sandbox route"
	}
	return "", Target{}, errdefs.WithPublic(err, code, msg)
}

// authorise checks the secure-access token from the header or the query.
// It returns the upstream raw query: with access_token removed when that
// was the credential (an app parameter of the same name is otherwise kept).
// Both tokens are hashed first so the comparison is constant-time in the
// length as well.
func authorise(r *http.Request, want string) (string, bool) {
	wh := sha256.Sum256([]byte(want))
	match := func(got string) bool {
		gh := sha256.Sum256([]byte(got))
		return subtle.ConstantTimeCompare(gh[:], wh[:]) == 1
	}
	ok := false
	for _, v := range r.Header.Values(HeaderSecureAccess) {
		ok = ok || match(v)
	}
	q := r.URL.RawQuery
	if rest, vals := stripQueryParam(q, QueryAccessToken); len(vals) > 0 {
		for _, v := range vals {
			if match(v) {
				ok, q = true, rest
			}
		}
	}
	return q, ok
}

// rewrite builds the upstream request. ReverseProxy has already removed
// hop-by-hop and X-Forwarded-* headers from Out; the deletes below repeat
// that for the forwarding headers so the invariant is visible here.
func (g *Gateway) rewrite(pr *httputil.ProxyRequest) {
	p := pr.In.Context().Value(proxiedKey{}).(proxied)
	out := pr.Out
	out.URL.Scheme = "http"
	out.URL.Host = p.t.Addr
	if p.rt.mode == modePath {
		out.URL.Path, out.URL.RawPath = p.rt.path, p.rt.rawPath
	}
	out.URL.RawQuery = p.query
	out.Host = p.t.Addr
	// Gateway credentials and routing never reach the sandbox. The
	// Authorization and Cookie headers do: they belong to the sandbox's
	// own application.
	for _, h := range []string{HeaderIngressTo, HeaderSecureAccess, "OPEN-SANDBOX-API-KEY", "X-API-Key",
		"X-Forwarded-For", "X-Forwarded-Host", "X-Forwarded-Proto", "Forwarded"} {
		out.Header.Del(h)
	}
	for k, v := range p.t.Headers {
		out.Header.Set(k, v)
	}
	pr.SetXForwarded()
}

// fail answers a request the gateway could not route or proxy: in the
// gateway's envelope, or in E2B's edge bodies for a route by E2B's
// headers (502 with "The sandbox was not found" for a sandbox that is
// unknown or not running, "... port is not open" when nothing answers).
func (g *Gateway) fail(w http.ResponseWriter, r *http.Request, rt route, err error) {
	if !rt.e2b {
		g.web.WriteError(w, r, err)
		return
	}
	g.log.Debug("ingress: e2b route failed", "err", err)
	var id string
	var port int
	if len(rt.cands) > 0 {
		id, port = rt.cands[0].id, rt.cands[0].port
	}
	status, _ := statusOf(err)
	body := map[string]any{"sandboxId": id, "code": status, "message": "the sandbox port cannot be reached"}
	d, waking := errdefs.RetryAfterOf(err)
	switch {
	case waking && status == http.StatusServiceUnavailable:
		w.Header().Set("Retry-After", web.RetryAfter(d))
		body["message"] = "the sandbox is waking up"
	case errors.Is(err, errBadGateway):
		status = http.StatusBadGateway
		body["message"], body["port"] = "The sandbox is running but port is not open", port
	case status == http.StatusNotFound || status == http.StatusServiceUnavailable:
		status = http.StatusBadGateway
		body["message"] = "The sandbox was not found"
	default:
		if p, ok := errdefs.PublicOf(err); ok && p.Message != "" {
			body["message"] = p.Message
		}
		if id == "" {
			delete(body, "sandboxId")
		}
	}
	body["code"] = status
	web.WriteJSON(w, status, body)
}

// proxyError answers a failed upstream exchange with a 502 envelope.
func (g *Gateway) proxyError(w http.ResponseWriter, r *http.Request, err error) {
	if errors.Is(err, context.Canceled) && r.Context().Err() != nil {
		return // the client went away
	}
	p, _ := r.Context().Value(proxiedKey{}).(proxied)
	g.fail(w, r, p.rt, errdefs.WithPublic(fmt.Errorf("proxy to %s: %w: %w", p.t.Addr, err, errBadGateway),
		codeBadGateway, "the sandbox port is not reachable"))
}

// Serve listens on addr and serves the gateway until ctx ends, then shuts
// down gracefully (10 s, then connections are closed).
func (g *Gateway) Serve(ctx context.Context, addr string) error {
	var lc net.ListenConfig
	ln, err := lc.Listen(ctx, "tcp", addr)
	if err != nil {
		return fmt.Errorf("ingress listen %s: %w", addr, err)
	}
	return g.ServeListener(ctx, ln)
}

// ServeListener is Serve on an existing listener, which it closes.
func (g *Gateway) ServeListener(ctx context.Context, ln net.Listener) error {
	// Upgraded (WebSocket) connections outlive Shutdown, which does not
	// track hijacked connections; ReverseProxy closes them when their
	// request context ends. So once Shutdown is over every request
	// context is ended, and ServeListener returns only when the upgraded
	// requests' handlers have (their client connections closed).
	var upgrades sync.WaitGroup
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Upgrade") != "" {
			upgrades.Add(1)
			defer upgrades.Done()
		}
		g.ServeHTTP(w, r)
	})
	hs := web.NewServer(ln.Addr().String(), h, g.log)
	base, cancelBase := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelBase()
	hs.BaseContext = func(net.Listener) context.Context { return base }
	g.log.Info("ingress serving", "addr", ln.Addr().String(), "domain", g.domain)
	err := web.ServeUntil(ctx, hs, ln)
	cancelBase()
	done := make(chan struct{})
	go func() { upgrades.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		g.log.Warn("ingress: upgraded connections still open after shutdown")
	}
	return err
}

// CloseIdleConnections closes kept-alive upstream connections (for tests
// and when sandboxes are torn down in bulk).
func (g *Gateway) CloseIdleConnections() {
	g.rp.Transport.(*http.Transport).CloseIdleConnections()
}

// bufferPool recycles ReverseProxy's response copy buffers (32 KiB each,
// otherwise allocated per request).
type bufferPool struct{ p sync.Pool }

func (b *bufferPool) Get() []byte {
	if v, ok := b.p.Get().(*[]byte); ok {
		return *v
	}
	return make([]byte, 32<<10)
}

func (b *bufferPool) Put(buf []byte) { b.p.Put(&buf) }

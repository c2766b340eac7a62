package httpapi

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/moat-sandbox/moat/internal/agentproto"
	"github.com/moat-sandbox/moat/internal/errdefs"
	agentproxy "github.com/moat-sandbox/moat/internal/execd/proxy"
	"github.com/moat-sandbox/moat/internal/execd/wire"
	"github.com/moat-sandbox/moat/internal/lifecycle/idle"
	"github.com/moat-sandbox/moat/internal/sandbox"
	"github.com/moat-sandbox/moat/internal/web"
)

// proxy serves /sandboxes/{id}/proxy/{port}/{path...}: a streaming reverse
// proxy (HTTP, SSE, WebSocket) to a port inside the sandbox.
//
// Like upstream, the route needs no API key: it is how sandbox services are
// shared. The agent port stays protected by the agent token. A caller that
// does hold an API key may present it instead of the agent token (the
// OpenSandbox SDKs do exactly that in server-proxy mode): the auth
// middleware then scopes the call to the key's tenant (another tenant's
// sandbox is not found), and for an operator or admin key the proxy
// substitutes the sandbox's real token.
type proxy struct {
	svc *sandbox.Service
	web *web.Adapter
	rp  *httputil.ReverseProxy
	// egress returns a sandbox's egress API (nil: it has none).
	egress func(r *http.Request, id string) (http.Handler, error)
	// trail records commands, terminal sessions and file operations
	// sent to the agent (nil: no audit trail).
	trail *agentTrail
}

func newProxy(svc *sandbox.Service, wa *web.Adapter, log *slog.Logger) *proxy {
	p := &proxy{svc: svc, web: wa}
	tr := &http.Transport{
		DialContext:           (&net.Dialer{Timeout: 5 * time.Second}).DialContext,
		MaxIdleConnsPerHost:   16,
		IdleConnTimeout:       60 * time.Second,
		ResponseHeaderTimeout: 0, // long-running commands stream late
	}
	// A sandbox woken from hibernation has lost its connections: a kept
	// one would be reset on first use.
	if svc != nil {
		svc.OnHibernationWake(func(string) { tr.CloseIdleConnections() })
	}
	p.rp = &httputil.ReverseProxy{
		Rewrite:       p.rewrite,
		FlushInterval: -1, // SSE and streamed output go out as produced
		Transport:     loopbackFallback{tr},
		ErrorLog:      slog.NewLogLogger(log.Handler(), slog.LevelDebug),
		// Sandbox content shares this server's origin: a service worker it
		// registers must stay within its own /sandboxes/{id}/proxy/{port}/
		// scope, never reach the web console's pages (internal/console).
		ModifyResponse: func(resp *http.Response) error {
			resp.Header.Del("Service-Worker-Allowed")
			return nil
		},
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			if errors.Is(err, context.Canceled) {
				return
			}
			if t, ok := isEdge(r); ok {
				writeEdgeError(w, r, t, errdefs.WithPublic(fmt.Errorf("proxy: %v: %w", err, errdefs.ErrUnavailable), "", ""))
				return
			}
			wa.WriteError(w, r, errdefs.WithPublic(fmt.Errorf("proxy: %v: %w", err, errdefs.ErrUnavailable),
				"SANDBOX::PROXY_UNREACHABLE", "the sandbox port is not reachable"))
		},
	}
	return p
}

type targetKey struct{}

type target struct {
	addr  string
	path  string
	token string // agent token to set, if any
	// viaAgent, if set, is where the request goes when nothing listens on
	// addr: the agent's port proxy (E2B's edge, for services that listen
	// only on the sandbox's loopback).
	viaAgent func() (target, error)
}

// loopbackFallback is the proxy's transport. A request whose target has
// viaAgent and whose connection is refused (so nothing of it was sent)
// is sent again through the agent's port proxy, which reaches the
// sandbox's loopback: E2B's sandboxes expose loopback-only services on
// their address, and E2B's SDK users expect getHost(port) to reach them.
type loopbackFallback struct{ base *http.Transport }

func (f loopbackFallback) RoundTrip(req *http.Request) (*http.Response, error) {
	t, _ := req.Context().Value(targetKey{}).(target)
	if t.viaAgent == nil {
		return f.base.RoundTrip(req)
	}
	// The transport closes the body of a failed request: keep it for the
	// second attempt (a refused dial has read none of it).
	first := req
	if req.Body != nil && req.Body != http.NoBody {
		first = req.Clone(req.Context())
		first.Body = io.NopCloser(req.Body)
	}
	resp, err := f.base.RoundTrip(first)
	if err == nil || !errors.Is(err, syscall.ECONNREFUSED) {
		if err != nil && req.Body != nil {
			req.Body.Close()
		}
		return resp, err
	}
	at, aerr := t.viaAgent()
	if aerr != nil {
		if req.Body != nil {
			req.Body.Close()
		}
		return nil, err
	}
	out := req.Clone(req.Context())
	out.URL.Host, out.Host = at.addr, at.addr
	out.URL.Path = at.path
	out.Header.Set(agentproto.TokenHeader, at.token)
	resp, aerr = f.base.RoundTrip(out)
	if aerr == nil && portClosed(resp) {
		resp.Body.Close()
		return nil, err // nothing listens on the loopback either
	}
	return resp, aerr
}

// portClosed reports whether resp is the agent port proxy's own 502
// (nothing listens on the port), leaving resp readable as it was.
func portClosed(resp *http.Response) bool {
	if resp.StatusCode != http.StatusBadGateway || !strings.HasPrefix(resp.Header.Get("Content-Type"), "application/json") {
		return false
	}
	head, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	resp.Body = struct {
		io.Reader
		io.Closer
	}{io.MultiReader(bytes.NewReader(head), resp.Body), resp.Body}
	var body web.ErrorBody
	return json.Unmarshal(head, &body) == nil && body.Code == wire.CodeRuntimeError && strings.HasPrefix(body.Message, agentproxy.ErrorPrefix)
}

func (p *proxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	p.web.Handle(p.serve).ServeHTTP(w, r)
}

func (p *proxy) serve(w http.ResponseWriter, r *http.Request) error {
	id := r.PathValue("id")
	port, err := strconv.Atoi(r.PathValue("port"))
	if err != nil {
		return errdefs.Invalid("SANDBOX::INVALID_PORT", fmt.Sprintf("port %q is not a number", r.PathValue("port")))
	}
	// Activity for the idle policy; an idle-paused sandbox is woken first.
	done, err := p.svc.Access(r.Context(), id, idle.ViaProxy)
	if err != nil {
		return err
	}
	defer done()
	if port == EgressPort && p.egress != nil {
		// Port 18080 is the egress API (upstream's sidecar), which moat
		// serves itself for sandboxes with a network policy.
		h, err := p.egress(r, id)
		if err != nil {
			return err
		}
		if h != nil {
			p.svc.Touch(r.Context(), id)
			serveEgress(w, r, h)
			return nil
		}
	}
	ep, err := p.svc.Endpoint(r.Context(), id, port)
	if err != nil {
		return err
	}
	t := target{addr: ep.Address, path: "/" + r.PathValue("path")}
	if port == agentproto.Port && canDrive(r) {
		// The caller authenticated with a key (in an API-key header, or
		// in X-EXECD-ACCESS-TOKEN itself); an agent token it sent instead
		// goes through unchanged.
		if k := r.Header.Get(agentproto.TokenHeader); k == "" || k != ep.Headers[agentproto.TokenHeader] {
			t.token = ep.Headers[agentproto.TokenHeader]
		}
	}
	if _, edge := isEdge(r); edge && port != agentproto.Port && port != agentproto.EnvdPort {
		t.viaAgent = func() (target, error) {
			aep, err := p.svc.Endpoint(r.Context(), id, agentproto.Port)
			if err != nil {
				return target{}, err
			}
			return target{addr: aep.Address, path: "/proxy/" + strconv.Itoa(port) + t.path, token: aep.Headers[agentproto.TokenHeader]}, nil
		}
	}
	p.svc.Touch(r.Context(), id)
	if port == agentproto.Port && p.trail != nil {
		var done func()
		w, r, done = p.trail.wrap(w, r, id, t.path)
		defer done()
	}
	p.serveUntilEnded(w, r.WithContext(context.WithValue(r.Context(), targetKey{}, t)), id, ep, port == agentproto.Port)
	return nil
}

func (p *proxy) rewrite(pr *httputil.ProxyRequest) {
	t := pr.In.Context().Value(targetKey{}).(target)
	pr.Out.URL.Scheme = "http"
	pr.Out.URL.Host = t.addr
	pr.Out.URL.Path = t.path
	pr.Out.URL.RawPath = ""
	pr.Out.URL.RawQuery = pr.In.URL.RawQuery
	pr.Out.Host = t.addr
	// Credentials meant for moat never reach the sandbox. On E2B's edge
	// Authorization is envd's (the user) and cookies are the sandbox's.
	strip := []string{"Authorization", "Cookie", "OPEN-SANDBOX-API-KEY", "X-API-Key"}
	if _, edge := isEdge(pr.In); edge {
		strip = strip[2:]
	}
	for _, h := range strip {
		pr.Out.Header.Del(h)
	}
	if t.token != "" {
		pr.Out.Header.Set(agentproto.TokenHeader, t.token)
	}
	pr.Out.Header.Del("X-Forwarded-For")
	pr.SetXForwarded()
}

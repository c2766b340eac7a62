// Package proxy is the agent's port proxy, /proxy/{port}/{path...}.
package proxy

import (
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strconv"
	"strings"

	"github.com/moat-sandbox/moat/internal/errdefs"
	"github.com/moat-sandbox/moat/internal/execd/wire"
	"github.com/moat-sandbox/moat/internal/web"
)

// ErrorPrefix starts the message of the proxy's own 502 (nothing answered
// on the port), which tells it from a 502 of the user's server.
const ErrorPrefix = "error proxying to port "

// Handler reverse-proxies /proxy/{port}/{path...} to
// 127.0.0.1:{port}/{path...} inside the sandbox: HTTP, streamed responses
// (flushed immediately) and WebSocket upgrades. The agent token header is
// stripped so it never reaches the user's server.
type Handler struct {
	// Log receives proxy errors at debug level.
	Log *slog.Logger
	// TokenHeader is removed from every proxied request.
	TokenHeader string
}

// Serve proxies one request or WebSocket.
func (h *Handler) Serve(w http.ResponseWriter, r *http.Request) error {
	port, err := strconv.Atoi(r.PathValue("port"))
	if err != nil || port < 1 || port > 65535 {
		return errdefs.Invalid(wire.CodeInvalidRequestBody, "invalid port "+strconv.Quote(r.PathValue("port")))
	}
	target := &url.URL{Scheme: "http", Host: net.JoinHostPort("127.0.0.1", strconv.Itoa(port))}
	rest := "/" + r.PathValue("path")
	rp := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(target)
			pr.Out.URL.Path = rest
			pr.Out.URL.RawPath = ""
			if raw := r.URL.EscapedPath(); strings.HasPrefix(raw, "/proxy/") {
				// keep the client's escaping of the forwarded part
				if i := strings.Index(raw[len("/proxy/"):], "/"); i >= 0 {
					pr.Out.URL.RawPath = raw[len("/proxy/")+i:]
				}
			}
			pr.Out.Host = r.Host
			pr.SetXForwarded()
			pr.Out.Header.Del(h.TokenHeader)
		},
		FlushInterval: -1,
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			h.Log.Debug("proxy error", "port", port, "err", err)
			web.WriteJSON(w, http.StatusBadGateway, web.ErrorBody{Code: wire.CodeRuntimeError, Message: ErrorPrefix + strconv.Itoa(port) + ": " + err.Error()})
		},
	}
	web.ServeProxy(rp, w, r)
	return nil
}

// Routes are the port proxy routes (every method).
func (h *Handler) Routes() []wire.Route {
	return []wire.Route{
		{Pattern: "/proxy/{port}/{path...}", Handler: h.Serve},
		{Pattern: "/proxy/{port}", Handler: h.Serve},
	}
}

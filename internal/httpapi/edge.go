package httpapi

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"strings"

	"github.com/moat-sandbox/moat/internal/errdefs"
	"github.com/moat-sandbox/moat/internal/web"
)

// E2B's edge headers: the SDKs send them on every envd and code
// interpreter call, which is how a single sandbox URL routes.
const (
	edgeIDHeader   = "E2b-Sandbox-Id"
	edgePortHeader = "E2b-Sandbox-Port"
)

// edgeTarget is the sandbox port an E2B edge request is for.
type edgeTarget struct {
	id   string
	port int
}

type edgeKey struct{}

// edgeOf applies E2B's routing rule (docs/E2B.md, "The edge"): on a
// localhost, IP or sandbox.* host the E2b-Sandbox-Id and -Port headers
// name the target; on <port>-<id>.<domain> the host does. ok is false for
// requests that are not the edge's; err is set for ones that are but
// name no valid target.
func edgeOf(r *http.Request, domain string) (t edgeTarget, ok bool, err error) {
	host := r.Host
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	host = strings.ToLower(strings.TrimSuffix(host, "."))
	id, port := r.Header.Get(edgeIDHeader), r.Header.Get(edgePortHeader)
	shared := host == "localhost" || net.ParseIP(strings.Trim(host, "[]")) != nil || strings.HasPrefix(host, "sandbox.")
	switch {
	case shared && (id != "" || port != ""):
		if id == "" || port == "" {
			return t, true, errdefs.Invalid("SANDBOX::INVALID_PARAMETER", "both "+edgeIDHeader+" and "+edgePortHeader+" are required")
		}
	case domain != "" && strings.HasSuffix(host, "."+strings.ToLower(domain)):
		label, _, _ := strings.Cut(host, ".")
		var found bool
		if port, id, found = strings.Cut(label, "-"); !found {
			return t, false, nil // the domain's own names (api.<domain>)
		}
		id, _, _ = strings.Cut(id, "-")
	default:
		return t, false, nil
	}
	n, perr := strconv.ParseUint(port, 10, 16)
	if perr != nil || n == 0 {
		return t, true, errdefs.Invalid("SANDBOX::INVALID_PORT", fmt.Sprintf("port %q is not a port number", port))
	}
	if !validEdgeID(id) {
		return t, true, errdefs.Invalid("SANDBOX::INVALID_PARAMETER", fmt.Sprintf("sandbox id %q is not [a-z0-9]+", id))
	}
	return edgeTarget{id: id, port: int(n)}, true, nil
}

func validEdgeID(id string) bool {
	if id == "" {
		return false
	}
	for _, c := range id {
		if (c < 'a' || c > 'z') && (c < '0' || c > '9') {
			return false
		}
	}
	return true
}

// serveEdge proxies an E2B edge request to its sandbox port through the
// server proxy (wake, activity, fail-fast on a dead sandbox), answering
// in the edge's own shapes: E2B's SDKs read 502 as "sandbox gone" and its
// body's message, never a 404 (which a Connect client reads as
// unimplemented).
func (s *Server) serveEdge(w http.ResponseWriter, r *http.Request, t edgeTarget, err error) {
	if err != nil {
		web.WriteJSON(w, http.StatusBadRequest, map[string]any{"code": http.StatusBadRequest, "message": publicMessage(err)})
		return
	}
	r.SetPathValue("id", t.id)
	r.SetPathValue("port", strconv.Itoa(t.port))
	r.SetPathValue("path", strings.TrimPrefix(r.URL.Path, "/"))
	r = r.WithContext(context.WithValue(r.Context(), edgeKey{}, t))
	if err := s.proxy.serve(w, r); err != nil {
		writeEdgeError(w, r, t, err)
	}
}

// writeEdgeError answers an edge request that reached no sandbox port.
func writeEdgeError(w http.ResponseWriter, r *http.Request, t edgeTarget, err error) {
	if d, ok := errdefs.RetryAfterOf(err); ok && errors.Is(err, errdefs.ErrUnavailable) {
		// A sandbox still waking: the SDKs retry an unavailable call.
		w.Header().Set("Retry-After", web.RetryAfter(d))
		web.WriteJSON(w, http.StatusServiceUnavailable, map[string]any{"sandboxId": t.id, "message": publicMessage(err), "code": http.StatusServiceUnavailable})
		return
	}
	if errors.Is(err, errdefs.ErrUnavailable) && !errors.Is(err, errdefs.ErrNotFound) {
		web.WriteJSON(w, http.StatusBadGateway, map[string]any{"sandboxId": t.id, "message": "The sandbox is running but port is not open", "port": t.port, "code": http.StatusBadGateway})
		return
	}
	web.WriteJSON(w, http.StatusBadGateway, map[string]any{"sandboxId": t.id, "message": "The sandbox was not found", "code": http.StatusBadGateway})
}

// isEdge reports whether r is an edge request (the proxy keeps its
// Authorization header: envd reads the user from it).
func isEdge(r *http.Request) (edgeTarget, bool) {
	t, ok := r.Context().Value(edgeKey{}).(edgeTarget)
	return t, ok
}

func publicMessage(err error) string {
	if p, ok := errdefs.PublicOf(err); ok && p.Message != "" {
		return p.Message
	}
	return "the sandbox is not available"
}

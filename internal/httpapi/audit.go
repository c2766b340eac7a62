package httpapi

import (
	"net/http"
	"strings"
	"time"

	"github.com/moat-sandbox/moat/internal/audit"
	"github.com/moat-sandbox/moat/internal/web"
)

// AuditSink receives one record per audited call (internal/audit.Log).
type AuditSink interface {
	Write(audit.Record) error
}

// audited reports whether a request is recorded in the audit log: every
// mutating method (POST, PUT, PATCH, DELETE) on every route, including
// the egress API (policy and Credential Vault changes) and rejected (401,
// 404) calls, except the server proxy: it is the data plane (user traffic
// to sandbox ports), not a control-plane change. Port 18080 through the
// proxy is the egress API, so it is audited.
func audited(r *http.Request) bool {
	switch r.Method {
	case http.MethodPost, http.MethodPut, http.MethodPatch, http.MethodDelete:
	default:
		return false
	}
	id, kind := sandboxOfPath(r.URL.Path)
	if kind == "proxy" {
		rest := strings.TrimPrefix(strings.TrimPrefix(r.URL.Path, "/v1"), "/sandboxes/"+id+"/proxy/")
		return rest == "18080" || strings.HasPrefix(rest, "18080/")
	}
	return true
}

// sandboxOfPath returns the sandbox ID named by an API path and the path
// element after it ("" if none).
func sandboxOfPath(path string) (id, kind string) {
	p := strings.TrimPrefix(strings.TrimPrefix(path, "/v1"), "/v2") // /v2: E2B's
	rest, ok := strings.CutPrefix(p, "/sandboxes/")
	if !ok {
		return "", ""
	}
	parts := strings.SplitN(rest, "/", 3)
	if parts[0] == "batch" && len(parts) == 1 {
		return "", ""
	}
	if len(parts) >= 2 {
		kind = parts[1]
	}
	return parts[0], kind
}

// withAudit records every audited call to sink after it completes. route
// names the matched route pattern. It must run inside WithRequestID.
func (s *Server) withAudit(sink AuditSink, route func(*http.Request) string, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !audited(r) {
			next.ServeHTTP(w, r)
			return
		}
		start := time.Now()
		rec := &web.StatusWriter{ResponseWriter: w}
		r, slot := withAuthSlot(r)
		defer func() {
			id, _ := sandboxOfPath(r.URL.Path)
			if id == "" && rec.Status()/100 == 2 {
				// A create names its sandbox in Location.
				if loc := w.Header().Get("Location"); loc != "" {
					id, _ = sandboxOfPath(loc)
				}
			}
			status := rec.Status()
			if status == 0 {
				status = http.StatusOK
			}
			ar := audit.Record{
				Time:       start.UTC(),
				RequestID:  web.RequestID(r.Context()),
				RemoteAddr: r.RemoteAddr,
				Method:     r.Method,
				Path:       r.URL.Path,
				Route:      route(r),
				SandboxID:  id,
				Status:     status,
				DurationMS: float64(time.Since(start).Microseconds()) / 1000,
			}
			if slot.ok {
				ar.KeyID, ar.Tenant, ar.Role = slot.p.KeyID, slot.p.Tenant, string(slot.p.Role)
			}
			if err := sink.Write(ar); err != nil {
				s.log.Error("audit log write failed", "err", err, "method", r.Method, "path", r.URL.Path)
			}
		}()
		next.ServeHTTP(rec, r)
	})
}

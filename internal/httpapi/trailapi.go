package httpapi

import (
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/moat-sandbox/moat/internal/audit/trail"
	"github.com/moat-sandbox/moat/internal/errdefs"
	"github.com/moat-sandbox/moat/internal/lifecycle"
	"github.com/moat-sandbox/moat/internal/web"
)

// auditPage is the answer of GET /sandboxes/{id}/audit (AuditPage).
type auditPage struct {
	Items      []trail.Record `json:"items"`
	NextCursor string         `json:"nextCursor,omitempty"`
}

// auditTrail serves GET /sandboxes/{id}/audit: the trail of a sandbox the
// caller sees, or of a deleted one its tenant owned.
func (s *Server) auditTrail(w http.ResponseWriter, r *http.Request) error {
	id := r.PathValue("id")
	tr := s.cfg.Trail
	if _, err := s.svc.Get(r.Context(), id); err != nil {
		// A deleted sandbox's trail stays readable by its tenant; a
		// live one the caller does not see is not found either way.
		if _, live := s.trailOwner(id); live || tr == nil {
			return err
		}
		owner, ok := tr.Owner(id)
		if !ok || !lifecycle.Visible(r.Context(), owner) {
			return err
		}
	}
	if tr == nil {
		return errdefs.WithPublic(errdefs.ErrNotImplemented, "SANDBOX::API_NOT_SUPPORTED", "this server keeps no audit trail (--audit-trail off)")
	}
	q, err := auditQuery(r.URL.RawQuery)
	if err != nil {
		return err
	}
	recs, next, err := tr.Read(id, q)
	if err != nil {
		return err
	}
	page := auditPage{Items: recs}
	if next > 0 {
		page.NextCursor = strconv.FormatUint(next, 10)
	}
	web.WriteJSON(w, http.StatusOK, page)
	return nil
}

// auditQuery parses the trail query string.
func auditQuery(raw string) (trail.Query, error) {
	var q trail.Query
	v, err := url.ParseQuery(raw)
	if err != nil {
		return q, errdefs.Invalid("SANDBOX::INVALID_PARAMETER", "malformed query string")
	}
	for _, k := range v["kind"] {
		for _, part := range strings.Split(k, ",") {
			if part = strings.TrimSpace(part); part == "" {
				continue
			}
			kind, err := trail.ParseKind(part)
			if err != nil {
				return q, errdefs.Invalid("SANDBOX::INVALID_PARAMETER", err.Error())
			}
			q.Kinds = append(q.Kinds, kind)
		}
	}
	for _, b := range []struct {
		name string
		t    *time.Time
	}{{"since", &q.Since}, {"until", &q.Until}} {
		if s := v.Get(b.name); s != "" {
			if *b.t, err = time.Parse(time.RFC3339Nano, s); err != nil {
				return q, errdefs.Invalid("SANDBOX::INVALID_PARAMETER", b.name+" must be an RFC 3339 time, e.g. 2026-01-02T15:04:05Z")
			}
		}
	}
	if c := v.Get("cursor"); c != "" {
		if q.After, err = strconv.ParseUint(c, 10, 64); err != nil || q.After == 0 {
			return q, errdefs.Invalid("SANDBOX::INVALID_CURSOR", "cursor must be the nextCursor of an earlier page")
		}
	}
	if q.Limit, err = intParam(v, "limit", 100, 1, 1000); err != nil {
		return q, err
	}
	return q, nil
}

package httpapi

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"

	"github.com/moat-sandbox/moat/internal/agentproto"
	"github.com/moat-sandbox/moat/internal/errdefs"
	"github.com/moat-sandbox/moat/internal/tenant"
	"github.com/moat-sandbox/moat/internal/web"
)

// SessionResolver is a credential source besides the API key, such as the
// web console's server-side sessions (an HttpOnly cookie). The auth
// middleware asks it only when a request carries no API key, on every
// route that needs a credential, and uses the principal it answers
// exactly as that of an API key: same scoping, same role checks, same
// audit record.
//
// Implementations should remember the key id a session was opened with
// and call tenant.Registry.PrincipalOf on every request, so that a key
// revoked (or re-scoped) since sign-in takes effect at once; and they
// enforce their own CSRF defence on mutating methods (cookies ride along
// with cross-site requests; API keys do not).
type SessionResolver interface {
	// ResolveSession returns the principal of the session r carries. ok
	// is false when r carries no session at all: the request then needs
	// an API key (401 MISSING_API_KEY). A session that is present but
	// unusable (unknown, expired, its key revoked, a failed CSRF check)
	// is an error: class ErrUnauthenticated answers 401, ErrPermissionDenied
	// 403, with the error's public code and message (errdefs.WithPublic).
	ResolveSession(r *http.Request) (p tenant.Principal, ok bool, err error)
}

// TenantHeader lets a platform key act in one tenant: its resources only,
// and what it creates belongs to that tenant. Other roles (admins
// included) may name only their own tenant.
const TenantHeader = "X-Moat-Tenant"

// Route is one API route, for tests that must cover every route: its
// method and ServeMux pattern (with its /v1 or root prefix) and the access
// it needs.
type Route struct {
	Method  string
	Pattern string // e.g. "/v1/sandboxes/{id}"
	Access  tenant.Access
}

// route is one served route.
type route struct {
	pattern string // "METHOD /path" without prefix, or "/path" for any method
	access  tenant.Access
	h       http.Handler
}

// Routes lists every route the server serves, under each mount prefix.
func (s *Server) Routes() []Route {
	var out []Route
	for _, p := range []string{"", "/v1"} {
		for _, rt := range s.routes() {
			m, path, ok := strings.Cut(rt.pattern, " ")
			if !ok {
				m, path = "", rt.pattern
			}
			out = append(out, Route{Method: m, Pattern: p + path, Access: rt.access})
		}
	}
	for _, rt := range s.extraRoutes() {
		m, path, ok := strings.Cut(rt.pattern, " ")
		if !ok {
			m, path = "", rt.pattern
		}
		out = append(out, Route{Method: m, Pattern: path, Access: rt.access})
	}
	if s.cfg.Metrics != nil {
		out = append(out, Route{Method: "GET", Pattern: "/metrics", Access: tenant.AccessPlatform})
	}
	return out
}

// ExtraRoute is a route another package mounts on the API server (the web
// console under /console), behind the same authentication, role check and
// audit as the API's own routes. Pattern is a full ServeMux pattern
// ("GET /console/", "POST /console/login"); it is not mounted under /v1.
type ExtraRoute struct {
	Pattern string
	Access  tenant.Access
	Handler http.Handler
}

func (s *Server) extraRoutes() []route {
	out := make([]route, 0, len(s.cfg.Extra))
	for _, e := range s.cfg.Extra {
		out = append(out, route{pattern: e.Pattern, access: e.Access, h: e.Handler})
	}
	return out
}

// authSlot carries the principal from the auth middleware out to the
// audit middleware, which wraps it (and so cannot see its context).
type authSlot struct {
	p  tenant.Principal
	ok bool
}

type authSlotKey struct{}

// credential returns the API key a request presents, if any. On data
// routes (server proxy, egress) the Authorization header belongs to the
// sandbox's own service and is not read; the OpenSandbox SDKs in
// server-proxy mode send the API key as X-EXECD-ACCESS-TOKEN, which is
// taken when it is a moat key (otherwise it is the agent's own token).
func (s *Server) credential(r *http.Request, access tenant.Access) string {
	if k := r.Header.Get("OPEN-SANDBOX-API-KEY"); k != "" {
		return k
	}
	if k := r.Header.Get("X-API-Key"); k != "" {
		return k
	}
	if access == tenant.AccessData {
		if k := r.Header.Get(agentproto.TokenHeader); k != "" && (tenant.LooksLikeKey(k) || s.auth.IsRootKey(k)) {
			return k
		}
		return ""
	}
	if a, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer "); ok {
		return a
	}
	return ""
}

// principal authenticates r for a route that needs access. ok is false
// for a request without a credential on a public or data route.
func (s *Server) principal(r *http.Request, access tenant.Access) (p tenant.Principal, ok bool, err error) {
	switch {
	case access == tenant.AccessPublic:
		return tenant.Principal{}, false, nil
	case s.auth == nil && access == tenant.AccessData:
		// No credentials exist: the data plane stays as it was, and no
		// request is handed a sandbox's agent token.
		return tenant.Principal{}, false, nil
	case s.auth == nil:
		return tenant.Anonymous, true, nil
	}
	if key := s.credential(r, access); key != "" {
		p, err := s.auth.Authenticate(key)
		return p, err == nil, err
	}
	if s.cfg.Sessions != nil {
		p, ok, err := s.cfg.Sessions.ResolveSession(r)
		if err != nil || ok {
			return p, ok && err == nil, err
		}
	}
	if access == tenant.AccessData {
		return tenant.Principal{}, false, nil
	}
	return tenant.Principal{}, false, errdefs.WithPublic(fmt.Errorf("no credential: %w", errdefs.ErrUnauthenticated),
		"MISSING_API_KEY", "missing API key: set the OPEN-SANDBOX-API-KEY header (X-API-KEY for the E2B API)")
}

// narrow applies the X-Moat-Tenant header to p.
func (s *Server) narrow(r *http.Request, p tenant.Principal) (tenant.Principal, error) {
	name := r.Header.Get(TenantHeader)
	if name == "" {
		return p, nil
	}
	if err := tenant.ValidName(name); err != nil {
		return p, err
	}
	if p.Role != tenant.RolePlatform {
		if name != p.Tenant {
			return p, errdefs.WithPublic(fmt.Errorf("tenant header %q: %w", name, errdefs.ErrPermissionDenied), "PERMISSION_DENIED",
				fmt.Sprintf("only platform keys may act in another tenant (this %s key belongs to tenant %s)", p.Role, p.Tenant))
		}
		return p, nil
	}
	if s.auth != nil {
		if _, err := s.auth.Tenant(name); err != nil {
			return p, err
		}
	}
	p.Tenant, p.AllTenants = name, false
	return p, nil
}

// authenticate runs before every routed handler: it finds the route's
// access level, authenticates the request's credential, checks the role,
// and puts the principal in the request context (tenant.WithPrincipal),
// where the lifecycle service reads its scope. Unrouted requests need a
// credential too (any role) before they learn that the route is unknown.
// Errors are written by errs, in the envelope of the API the mux serves.
func (s *Server) authenticate(mux *http.ServeMux, access map[string]tenant.Access, next http.Handler, errs *web.Adapter) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, pattern := mux.Handler(r)
		acc, routed := access[pattern]
		if !routed {
			acc = tenant.AccessRead
		}
		p, ok, err := s.principal(r, acc)
		if err == nil && ok {
			p, err = s.narrow(r, p)
		}
		if slot, _ := r.Context().Value(authSlotKey{}).(*authSlot); slot != nil && err == nil && ok {
			slot.p, slot.ok = p, true // audited even if the role check refuses the call
		}
		if err == nil && ok && !p.Role.Allows(acc) {
			err = errdefs.WithPublic(fmt.Errorf("role %s on %s: %w", p.Role, pattern, errdefs.ErrPermissionDenied), "PERMISSION_DENIED",
				fmt.Sprintf("a %s key may not %s %s (needs %s)", p.Role, r.Method, r.URL.Path, needs(acc)))
		}
		if err != nil {
			errs.WriteError(w, r, authError(err))
			return
		}
		if !ok {
			next.ServeHTTP(w, r)
			return
		}
		next.ServeHTTP(w, r.WithContext(tenant.WithPrincipal(r.Context(), p)))
	})
}

// ScopeRequest implements ingress.Credentials for the ingress gateway: a
// request that carries an API key (OPEN-SANDBOX-API-KEY or X-API-Key, or
// a moat key as X-EXECD-ACCESS-TOKEN) gets the key's principal in its
// context, so that the gateway resolves only the key's tenant's
// sandboxes; one without a key is unchanged. Sessions are not consulted:
// cookies on the gateway belong to the sandboxes' own applications.
func (s *Server) ScopeRequest(r *http.Request) (context.Context, error) {
	if s.auth == nil {
		return r.Context(), nil
	}
	key := s.credential(r, tenant.AccessData)
	if key == "" {
		return r.Context(), nil
	}
	p, err := s.auth.Authenticate(key)
	if err == nil {
		p, err = s.narrow(r, p)
	}
	if err != nil {
		return nil, authError(err)
	}
	return tenant.WithPrincipal(r.Context(), p), nil
}

// authError keeps the classes the auth middleware may answer (401, 403,
// 400, 404) and turns anything else a credential source returned into a
// 401, so that a resolver's internal failure never reads as success nor
// leaks as a 500 with details.
func authError(err error) error {
	switch {
	case errors.Is(err, errdefs.ErrUnauthenticated), errors.Is(err, errdefs.ErrPermissionDenied),
		errdefs.IsInvalidArgument(err), errdefs.IsNotFound(err):
		return err
	}
	return errdefs.WithPublic(fmt.Errorf("credential: %v: %w", err, errdefs.ErrUnauthenticated), "INVALID_API_KEY", "invalid credential")
}

func needs(a tenant.Access) string {
	switch a {
	case tenant.AccessPlatform:
		return "platform"
	case tenant.AccessAdmin:
		return "admin or platform"
	case tenant.AccessWrite:
		return "operator, admin or platform"
	}
	return "any role"
}

// withAuthSlot gives the request a slot the auth middleware fills.
func withAuthSlot(r *http.Request) (*http.Request, *authSlot) {
	slot := &authSlot{}
	return r.WithContext(context.WithValue(r.Context(), authSlotKey{}, slot)), slot
}

// canDrive reports whether the request's principal may drive a sandbox
// through the server proxy with the sandbox's own agent token (operator
// or admin; a viewer's key is not turned into an agent token).
func canDrive(r *http.Request) bool {
	p, ok := tenant.PrincipalFrom(r.Context())
	return ok && p.Role.Allows(tenant.AccessWrite)
}

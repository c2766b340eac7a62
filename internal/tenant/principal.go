// Package tenant is moat's multi-tenant access model: tenants, API keys,
// roles and quotas, and the Principal every authenticated request carries.
//
// A Principal (key id, tenant, role) is put in the request context by the
// API's auth middleware (internal/httpapi) from whichever credential the
// request carries: an API key, or a session of another credential source
// such as the web console. Domain services read it back with ScopeOf to
// decide which tenant's resources a call may see (Scope.Sees) and which
// tenant owns what it creates (Scope.Tenant). A context without a
// principal is the server itself (the reaper, pool refills, a server
// started with auth disabled): it sees every tenant.
//
// Keys and tenants are kept in the state store (Registry); keys are stored
// as HMAC-SHA256 digests under a server secret and compared in constant
// time.
package tenant

import (
	"context"
	"fmt"
	"regexp"

	"github.com/moat-sandbox/moat/internal/errdefs"
)

// Default is the tenant that owns everything created before tenants
// existed (records without an owner) and everything the server's own key
// (MOAT_API_KEY, <root>/api-key) creates.
const Default = "default"

// RootKeyID is the key id of the server's own key (the single key of
// servers before tenants): an admin of the Default tenant. It lives in the
// server's configuration, not in the registry, and cannot be revoked
// through the API (rotate the key file instead).
const RootKeyID = "root"

// Role is what a key may do.
type Role string

// Roles, from most to least privileged.
const (
	// RoleAdmin sees and changes every tenant's resources and manages
	// keys and tenants.
	RoleAdmin Role = "admin"
	// RoleOperator has full control of its own tenant's resources.
	RoleOperator Role = "operator"
	// RoleViewer reads its own tenant's resources and changes nothing.
	RoleViewer Role = "viewer"
)

// Roles lists every role.
var Roles = []Role{RoleAdmin, RoleOperator, RoleViewer}

// ParseRole parses a role name.
func ParseRole(s string) (Role, error) {
	for _, r := range Roles {
		if string(r) == s {
			return r, nil
		}
	}
	return "", errdefs.Invalid("KEY::INVALID_ROLE", fmt.Sprintf("role %q: want admin, operator or viewer", s))
}

// Access is what a route needs from its caller.
type Access int

// Access levels of routes.
const (
	// AccessPublic needs no credential (/health).
	AccessPublic Access = iota
	// AccessData needs no credential (the server proxy and the egress
	// API, which sandboxes' own tokens protect, as upstream), but a
	// credential the request does present must be valid, and then it
	// scopes the call: another tenant's sandbox is not found.
	AccessData
	// AccessRead needs any role.
	AccessRead
	// AccessWrite changes a tenant's resources: operator or admin.
	AccessWrite
	// AccessAdmin manages keys and tenants: admin only.
	AccessAdmin
)

func (a Access) String() string {
	switch a {
	case AccessPublic:
		return "public"
	case AccessData:
		return "data"
	case AccessRead:
		return "read"
	case AccessWrite:
		return "write"
	case AccessAdmin:
		return "admin"
	}
	return fmt.Sprintf("Access(%d)", int(a))
}

// Allows reports whether role r may make a call that needs a.
func (r Role) Allows(a Access) bool {
	switch a {
	case AccessPublic, AccessData, AccessRead:
		return r == RoleAdmin || r == RoleOperator || r == RoleViewer
	case AccessWrite:
		return r == RoleAdmin || r == RoleOperator
	case AccessAdmin:
		return r == RoleAdmin
	}
	return false
}

// Principal is who a request acts as.
type Principal struct {
	// KeyID names the API key (RootKeyID for the server's own key). A
	// session of another credential source carries the id of the key it
	// was opened with.
	KeyID string `json:"keyId"`
	// Tenant is the tenant the request acts in: it owns what the request
	// creates and names (pools) resolve in it.
	Tenant string `json:"tenant"`
	// Role is the key's role.
	Role Role `json:"role"`
	// AllTenants lets the request see every tenant's resources (admins,
	// unless they narrowed their scope to one tenant).
	AllTenants bool `json:"allTenants,omitempty"`
}

// Anonymous is the principal of a server that runs without auth
// (--insecure-no-auth): an admin of the Default tenant.
var Anonymous = Principal{Tenant: Default, Role: RoleAdmin, AllTenants: true}

type principalKey struct{}

// WithPrincipal returns ctx carrying p.
func WithPrincipal(ctx context.Context, p Principal) context.Context {
	return context.WithValue(ctx, principalKey{}, p)
}

// PrincipalFrom returns the principal of ctx, if any.
func PrincipalFrom(ctx context.Context) (Principal, bool) {
	p, ok := ctx.Value(principalKey{}).(Principal)
	return p, ok
}

// Scope is the set of tenants a call sees.
type Scope struct {
	// Tenant owns what the call creates; named resources resolve in it.
	Tenant string
	// All makes every tenant's resources visible.
	All bool
}

// ScopeOf returns the scope of ctx: its principal's, or every tenant for
// a context without one (the server's own work).
func ScopeOf(ctx context.Context) Scope {
	p, ok := PrincipalFrom(ctx)
	if !ok {
		return Scope{Tenant: Default, All: true}
	}
	return Scope{Tenant: p.Tenant, All: p.AllTenants}
}

// Sees reports whether the scope includes a resource owned by owner ("" is
// the Default tenant: records from before tenants existed).
func (s Scope) Sees(owner string) bool {
	return s.All || Normalize(owner) == Normalize(s.Tenant)
}

// Normalize maps the empty owner of pre-tenant records to Default.
func Normalize(owner string) string {
	if owner == "" {
		return Default
	}
	return owner
}

var nameRe = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$`)

// ValidName checks a tenant name: a DNS label (lowercase alphanumerics and
// '-', at most 63 characters), so that it is safe in paths, labels and
// log lines.
func ValidName(name string) error {
	if !nameRe.MatchString(name) {
		return errdefs.Invalid("TENANT::INVALID_NAME", fmt.Sprintf("tenant name %q must be a DNS label (lowercase alphanumerics and '-', at most 63 characters)", name))
	}
	return nil
}

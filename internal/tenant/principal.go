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
// Roles fence a key to its tenant, admins included: only the platform
// role (the server's own key, and keys it grants that role) acts across
// tenants, sets quotas and egress guardrails, and reads /metrics.
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
// servers before tenants): the platform role, in the Default tenant. It lives in the
// server's configuration, not in the registry, and cannot be revoked
// through the API (rotate the key file instead).
const RootKeyID = "root"

// Role is what a key may do.
type Role string

// Roles, from most to least privileged.
const (
	// RolePlatform sees and changes every tenant's resources, manages
	// tenants (quotas, egress guardrails) and every tenant's keys. The
	// server's own key holds it; only that key may grant it.
	RolePlatform Role = "platform"
	// RoleAdmin has full control of its own tenant: its resources and
	// its keys (up to admin). It sees no other tenant.
	RoleAdmin Role = "admin"
	// RoleOperator has full control of its own tenant's resources.
	RoleOperator Role = "operator"
	// RoleViewer reads its own tenant's resources and changes nothing.
	RoleViewer Role = "viewer"
)

// Roles lists every role, from most to least privileged.
var Roles = []Role{RolePlatform, RoleAdmin, RoleOperator, RoleViewer}

// CodeInvalidRole is the API code of a role that does not exist.
const CodeInvalidRole = "KEY::INVALID_ROLE"

// ParseRole parses a role name.
func ParseRole(s string) (Role, error) {
	for _, r := range Roles {
		if string(r) == s {
			return r, nil
		}
	}
	return "", errdefs.Invalid(CodeInvalidRole, fmt.Sprintf("role %q does not exist: want platform, admin, operator or viewer", s))
}

// rank orders roles (higher is more privileged; 0: not a role).
func (r Role) rank() int {
	switch r {
	case RolePlatform:
		return 4
	case RoleAdmin:
		return 3
	case RoleOperator:
		return 2
	case RoleViewer:
		return 1
	}
	return 0
}

// Covers reports whether r holds every right of o (a key may only grant
// roles its own covers).
func (r Role) Covers(o Role) bool { return o.rank() > 0 && r.rank() >= o.rank() }

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
	// AccessWrite changes a tenant's resources: operator, admin or
	// platform.
	AccessWrite
	// AccessAdmin manages a tenant's keys: admin (its own tenant) or
	// platform.
	AccessAdmin
	// AccessPlatform manages tenants (quotas, egress guardrails) and reads
	// server-wide data (/metrics): platform only.
	AccessPlatform
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
	case AccessPlatform:
		return "platform"
	}
	return fmt.Sprintf("Access(%d)", int(a))
}

// Allows reports whether role r may make a call that needs a.
func (r Role) Allows(a Access) bool {
	switch a {
	case AccessPublic, AccessData, AccessRead:
		return r.Covers(RoleViewer)
	case AccessWrite:
		return r.Covers(RoleOperator)
	case AccessAdmin:
		return r.Covers(RoleAdmin)
	case AccessPlatform:
		return r.Covers(RolePlatform)
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
	// AllTenants lets the request see every tenant's resources (platform
	// keys, unless they narrowed their scope to one tenant).
	AllTenants bool `json:"allTenants,omitempty"`
}

// Anonymous is the principal of a server that runs without auth
// (--insecure-no-auth): the platform role, in the Default tenant.
var Anonymous = Principal{Tenant: Default, Role: RolePlatform, AllTenants: true}

// CanGrantPlatform reports whether p may create platform keys: only the
// server's own key (and a server without auth) may.
func (p Principal) CanGrantPlatform() bool {
	return p.Role == RolePlatform && (p.KeyID == RootKeyID || p.KeyID == "")
}

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

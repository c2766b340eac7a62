package client

import (
	"context"
	"net/http"
	"net/url"
	"time"
)

// Tenants, API keys and roles (the Access API of api/openapi/lifecycle.yaml).
// A tenant's admin key manages its own tenant's keys; tenants, quotas and
// egress guardrails need a platform key; Whoami, GetTenant and
// GetTenantEgress (of the key's own tenant) work with any key.

// TenantHeader makes a platform key act in one tenant (see WithTenant).
const TenantHeader = "X-Moat-Tenant"

// WithTenant makes every lifecycle call of a platform key act in tenant
// name: only its resources are visible, what the client creates belongs
// to it, and pool names resolve in it. Other roles may name only their
// own tenant.
func WithTenant(name string) Option {
	return func(c *Client) error {
		c.lc.header.Set(TenantHeader, name)
		return nil
	}
}

// Roles of API keys.
const (
	// RolePlatform: every tenant; tenants, quotas, egress guardrails and
	// every tenant's keys. Only the server's own key grants it.
	RolePlatform = "platform"
	// RoleAdmin: full control of its own tenant, its keys included.
	RoleAdmin = "admin"
	// RoleOperator: full control of its own tenant's resources.
	RoleOperator = "operator"
	// RoleViewer: read only, its own tenant.
	RoleViewer = "viewer"
)

// Principal is who a key (or console session) acts as.
type Principal struct {
	// KeyID names the key ("root" for the server's own key).
	KeyID string `json:"keyId"`
	// Tenant is the tenant the calls act in.
	Tenant string `json:"tenant"`
	Role   string `json:"role"`
	// AllTenants: the key sees every tenant's resources (a platform key
	// not narrowed with WithTenant).
	AllTenants bool `json:"allTenants"`
	// Sees says what the calls reach, in words.
	Sees string `json:"sees,omitempty"`
}

// APIKey is the record of an API key; the key itself is shown only by
// CreateKey.
type APIKey struct {
	ID     string `json:"id"`
	Name   string `json:"name,omitempty"`
	Tenant string `json:"tenant"`
	Role   string `json:"role"`
	// Active: neither revoked nor expired.
	Active    bool       `json:"active"`
	CreatedAt *time.Time `json:"createdAt,omitempty"`
	// CreatedBy is the id of the key that created this one.
	CreatedBy string     `json:"createdBy,omitempty"`
	ExpiresAt *time.Time `json:"expiresAt,omitempty"`
	RevokedAt *time.Time `json:"revokedAt,omitempty"`
}

// CreatedKey is a new key: its record and the key itself, which the
// server does not keep and cannot show again.
type CreatedKey struct {
	APIKey
	Key string `json:"key"`
}

// KeySpec is the request of CreateKey.
type KeySpec struct {
	// Tenant owns the key; the server creates it if it does not exist.
	Tenant string `json:"tenant"`
	// Role is RolePlatform, RoleAdmin, RoleOperator or RoleViewer.
	Role string `json:"role"`
	// Name says what the key is for (optional, at most 128 characters).
	Name string `json:"name,omitempty"`
	// ExpiresAt, if set, ends the key's validity.
	ExpiresAt *time.Time `json:"expiresAt,omitempty"`
}

// TenantQuota bounds a tenant's live sandboxes; an empty field is
// unlimited. CPU and Memory are Kubernetes quantities ("8", "2500m",
// "16Gi") summed over the sandboxes' resourceLimits.
type TenantQuota struct {
	Sandboxes int    `json:"sandboxes,omitempty"`
	CPU       string `json:"cpu,omitempty"`
	Memory    string `json:"memory,omitempty"`
}

// TenantUsage is what a tenant's live sandboxes hold.
type TenantUsage struct {
	Sandboxes int    `json:"sandboxes"`
	CPU       string `json:"cpu"`
	Memory    string `json:"memory"`
}

// Tenant is a tenant with its quota and usage.
type Tenant struct {
	Name      string      `json:"name"`
	Quota     TenantQuota `json:"quota"`
	Usage     TenantUsage `json:"usage"`
	CreatedAt *time.Time  `json:"createdAt,omitempty"`
}

// Whoami returns the principal of the client's key.
func (c *Client) Whoami(ctx context.Context) (*Principal, error) {
	var p Principal
	if err := c.lc.json(ctx, &call{method: http.MethodGet, path: "/whoami"}, nil, &p); err != nil {
		return nil, err
	}
	return &p, nil
}

// CreateKey creates an API key (admin; never retried). Keep the returned
// Key: it cannot be shown again.
func (c *Client) CreateKey(ctx context.Context, spec KeySpec) (*CreatedKey, error) {
	var k CreatedKey
	if err := c.lc.json(ctx, &call{method: http.MethodPost, path: "/keys"}, spec, &k); err != nil {
		return nil, err
	}
	return &k, nil
}

// ListKeys returns the API keys of tenant ("" = every tenant), revoked
// ones included (admin).
func (c *Client) ListKeys(ctx context.Context, tenant string) ([]APIKey, error) {
	var out struct {
		Items []APIKey `json:"items"`
	}
	cl := &call{method: http.MethodGet, path: "/keys"}
	if tenant != "" {
		cl.query = url.Values{"tenant": {tenant}}
	}
	if err := c.lc.json(ctx, cl, nil, &out); err != nil {
		return nil, err
	}
	return out.Items, nil
}

// GetKey returns one key's record (admin).
func (c *Client) GetKey(ctx context.Context, id string) (*APIKey, error) {
	var k APIKey
	if err := c.lc.json(ctx, &call{method: http.MethodGet, path: "/keys/" + url.PathEscape(id)}, nil, &k); err != nil {
		return nil, err
	}
	return &k, nil
}

// RevokeKey revokes a key at once and for good (admin). Revoking a
// revoked key succeeds.
func (c *Client) RevokeKey(ctx context.Context, id string) error {
	return c.lc.json(ctx, &call{method: http.MethodDelete, path: "/keys/" + url.PathEscape(id)}, nil, nil)
}

// ListTenants returns every tenant with its quota and usage (admin).
func (c *Client) ListTenants(ctx context.Context) ([]Tenant, error) {
	var out struct {
		Items []Tenant `json:"items"`
	}
	if err := c.lc.json(ctx, &call{method: http.MethodGet, path: "/tenants"}, nil, &out); err != nil {
		return nil, err
	}
	return out.Items, nil
}

// GetTenant returns a tenant with its quota and usage (admins any tenant,
// other keys their own).
func (c *Client) GetTenant(ctx context.Context, name string) (*Tenant, error) {
	var t Tenant
	if err := c.lc.json(ctx, &call{method: http.MethodGet, path: "/tenants/" + url.PathEscape(name)}, nil, &t); err != nil {
		return nil, err
	}
	return &t, nil
}

// PutTenant creates tenant name or replaces its quota (admin).
func (c *Client) PutTenant(ctx context.Context, name string, quota TenantQuota) (*Tenant, error) {
	var t Tenant
	body := struct {
		Quota TenantQuota `json:"quota"`
	}{quota}
	if err := c.lc.json(ctx, &call{method: http.MethodPut, path: "/tenants/" + url.PathEscape(name)}, body, &t); err != nil {
		return nil, err
	}
	return &t, nil
}

// DeleteTenant deletes a tenant that has no active key and owns no
// sandbox, pool or snapshot (admin).
func (c *Client) DeleteTenant(ctx context.Context, name string) error {
	return c.lc.json(ctx, &call{method: http.MethodDelete, path: "/tenants/" + url.PathEscape(name)}, nil, nil)
}

// TenantEgress is a tenant's egress guardrail: every sandbox of the tenant
// is enforced with it intersected with its own policy.
type TenantEgress struct {
	Tenant string `json:"tenant"`
	// Policy is the guardrail (nil: none).
	Policy *NetworkPolicy `json:"policy,omitempty"`
	// Applied counts the running sandboxes a change reached.
	Applied *int `json:"applied,omitempty"`
}

// GetTenantEgress returns a tenant's egress guardrail (platform keys any
// tenant, other keys their own).
func (c *Client) GetTenantEgress(ctx context.Context, name string) (*TenantEgress, error) {
	var t TenantEgress
	if err := c.lc.json(ctx, &call{method: http.MethodGet, path: "/tenants/" + url.PathEscape(name) + "/egress"}, nil, &t); err != nil {
		return nil, err
	}
	return &t, nil
}

// PutTenantEgress sets a tenant's egress guardrail (platform); it reaches
// the tenant's running sandboxes at once.
func (c *Client) PutTenantEgress(ctx context.Context, name string, p NetworkPolicy) (*TenantEgress, error) {
	var t TenantEgress
	if p.Egress == nil {
		p.Egress = []NetworkRule{}
	}
	if err := c.lc.json(ctx, &call{method: http.MethodPut, path: "/tenants/" + url.PathEscape(name) + "/egress"}, p, &t); err != nil {
		return nil, err
	}
	return &t, nil
}

// DeleteTenantEgress removes a tenant's egress guardrail (platform).
func (c *Client) DeleteTenantEgress(ctx context.Context, name string) (*TenantEgress, error) {
	var t TenantEgress
	if err := c.lc.json(ctx, &call{method: http.MethodDelete, path: "/tenants/" + url.PathEscape(name) + "/egress"}, nil, &t); err != nil {
		return nil, err
	}
	return &t, nil
}

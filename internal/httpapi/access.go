package httpapi

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/moat-sandbox/moat/internal/egress/policy"
	"github.com/moat-sandbox/moat/internal/errdefs"
	"github.com/moat-sandbox/moat/internal/gen/lifecycleapi"
	"github.com/moat-sandbox/moat/internal/lifecycle"
	"github.com/moat-sandbox/moat/internal/tenant"
	"github.com/moat-sandbox/moat/internal/web"
)

// Access API (moat extension): the caller's principal, API keys and
// tenants. A tenant's admin manages its own tenant's keys (up to admin);
// the platform role manages every tenant's keys, the tenants themselves
// (quotas, egress guardrails) and is the only role that grants nothing
// it does not hold. GET /tenants/{name} lets every role read its own
// tenant's quota and usage. A key or tenant outside the caller's scope is
// not found, as another tenant's sandbox is; a platform key is invisible
// to every other role.

// accessRoutes are the access API's routes (part of routes).
func (s *Server) accessRoutes() []route {
	h := s.web.Handle
	return []route{
		{"GET /whoami", tenant.AccessRead, h(s.whoami)},
		{"GET /keys", tenant.AccessAdmin, h(s.listKeys)},
		{"POST /keys", tenant.AccessAdmin, h(s.createKey)},
		{"GET /keys/{keyId}", tenant.AccessAdmin, h(s.getKey)},
		{"DELETE /keys/{keyId}", tenant.AccessAdmin, h(s.revokeKey)},
		{"GET /tenants", tenant.AccessAdmin, h(s.listTenants)},
		{"GET /tenants/{tenantName}", tenant.AccessRead, h(s.getTenant)},
		{"PUT /tenants/{tenantName}", tenant.AccessPlatform, h(s.putTenant)},
		{"DELETE /tenants/{tenantName}", tenant.AccessPlatform, h(s.deleteTenant)},
		{"GET /tenants/{tenantName}/egress", tenant.AccessRead, h(s.getTenantEgress)},
		{"PUT /tenants/{tenantName}/egress", tenant.AccessPlatform, h(s.putTenantEgress)},
		{"DELETE /tenants/{tenantName}/egress", tenant.AccessPlatform, h(s.deleteTenantEgress)},
	}
}

// registry returns the key registry, or a 501 when the server runs
// without authentication (there are no keys to manage).
func (s *Server) registry() (*tenant.Registry, error) {
	if s.auth == nil {
		return nil, errdefs.WithPublic(errdefs.ErrNotImplemented, "SANDBOX::API_NOT_SUPPORTED",
			"this server runs without authentication (--insecure-no-auth): there are no keys or tenants to manage")
	}
	return s.auth, nil
}

func principalOf(r *http.Request) tenant.Principal {
	if p, ok := tenant.PrincipalFrom(r.Context()); ok {
		return p
	}
	return tenant.Anonymous
}

func (s *Server) whoami(w http.ResponseWriter, r *http.Request) error {
	p := principalOf(r)
	web.WriteJSON(w, http.StatusOK, lifecycleapi.Principal{KeyID: p.KeyID, Tenant: p.Tenant,
		Role: lifecycleapi.PrincipalRole(p.Role), AllTenants: p.AllTenants, Sees: optString(sees(p))})
	return nil
}

// sees says in words what p's calls reach.
func sees(p tenant.Principal) string {
	switch {
	case p.AllTenants:
		return "all tenants"
	case p.Role == tenant.RolePlatform:
		return "tenant " + p.Tenant + " (a platform key narrowed with " + TenantHeader + ")"
	case p.Role == tenant.RoleAdmin:
		return "tenant " + p.Tenant + " only (its resources and its keys)"
	}
	return "tenant " + p.Tenant + " only"
}

// keyVisible reports whether the caller may see key k: k's tenant is in
// scope, and a platform key only to a platform caller.
func keyVisible(r *http.Request, k tenant.Key) bool {
	return tenant.ScopeOf(r.Context()).Sees(k.Tenant) && (k.Role != tenant.RolePlatform || principalOf(r).Role == tenant.RolePlatform)
}

func (s *Server) keyJSON(k tenant.Key) lifecycleapi.APIKey {
	out := lifecycleapi.APIKey{ID: k.ID, Tenant: tenant.Normalize(k.Tenant), Role: lifecycleapi.APIKeyRole(k.Role),
		Name: optString(k.Name), CreatedBy: optString(k.CreatedBy), Active: k.Active(time.Now()),
		ExpiresAt: k.ExpiresAt, RevokedAt: k.RevokedAt}
	if !k.CreatedAt.IsZero() {
		at := k.CreatedAt.UTC()
		out.CreatedAt = &at
	}
	return out
}

func (s *Server) listKeys(w http.ResponseWriter, r *http.Request) error {
	reg, err := s.registry()
	if err != nil {
		return err
	}
	t := r.URL.Query().Get("tenant")
	if t != "" {
		if err := tenant.ValidName(t); err != nil {
			return err
		}
	}
	if p := principalOf(r); !p.AllTenants {
		if t != "" && t != p.Tenant {
			t = "\x00" // narrowed to another tenant: nothing
		} else {
			t = p.Tenant
		}
	}
	out := lifecycleapi.ListKeysResponse{Items: []lifecycleapi.APIKey{}}
	if t != "\x00" {
		for _, k := range reg.Keys(t) {
			if keyVisible(r, k) {
				out.Items = append(out.Items, s.keyJSON(k))
			}
		}
	}
	web.WriteJSON(w, http.StatusOK, out)
	return nil
}

func (s *Server) createKey(w http.ResponseWriter, r *http.Request) error {
	reg, err := s.registry()
	if err != nil {
		return err
	}
	var body lifecycleapi.CreateKeyRequest
	if err := web.DecodeJSON(r, &body, false); err != nil {
		return err
	}
	if body.Tenant == "" {
		return errdefs.Invalid("KEY::INVALID_TENANT", "tenant is required")
	}
	role, err := tenant.ParseRole(string(body.Role))
	if err != nil {
		return err
	}
	if err := tenantInScope(r, body.Tenant); err != nil {
		return err
	}
	if p := principalOf(r); role == tenant.RolePlatform && !p.CanGrantPlatform() {
		return errdefs.WithPublic(fmt.Errorf("grant platform by %s: %w", p.KeyID, errdefs.ErrPermissionDenied), "PERMISSION_DENIED",
			"only the server's own key may create platform keys")
	} else if !p.Role.Covers(role) {
		return errdefs.WithPublic(fmt.Errorf("grant %s by %s: %w", role, p.Role, errdefs.ErrPermissionDenied), "PERMISSION_DENIED",
			fmt.Sprintf("a %s key may not create %s keys", p.Role, role))
	}
	req := tenant.NewKey{Tenant: body.Tenant, Role: role, ExpiresAt: body.ExpiresAt, CreatedBy: principalOf(r).KeyID}
	if body.Name != nil {
		req.Name = *body.Name
	}
	k, token, err := reg.CreateKey(r.Context(), req)
	if err != nil {
		return err
	}
	o := s.keyJSON(k)
	w.Header().Set("Location", "/v1/keys/"+k.ID)
	web.WriteJSON(w, http.StatusCreated, lifecycleapi.CreatedKey{ID: o.ID, Name: o.Name, Tenant: o.Tenant,
		Role: lifecycleapi.CreatedKeyRole(o.Role), Active: o.Active, CreatedAt: o.CreatedAt, CreatedBy: o.CreatedBy,
		ExpiresAt: o.ExpiresAt, Key: token})
	return nil
}

func (s *Server) getKey(w http.ResponseWriter, r *http.Request) error {
	reg, err := s.registry()
	if err != nil {
		return err
	}
	k, err := reg.Key(r.PathValue("keyId"))
	if err != nil {
		return err
	}
	if !keyVisible(r, k) {
		return errdefs.WithPublic(fmt.Errorf("key %q: %w", k.ID, errdefs.ErrNotFound), "KEY::NOT_FOUND", fmt.Sprintf("key %s not found", k.ID))
	}
	web.WriteJSON(w, http.StatusOK, s.keyJSON(k))
	return nil
}

func (s *Server) revokeKey(w http.ResponseWriter, r *http.Request) error {
	reg, err := s.registry()
	if err != nil {
		return err
	}
	id := r.PathValue("keyId")
	if k, err := reg.Key(id); err == nil && !keyVisible(r, k) {
		return errdefs.WithPublic(fmt.Errorf("key %q: %w", id, errdefs.ErrNotFound), "KEY::NOT_FOUND", fmt.Sprintf("key %s not found", id))
	}
	if _, err := reg.RevokeKey(r.Context(), id); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// quantities formats a CPU amount (millicores) and a memory amount
// (bytes) as Kubernetes quantities.
func cpuString(m int64) string {
	if m%1000 == 0 {
		return strconv.FormatInt(m/1000, 10)
	}
	return strconv.FormatInt(m, 10) + "m"
}

func memString(b int64) string {
	for _, u := range []struct {
		s string
		n int64
	}{{"Ti", 1 << 40}, {"Gi", 1 << 30}, {"Mi", 1 << 20}, {"Ki", 1 << 10}} {
		if b != 0 && b%u.n == 0 {
			return strconv.FormatInt(b/u.n, 10) + u.s
		}
	}
	return strconv.FormatInt(b, 10)
}

func (s *Server) tenantJSON(t tenant.Tenant) lifecycleapi.Tenant {
	out := lifecycleapi.Tenant{Name: t.Name}
	if q := t.Quota; q.Sandboxes > 0 {
		out.Quota.Sandboxes = &q.Sandboxes
	}
	if q := t.Quota; q.CPUMillis > 0 {
		c := cpuString(q.CPUMillis)
		out.Quota.CPU = &c
	}
	if q := t.Quota; q.MemoryBytes > 0 {
		m := memString(q.MemoryBytes)
		out.Quota.Memory = &m
	}
	var u tenant.Usage
	if s.svc != nil {
		u = s.svc.TenantUsage(t.Name)
	}
	out.Usage = lifecycleapi.TenantUsage{Sandboxes: u.Sandboxes, CPU: cpuString(u.CPUMillis), Memory: memString(u.MemoryBytes)}
	if !t.CreatedAt.IsZero() {
		at := t.CreatedAt.UTC()
		out.CreatedAt = &at
	}
	return out
}

func (s *Server) listTenants(w http.ResponseWriter, r *http.Request) error {
	reg, err := s.registry()
	if err != nil {
		return err
	}
	scope := tenant.ScopeOf(r.Context())
	out := lifecycleapi.ListTenantsResponse{Items: []lifecycleapi.Tenant{}}
	for _, t := range reg.Tenants() {
		if scope.Sees(t.Name) {
			out.Items = append(out.Items, s.tenantJSON(t))
		}
	}
	web.WriteJSON(w, http.StatusOK, out)
	return nil
}

func (s *Server) getTenant(w http.ResponseWriter, r *http.Request) error {
	name := r.PathValue("tenantName")
	if p := principalOf(r); s.auth == nil {
		web.WriteJSON(w, http.StatusOK, s.tenantJSON(tenant.Tenant{Name: p.Tenant}))
		return nil
	}
	if err := tenantInScope(r, name); err != nil {
		return err
	}
	t, err := s.auth.Tenant(name)
	if err != nil {
		return err
	}
	web.WriteJSON(w, http.StatusOK, s.tenantJSON(t))
	return nil
}

// quotaIn parses the wire quota.
func quotaIn(q *lifecycleapi.TenantQuota) (tenant.Quota, error) {
	var out tenant.Quota
	if q == nil {
		return out, nil
	}
	if q.Sandboxes != nil {
		if *q.Sandboxes < 0 {
			return out, errdefs.Invalid("TENANT::INVALID_QUOTA", "quota.sandboxes must not be negative")
		}
		out.Sandboxes = *q.Sandboxes
	}
	lim := map[string]string{}
	if q.CPU != nil && *q.CPU != "" && *q.CPU != "0" {
		lim["cpu"] = *q.CPU
	}
	if q.Memory != nil && *q.Memory != "" && *q.Memory != "0" {
		lim["memory"] = *q.Memory
	}
	res, err := lifecycle.ParseResources(lim)
	if err != nil {
		msg := err.Error()
		if p, ok := errdefs.PublicOf(err); ok {
			msg = p.Message
		}
		return out, errdefs.Invalid("TENANT::INVALID_QUOTA", "quota: "+msg)
	}
	out.CPUMillis, out.MemoryBytes = res.CPUMillis, res.MemoryBytes
	return out, nil
}

func (s *Server) putTenant(w http.ResponseWriter, r *http.Request) error {
	reg, err := s.registry()
	if err != nil {
		return err
	}
	if err := tenantInScope(r, r.PathValue("tenantName")); err != nil {
		return err
	}
	var body lifecycleapi.PutTenantRequest
	if err := web.DecodeJSON(r, &body, true); err != nil {
		return err
	}
	q, err := quotaIn(body.Quota)
	if err != nil {
		return err
	}
	t, created, err := reg.PutTenant(r.Context(), r.PathValue("tenantName"), q)
	if err != nil {
		return err
	}
	status := http.StatusOK
	if created {
		status = http.StatusCreated
	}
	web.WriteJSON(w, status, s.tenantJSON(t))
	return nil
}

func (s *Server) deleteTenant(w http.ResponseWriter, r *http.Request) error {
	reg, err := s.registry()
	if err != nil {
		return err
	}
	if err := tenantInScope(r, r.PathValue("tenantName")); err != nil {
		return err
	}
	var inUse func(string) string
	if s.svc != nil {
		inUse = s.svc.TenantInUse
	}
	if err := reg.DeleteTenant(r.Context(), r.PathValue("tenantName"), inUse); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// tenantInScope answers a tenant outside the caller's scope (an admin
// narrowed with X-Moat-Tenant, or another role naming another tenant) as
// not found, as if it did not exist.
func tenantInScope(r *http.Request, name string) error {
	if tenant.ScopeOf(r.Context()).Sees(name) {
		return nil
	}
	return errdefs.WithPublic(fmt.Errorf("tenant %q: %w", name, errdefs.ErrNotFound), "TENANT::NOT_FOUND", fmt.Sprintf("tenant %s not found", name))
}

// Tenant egress guardrails: GET for every role in scope, PUT and DELETE
// for the platform role. The change reaches the tenant's sandboxes at once
// (lifecycle.Service.ApplyGuardrail).

// egressJSON is the wire form of a tenant's guardrail.
func egressJSON(name string, p *policy.NetworkPolicy, applied *int) (lifecycleapi.TenantEgress, error) {
	out := lifecycleapi.TenantEgress{Tenant: name, Applied: applied}
	if p != nil {
		b, err := json.Marshal(p)
		if err != nil {
			return out, err
		}
		out.Policy = &lifecycleapi.NetworkPolicy{}
		if err := json.Unmarshal(b, out.Policy); err != nil {
			return out, err
		}
	}
	return out, nil
}

func (s *Server) getTenantEgress(w http.ResponseWriter, r *http.Request) error {
	reg, err := s.registry()
	if err != nil {
		return err
	}
	name := r.PathValue("tenantName")
	if err := tenantInScope(r, name); err != nil {
		return err
	}
	t, err := reg.Tenant(name)
	if err != nil {
		return err
	}
	out, err := egressJSON(t.Name, t.Egress, nil)
	if err != nil {
		return err
	}
	web.WriteJSON(w, http.StatusOK, out)
	return nil
}

// codeInvalidEgress is the code of a guardrail that does not parse.
const codeInvalidEgress = "TENANT::INVALID_EGRESS_POLICY"

func (s *Server) putTenantEgress(w http.ResponseWriter, r *http.Request) error {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, 1<<20))
	if err != nil {
		return errdefs.Invalid(codeInvalidEgress, "egress policy: request body unreadable or larger than 1 MiB")
	}
	if strings.TrimSpace(string(body)) == "" {
		return errdefs.Invalid(codeInvalidEgress, "egress policy: a body is required (a networkPolicy object; {} denies all egress)")
	}
	p, err := policy.Parse(body)
	if err != nil {
		msg := "invalid policy"
		if pub, ok := errdefs.PublicOf(err); ok {
			msg = pub.Message
		}
		return errdefs.Invalid(codeInvalidEgress, "egress policy: "+msg)
	}
	return s.setTenantEgress(w, r, &p)
}

func (s *Server) deleteTenantEgress(w http.ResponseWriter, r *http.Request) error {
	return s.setTenantEgress(w, r, nil)
}

// setTenantEgress records tenant's guardrail p (nil: none) and applies it
// to the tenant's sandboxes.
func (s *Server) setTenantEgress(w http.ResponseWriter, r *http.Request, p *policy.NetworkPolicy) error {
	reg, err := s.registry()
	if err != nil {
		return err
	}
	name := r.PathValue("tenantName")
	if err := tenantInScope(r, name); err != nil {
		return err
	}
	if p != nil && (s.svc == nil || !s.svc.EnforcesEgress()) {
		return errdefs.WithPublic(errdefs.ErrNotImplemented, "SANDBOX::API_NOT_SUPPORTED",
			"this server's runtime enforces no egress policy: a tenant guardrail cannot be enforced")
	}
	t, err := reg.SetEgress(r.Context(), name, p)
	if err != nil {
		return err
	}
	n := 0
	if s.svc != nil {
		// Failures are logged per sandbox; the guardrail is recorded and
		// re-applied to each sandbox at its next attach or restart.
		n, _ = s.svc.ApplyGuardrail(context.WithoutCancel(r.Context()), name)
	}
	out, err := egressJSON(t.Name, t.Egress, &n)
	if err != nil {
		return err
	}
	web.WriteJSON(w, http.StatusOK, out)
	return nil
}

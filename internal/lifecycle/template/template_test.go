package template_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/moat-sandbox/moat/internal/agentproto"
	"github.com/moat-sandbox/moat/internal/errdefs"
	"github.com/moat-sandbox/moat/internal/lifecycle"
	"github.com/moat-sandbox/moat/internal/lifecycle/template"
	"github.com/moat-sandbox/moat/internal/store"
	"github.com/moat-sandbox/moat/internal/tenant"
)

func as(name string) context.Context {
	return tenant.WithPrincipal(context.Background(), tenant.Principal{KeyID: "k-" + name, Tenant: name, Role: tenant.RoleOperator})
}

func ids(ts []template.Template) []string {
	var out []string
	for _, t := range ts {
		out = append(out, t.ID)
	}
	return out
}

func TestCreateGetListDelete(t *testing.T) {
	db := store.NewMemory()
	s := template.New(db, func() time.Time { return time.Unix(1e9, 0) })
	acme, other := as("acme"), as("other")

	got, err := s.Create(acme, template.Template{ID: "py", Image: "python:3", Env: map[string]string{"A": "1"}, User: "root"})
	if err != nil || got.Tenant != "acme" || got.CreatedAt.IsZero() {
		t.Fatalf("create: %+v %v", got, err)
	}
	if _, err := s.Create(acme, template.Template{ID: "py", Image: "x"}); !errdefs.IsAlreadyExists(err) {
		t.Fatalf("duplicate create: %v", err)
	}
	if g, err := s.Get(acme, "py"); err != nil || g.Image != "python:3" || g.Env["A"] != "1" {
		t.Fatalf("get: %+v %v", g, err)
	}
	// Another tenant sees neither the template nor that it exists.
	if _, err := s.Get(other, "py"); !errdefs.IsNotFound(err) {
		t.Fatalf("other tenant's get: %v", err)
	}
	if err := s.Delete(other, "py"); !errdefs.IsNotFound(err) {
		t.Fatalf("other tenant's delete: %v", err)
	}
	// The same id in another tenant is another template.
	if _, err := s.Create(other, template.Template{ID: "py", Image: "python:2"}); err != nil {
		t.Fatal(err)
	}
	l, err := s.List(acme)
	if err != nil || !slices.Equal(ids(l), []string{"base", "code-interpreter-v1", "py"}) {
		t.Fatalf("list: %v %v", ids(l), err)
	}
	// A context of no principal (the server) sees every tenant's.
	all, _ := s.List(context.Background())
	if !slices.Equal(ids(all), []string{"base", "code-interpreter-v1", "py", "py"}) {
		t.Fatalf("list of all: %v", ids(all))
	}
	if n := s.TenantTemplates("acme"); n != 1 {
		t.Fatalf("TenantTemplates = %d", n)
	}
	if err := s.Delete(acme, "py"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Get(acme, "py"); !errdefs.IsNotFound(err) {
		t.Fatalf("get after delete: %v", err)
	}
	if g, err := s.Get(other, "py"); err != nil || g.Image != "python:2" {
		t.Fatalf("other tenant's template after delete: %+v %v", g, err)
	}
}

func TestBuiltinsAndShadowing(t *testing.T) {
	s := template.New(store.NewMemory(), nil)
	acme := as("acme")
	b, err := s.Get(acme, "base")
	if err != nil || !b.BuiltIn || b.Image != "moat-e2b-base:latest" {
		t.Fatalf("base: %+v %v", b, err)
	}
	ci, err := s.Get(acme, "code-interpreter-v1")
	if err != nil || ci.Image != "moat-e2b-code-interpreter:latest" {
		t.Fatalf("code-interpreter-v1: %+v %v", ci, err)
	}
	if err := s.Delete(acme, "base"); !errdefs.IsFailedPrecondition(err) {
		t.Fatalf("delete built-in: %v", err)
	}
	if _, err := s.Create(acme, template.Template{ID: "base", Image: "my-base:1"}); err != nil {
		t.Fatal(err)
	}
	if g, _ := s.Get(acme, "base"); g.Image != "my-base:1" || g.BuiltIn {
		t.Fatalf("replaced base: %+v", g)
	}
	if g, _ := s.Get(as("other"), "base"); g.Image != "moat-e2b-base:latest" {
		t.Fatalf("other tenant's base: %+v", g)
	}
	l, _ := s.List(acme)
	if !slices.Equal(ids(l), []string{"base", "code-interpreter-v1"}) || l[0].BuiltIn {
		t.Fatalf("list with a replaced built-in: %+v", l)
	}
	if err := s.Delete(acme, "base"); err != nil {
		t.Fatal(err)
	}
	if g, _ := s.Get(acme, "base"); !g.BuiltIn {
		t.Fatalf("base after deleting its replacement: %+v", g)
	}
}

func TestValidate(t *testing.T) {
	s := template.New(store.NewMemory(), nil)
	for _, tc := range []template.Template{
		{ID: "", Image: "x"},
		{ID: "Upper", Image: "x"},
		{ID: "a/b", Image: "x"},
		{ID: "-a", Image: "x"},
		{ID: "ok"},
		{ID: "ok", Image: "x", Pool: "p"},
		{ID: "ok", Pool: "p", Entrypoint: []string{"sh"}},
		{ID: "ok", Image: "x", ResourceLimits: map[string]string{"cpu": "lots"}},
		{ID: "ok", Image: "x", Env: map[string]string{"A=B": "1"}},
		{ID: "ok", Image: "x", Workdir: "relative"},
		{ID: "ok", Image: "x", TimeoutSeconds: -1},
	} {
		if _, err := s.Create(context.Background(), tc); !errdefs.IsInvalidArgument(err) {
			t.Errorf("create %+v: %v, want invalid", tc, err)
		}
	}
	if _, err := s.Get(context.Background(), "../x"); !errdefs.IsInvalidArgument(err) {
		t.Errorf("get of a malformed id: %v", err)
	}
}

func TestApply(t *testing.T) {
	tp := template.Template{ID: "py", Image: "python:3", Env: map[string]string{"A": "1", "B": "2"},
		ResourceLimits: map[string]string{"cpu": "1", "memory": "1Gi"}, User: "user", Workdir: "/home/user", TimeoutSeconds: 600}
	req := lifecycle.CreateRequest{Env: map[string]string{"B": "req"}, ResourceLimits: map[string]string{"memory": "2Gi"}}
	if err := template.Apply(tp, &req); err != nil {
		t.Fatal(err)
	}
	if req.Image != "python:3" || !slices.Equal(req.Entrypoint, template.DefaultEntrypoint) || req.Timeout != 600*time.Second {
		t.Fatalf("applied: %+v", req)
	}
	if req.Env["A"] != "1" || req.Env["B"] != "req" || req.Env[agentproto.EnvdUserEnv] != "user" ||
		req.Env[agentproto.EnvdWorkdirEnv] != "/home/user" || req.Env[agentproto.EnvdTemplateEnv] != "py" {
		t.Fatalf("env: %v", req.Env)
	}
	if req.ResourceLimits["cpu"] != "1" || req.ResourceLimits["memory"] != "2Gi" || req.Extensions[lifecycle.ExtTemplate] != "py" {
		t.Fatalf("resources %v extensions %v", req.ResourceLimits, req.Extensions)
	}
	if tp.Env["B"] != "2" || tp.ResourceLimits["memory"] != "1Gi" {
		t.Fatalf("Apply changed the template: %+v", tp)
	}
	// A request's own timeout and entrypoint stay.
	req = lifecycle.CreateRequest{Timeout: time.Minute, Entrypoint: []string{"sh"}}
	template.Apply(tp, &req)
	if req.Timeout != time.Minute || !slices.Equal(req.Entrypoint, []string{"sh"}) {
		t.Fatalf("request's own values: %+v", req)
	}
	// A pooled template makes the create a claim.
	req = lifecycle.CreateRequest{}
	if err := template.Apply(template.Template{ID: "warm", Pool: "py-pool"}, &req); err != nil {
		t.Fatal(err)
	}
	if req.Extensions[lifecycle.ExtPoolRef] != "py-pool" || req.Image != "" || len(req.Entrypoint) != 0 {
		t.Fatalf("pooled: %+v", req)
	}
	for _, bad := range []lifecycle.CreateRequest{
		{SnapshotID: "s"},
		{Image: "other:1"},
	} {
		if err := template.Apply(tp, &bad); !errdefs.IsInvalidArgument(err) {
			t.Errorf("apply to %+v: %v", bad, err)
		}
	}
	bad := lifecycle.CreateRequest{Extensions: map[string]string{lifecycle.ExtPoolRef: "elsewhere"}}
	if err := template.Apply(template.Template{ID: "warm", Pool: "py-pool"}, &bad); !errdefs.IsInvalidArgument(err) {
		t.Errorf("apply with another pool: %v", err)
	}
}

package client

import (
	"context"
	"testing"
)

func TestTemplates(t *testing.T) {
	const tmpl = `{"id":"py","image":"python:3","env":{"A":"1"},"user":"user","tenant":"acme","createdAt":"2026-01-02T03:04:00Z"}`
	f := newFake(t)
	f.handle("POST /v1/templates", raw(201, tmpl))
	f.handle("GET /v1/templates", raw(200, `{"items":[{"id":"base","image":"moat-e2b-base:latest","builtIn":true},`+tmpl+`]}`))
	f.handle("GET /v1/templates/{id}", raw(404, `{"code":"TEMPLATE::NOT_FOUND","message":"template x not found"}`))
	f.handle("DELETE /v1/templates/{id}", raw(204, ``))
	f.handle("POST /v1/sandboxes", raw(202, `{"id":"a","status":{"state":"Running"},"metadata":{},"entrypoint":["sh"],"createdAt":"2026-01-02T03:04:00Z"}`))
	c := mustClient(t, f.srv.URL)
	ctx := context.Background()
	got, err := c.CreateTemplate(ctx, TemplateSpec{ID: "py", Image: "python:3", Env: map[string]string{"A": "1"}, User: "user"})
	if err != nil || got.ID != "py" || got.Tenant != "acme" || got.CreatedAt.IsZero() || got.Env["A"] != "1" {
		t.Fatalf("create %+v %v", got, err)
	}
	b := decodeBody(t, f.last("/v1/templates").Body)
	if b["id"] != "py" || b["image"] != "python:3" || b["user"] != "user" {
		t.Fatalf("create body %v", b)
	}
	if _, ok := b["pool"]; ok {
		t.Fatalf("unset pool sent: %v", b)
	}
	ts, err := c.ListTemplates(ctx)
	if err != nil || len(ts) != 2 || !ts[0].BuiltIn || ts[1].ID != "py" {
		t.Fatalf("list %+v %v", ts, err)
	}
	if _, err := c.GetTemplate(ctx, "x"); !IsNotFound(err) {
		t.Fatalf("get unknown: %v", err)
	}
	if err := c.DeleteTemplate(ctx, "py"); err != nil {
		t.Fatal(err)
	}
	if _, err := c.CreateSandbox(ctx, CreateRequest{TemplateID: "py"}); err != nil {
		t.Fatal(err)
	}
	if b := decodeBody(t, f.last("/v1/sandboxes").Body); b["templateId"] != "py" {
		t.Fatalf("create sandbox body %v", b)
	}
}

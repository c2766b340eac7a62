package httpapi_test

import (
	"net/http"
	"testing"
)

func TestTemplateRoutesAndTemplateID(t *testing.T) {
	srv := newAPI(t)
	code, m, _ := call(t, srv, "GET", "/v1/templates", "")
	if code != 200 || len(m["items"].([]any)) != 2 {
		t.Fatalf("list built-ins: %d %v", code, m)
	}
	code, m, _ = call(t, srv, "POST", "/v1/templates", `{"id":"py","image":"python:3","entrypoint":["sleep","infinity"],"env":{"A":"1"},"resourceLimits":{"cpu":"1"},"timeoutSeconds":600,"user":"user","workdir":"/home/user"}`)
	if code != http.StatusCreated || m["id"] != "py" || m["image"] != "python:3" || m["createdAt"] == nil {
		t.Fatalf("create: %d %v", code, m)
	}
	if code, m, _ = call(t, srv, "POST", "/templates", `{"id":"py","image":"x"}`); code != http.StatusConflict || m["code"] != "TEMPLATE::ALREADY_EXISTS" {
		t.Fatalf("duplicate: %d %v", code, m)
	}
	for _, body := range []string{`{"id":"Bad Id","image":"x"}`, `{"id":"x"}`, `{"id":"x","image":"a","pool":"p"}`, `{"id":"x","image":"a","resourceLimits":{"cpu":"lots"}}`, `[]`} {
		if code, m, _ = call(t, srv, "POST", "/v1/templates", body); code != http.StatusBadRequest {
			t.Errorf("create %s: %d %v", body, code, m)
		}
	}
	if code, m, _ = call(t, srv, "GET", "/v1/templates/py", ""); code != 200 || m["timeoutSeconds"].(float64) != 600 {
		t.Fatalf("get: %d %v", code, m)
	}
	if code, m, _ = call(t, srv, "GET", "/v1/templates/nope", ""); code != 404 || m["code"] != "TEMPLATE::NOT_FOUND" {
		t.Fatalf("get unknown: %d %v", code, m)
	}

	// Create from the template: its image, entrypoint and timeout.
	code, m, _ = call(t, srv, "POST", "/v1/sandboxes", `{"templateId":"py","metadata":{"app":"x"}}`)
	if code != http.StatusAccepted {
		t.Fatalf("create from template: %d %v", code, m)
	}
	id := m["id"].(string)
	if _, ok := m["expiresAt"]; !ok {
		t.Fatalf("the template's timeout is not applied: %v", m)
	}
	_, m, _ = call(t, srv, "GET", "/v1/sandboxes/"+id, "")
	if m["image"].(map[string]any)["uri"] != "python:3" || m["entrypoint"].([]any)[0] != "sleep" {
		t.Fatalf("sandbox from template: %v", m)
	}
	for _, body := range []string{`{"templateId":"py","image":{"uri":"other"},"entrypoint":["sh"]}`, `{"templateId":"py","snapshotId":"s"}`} {
		if code, m, _ = call(t, srv, "POST", "/v1/sandboxes", body); code != http.StatusBadRequest {
			t.Errorf("create %s: %d %v", body, code, m)
		}
	}
	if code, m, _ = call(t, srv, "POST", "/v1/sandboxes", `{"templateId":"nope"}`); code != 404 || m["code"] != "TEMPLATE::NOT_FOUND" {
		t.Fatalf("create from an unknown template: %d %v", code, m)
	}
	// The built-in base and a batch from a template.
	if code, m, _ = call(t, srv, "POST", "/v1/sandboxes/batch", `{"count":2,"templateId":"base","timeout":120}`); code != http.StatusAccepted || len(m["items"].([]any)) != 2 {
		t.Fatalf("batch from base: %d %v", code, m)
	}

	if code, m, _ = call(t, srv, "DELETE", "/v1/templates/base", ""); code != http.StatusConflict || m["code"] != "TEMPLATE::BUILT_IN" {
		t.Fatalf("delete built-in: %d %v", code, m)
	}
	if code, _, _ = call(t, srv, "DELETE", "/v1/templates/py", ""); code != http.StatusNoContent {
		t.Fatalf("delete: %d", code)
	}
	if code, _, _ = call(t, srv, "DELETE", "/v1/templates/py", ""); code != 404 {
		t.Fatalf("delete again: %d", code)
	}
	// The sandbox made from it stays.
	if code, _, _ = call(t, srv, "GET", "/v1/sandboxes/"+id, ""); code != 200 {
		t.Fatalf("sandbox after its template was deleted: %d", code)
	}
}

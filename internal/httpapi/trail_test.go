package httpapi_test

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/moat-sandbox/moat/internal/audit/trail"
	"github.com/moat-sandbox/moat/internal/gen/lifecycleapi"
	"github.com/moat-sandbox/moat/internal/gen/wirecheck"
	"github.com/moat-sandbox/moat/internal/httpapi"
	"github.com/moat-sandbox/moat/internal/lifecycle"
	"github.com/moat-sandbox/moat/internal/runtime/fake"
	"github.com/moat-sandbox/moat/internal/sandbox"
	"github.com/moat-sandbox/moat/internal/store"
	"github.com/moat-sandbox/moat/internal/tenant"
)

// newTrailAPI is a two-tenant server (acme and beta, an operator key
// each) keeping audit trails under dir.
func newTrailAPI(t *testing.T, dir string) (*tenantAPI, *trail.Store) {
	t.Helper()
	db, err := store.Open(context.Background(), filepath.Join(t.TempDir(), "s.db"), time.Second)
	if err != nil {
		t.Fatal(err)
	}
	reg, err := tenant.Open(db, tenant.Options{RootKey: key})
	if err != nil {
		t.Fatal(err)
	}
	rt := fake.New(fake.Hooks{})
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	svc, err := sandbox.New(sandbox.Config{}, sandbox.Deps{Deps: lifecycle.Deps{Store: db, Runtime: rt, Images: images{}, Log: log, Quotas: reg}})
	if err != nil {
		t.Fatal(err)
	}
	tr, err := trail.Open(trail.Options{Dir: dir, Exists: func(id string) bool {
		_, err := svc.Get(context.Background(), id)
		return err == nil
	}})
	if err != nil {
		t.Fatal(err)
	}
	ta := &tenantAPI{reg: reg, svc: svc, keys: map[string]string{"root": key}, ids: map[string]string{"root": tenant.RootKeyID}}
	for _, tn := range []string{"acme", "beta"} {
		k, tok, err := reg.CreateKey(context.Background(), tenant.NewKey{Tenant: tn, Role: tenant.RoleOperator})
		if err != nil {
			t.Fatal(err)
		}
		ta.keys[tn+"-operator"], ta.ids[tn+"-operator"] = tok, k.ID
	}
	ta.api = httpapi.New(httpapi.Config{Auth: reg, Trail: tr}, svc, log)
	ta.srv = httptest.NewServer(ta.api.Handler())
	t.Cleanup(func() { ta.srv.Close(); svc.Close(); rt.Close(); db.Close() })
	return ta, tr
}

func auditPage(t *testing.T, ta *tenantAPI, who, id, query string) (int, lifecycleapi.AuditPage, map[string]any) {
	t.Helper()
	req, _ := http.NewRequest("GET", ta.srv.URL+"/v1/sandboxes/"+id+"/audit"+query, nil)
	req.Header.Set("OPEN-SANDBOX-API-KEY", ta.keys[who])
	resp, err := ta.srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	var page lifecycleapi.AuditPage
	var m map[string]any
	json.Unmarshal(raw, &m)
	if resp.StatusCode == 200 {
		wirecheck.Response[lifecycleapi.AuditPage](t, "GET audit", json.RawMessage(raw))
		if err := json.Unmarshal(raw, &page); err != nil {
			t.Fatal(err)
		}
	}
	return resp.StatusCode, page, m
}

func TestAuditTrailRecordsCallsCommandsFiles(t *testing.T) {
	dir := t.TempDir()
	ta, _ := newTrailAPI(t, dir)
	const secretEnv = "s3cr3t-env-value"
	code, body := ta.do(t, "acme-operator", "POST", "/v1/sandboxes", createBody)
	if code != 202 {
		t.Fatalf("create: %d %v", code, body)
	}
	id := body["id"].(string)
	if code, _ := ta.do(t, "acme-operator", "POST", "/v1/sandboxes/"+id+"/pause", ""); code != 202 {
		t.Fatalf("pause: %d", code)
	}
	ta.do(t, "acme-operator", "POST", "/v1/sandboxes/"+id+"/resume", "")
	// Through the server proxy to the agent (the fake agent answers 404,
	// which is recorded as the status).
	agent := "/v1/sandboxes/" + id + "/proxy/44772"
	ta.do(t, "acme-operator", "POST", agent+"/command", `{"command":"echo hi","cwd":"/tmp","uid":1000,"envs":{"TOKEN":"`+secretEnv+`"}}`)
	ta.do(t, "acme-operator", "POST", agent+"/files/mv", `[{"src":"/a","dest":"/b"}]`)
	ta.do(t, "acme-operator", "DELETE", agent+"/files?path=/c&path=/d", "")
	ta.do(t, "acme-operator", "GET", agent+"/files/info?path=/a", "") // a read: not recorded
	code, page, m := auditPage(t, ta, "acme-operator", id, "")
	if code != 200 {
		t.Fatalf("audit: %d %v", code, m)
	}
	var got []string
	for _, r := range page.Items {
		got = append(got, string(r.Kind)+"/"+r.Action)
	}
	want := "lifecycle/create lifecycle/pause lifecycle/resume command/run file/move file/remove"
	if strings.Join(got, " ") != want {
		t.Fatalf("records %v, want %s", got, want)
	}
	create := page.Items[0]
	if create.Actor == nil || create.Actor.KeyID == nil || *create.Actor.KeyID != ta.ids["acme-operator"] || *create.Actor.Tenant != "acme" ||
		*create.Actor.Role != "operator" || create.RequestID == nil || *create.RequestID == "" || *create.Status != 202 || *create.Tenant != "acme" {
		t.Fatalf("create record: %+v", create)
	}
	cmd := page.Items[3]
	if cmd.Command == nil || *cmd.Command.Line != "echo hi" || *cmd.Command.Cwd != "/tmp" || *cmd.Command.UID != 1000 || cmd.DurationMs == nil {
		t.Fatalf("command record: %+v", cmd.Command)
	}
	mv, rm := page.Items[4], page.Items[5]
	if len(*mv.Files) != 1 || (*mv.Files)[0].Path != "/a" || *(*mv.Files)[0].Dest != "/b" || len(*rm.Files) != 2 || (*rm.Files)[1].Path != "/d" {
		t.Fatalf("file records: %+v %+v", mv.Files, rm.Files)
	}

	// Paging and filters.
	code, p1, _ := auditPage(t, ta, "acme-operator", id, "?limit=2")
	if code != 200 || len(p1.Items) != 2 || p1.NextCursor == nil {
		t.Fatalf("page 1: %d %+v", code, p1)
	}
	_, p2, _ := auditPage(t, ta, "acme-operator", id, "?limit=10&cursor="+*p1.NextCursor)
	if len(p2.Items) != 4 || p2.Items[0].Seq != 3 || p2.NextCursor != nil {
		t.Fatalf("page 2: %+v", p2)
	}
	_, lc, _ := auditPage(t, ta, "acme-operator", id, "?kind=command,file")
	if len(lc.Items) != 3 {
		t.Fatalf("kind filter: %+v", lc.Items)
	}
	_, none, _ := auditPage(t, ta, "acme-operator", id, "?since="+time.Now().Add(time.Hour).UTC().Format(time.RFC3339))
	if len(none.Items) != 0 {
		t.Fatalf("since the future: %+v", none.Items)
	}
	for q, wantCode := range map[string]string{
		"?cursor=abc": "SANDBOX::INVALID_CURSOR", "?cursor=0": "SANDBOX::INVALID_CURSOR",
		"?kind=output": "SANDBOX::INVALID_PARAMETER", "?since=yesterday": "SANDBOX::INVALID_PARAMETER",
		"?until=1": "SANDBOX::INVALID_PARAMETER", "?limit=0": "SANDBOX::INVALID_PARAMETER", "?limit=5000": "SANDBOX::INVALID_PARAMETER",
	} {
		code, _, m := auditPage(t, ta, "acme-operator", id, q)
		if code != 400 || m["code"] != wantCode || m["message"] == "" {
			t.Fatalf("%s: %d %v, want 400 %s", q, code, m, wantCode)
		}
	}

	// Another tenant sees nothing, before and after the delete.
	if code, _, m := auditPage(t, ta, "beta-operator", id, ""); code != 404 || m["code"] != "SANDBOX::NOT_FOUND" {
		t.Fatalf("beta reads acme's trail: %d %v", code, m)
	}
	if code, _ := ta.do(t, "acme-operator", "DELETE", "/v1/sandboxes/"+id, ""); code != 204 {
		t.Fatalf("delete: %d", code)
	}
	code, after, _ := auditPage(t, ta, "acme-operator", id, "")
	if code != 200 || len(after.Items) != 7 || after.Items[6].Action != "delete" {
		t.Fatalf("after delete: %d %+v", code, after.Items)
	}
	if code, _, _ := auditPage(t, ta, "beta-operator", id, ""); code != 404 {
		t.Fatalf("beta reads acme's deleted trail: %d", code)
	}
	if code, _, _ := auditPage(t, ta, "acme-operator", "nosuchsandbox", ""); code != 404 {
		t.Fatalf("unknown sandbox: %d", code)
	}
	// A refused call on another tenant's sandbox leaves no trail of a
	// sandbox that does not exist for it, and no secret is ever written.
	ta.do(t, "beta-operator", "DELETE", "/v1/sandboxes/nosuchsandbox", "")
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		b, _ := os.ReadFile(filepath.Join(dir, e.Name()))
		for _, secret := range []string{secretEnv, ta.keys["acme-operator"], key} {
			if strings.Contains(string(b), secret) {
				t.Fatalf("trail %s holds a secret %q", e.Name(), secret)
			}
		}
		if !strings.HasPrefix(e.Name(), id) {
			t.Fatalf("trail for %s: %s", id, e.Name())
		}
	}
}

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

	"github.com/moat-sandbox/moat/internal/audit"
	"github.com/moat-sandbox/moat/internal/httpapi"
	"github.com/moat-sandbox/moat/internal/lifecycle"
	"github.com/moat-sandbox/moat/internal/runtime/fake"
	"github.com/moat-sandbox/moat/internal/sandbox"
	"github.com/moat-sandbox/moat/internal/store"
)

func rawCall(t *testing.T, srv *httptest.Server, method, path string) (int, string, http.Header) {
	t.Helper()
	req, _ := http.NewRequest(method, srv.URL+path, nil)
	req.Header.Set("OPEN-SANDBOX-API-KEY", key)
	resp, err := srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), resp.Header
}

func TestDiagnostics(t *testing.T) {
	srv := newAPI(t)
	code, body, _ := call(t, srv, "POST", "/v1/sandboxes", createBody)
	if code != 202 {
		t.Fatalf("create %d %v", code, body)
	}
	id := body["id"].(string)
	if code, _, _ := call(t, srv, "POST", "/v1/sandboxes/"+id+"/pause", ""); code != 202 {
		t.Fatalf("pause %d", code)
	}

	// Stable form: JSON descriptor, inline.
	code, ev, _ := call(t, srv, "GET", "/v1/sandboxes/"+id+"/diagnostics/events?scope=lifecycle", "")
	if code != 200 || ev["kind"] != "events" || ev["scope"] != "lifecycle" || ev["delivery"] != "inline" ||
		ev["sandboxId"] != id || ev["truncated"] != false || !strings.HasPrefix(ev["contentType"].(string), "text/plain") {
		t.Fatalf("events descriptor %d %v", code, ev)
	}
	content := ev["content"].(string)
	for _, want := range []string{" lifecycle Created ", " lifecycle Started ", " lifecycle Paused "} {
		if !strings.Contains(content, want) {
			t.Errorf("events content lacks %q:\n%s", want, content)
		}
	}
	if int(ev["contentLength"].(float64)) != len(content) {
		t.Errorf("contentLength %v, content %d bytes", ev["contentLength"], len(content))
	}
	// Scope filters: nothing came from the runtime yet.
	if _, ev, _ := call(t, srv, "GET", "/sandboxes/"+id+"/diagnostics/events?scope=runtime", ""); ev["content"] != "" {
		t.Errorf("runtime scope: %v", ev)
	}
	if _, ev, _ := call(t, srv, "GET", "/sandboxes/"+id+"/diagnostics/events?scope=network", ""); ev["content"] != "" || ev["warnings"] == nil {
		t.Errorf("network scope should be empty with a warning: %v", ev)
	}
	code, lg, _ := call(t, srv, "GET", "/v1/sandboxes/"+id+"/diagnostics/logs?scope=container", "")
	if code != 200 || lg["kind"] != "logs" || !strings.Contains(lg["content"].(string), "fake agent of "+id) {
		t.Fatalf("logs descriptor %d %v", code, lg)
	}
	// A scope moat does not know answers nothing, with a warning.
	for _, kind := range []string{"logs", "events"} {
		code, d, _ := call(t, srv, "GET", "/v1/sandboxes/"+id+"/diagnostics/"+kind+"?scope=Kubelet", "")
		if code != 200 || d["content"] != "" || d["scope"] != "kubelet" || d["warnings"] == nil {
			t.Errorf("unknown %s scope: %d %v", kind, code, d)
		}
	}
	// Bad and missing things.
	for _, tc := range []struct {
		path, code string
		status     int
	}{
		{"/v1/sandboxes/" + id + "/diagnostics/events?scope=", "SANDBOX::INVALID_PARAMETER", 400},
		{"/v1/sandboxes/nope/diagnostics/logs?scope=all", "SANDBOX::NOT_FOUND", 404},
		{"/v1/sandboxes/nope/diagnostics/events", "SANDBOX::NOT_FOUND", 404},
		{"/v1/sandboxes/nope/diagnostics/summary", "SANDBOX::NOT_FOUND", 404},
	} {
		code, b, _ := call(t, srv, "GET", tc.path, "")
		if code != tc.status || b["code"] != tc.code {
			t.Errorf("%s: %d %v, want %d %s", tc.path, code, b, tc.status, tc.code)
		}
	}

	// Legacy form: plain text, Deprecation header.
	for _, p := range []string{"logs", "events", "inspect", "summary"} {
		code, text, hdr := rawCall(t, srv, "GET", "/v1/sandboxes/"+id+"/diagnostics/"+p)
		if code != 200 || hdr.Get("Deprecation") != "true" || !strings.HasPrefix(hdr.Get("Content-Type"), "text/plain") || text == "" {
			t.Errorf("legacy %s: %d %q %v", p, code, text, hdr)
		}
		if strings.Contains(text, "agentToken") || strings.Contains(text, "X-EXECD") {
			t.Errorf("legacy %s leaks a token field: %s", p, text)
		}
	}
	_, inspect, _ := rawCall(t, srv, "GET", "/v1/sandboxes/"+id+"/diagnostics/inspect")
	if !strings.Contains(inspect, "state:") || !strings.Contains(inspect, "Paused") {
		t.Errorf("inspect: %s", inspect)
	}

	// A deleted sandbox keeps its events.
	if code, _, _ := call(t, srv, "DELETE", "/v1/sandboxes/"+id, ""); code != 204 {
		t.Fatal("delete")
	}
	code, ev, _ = call(t, srv, "GET", "/v1/sandboxes/"+id+"/diagnostics/events?scope=all", "")
	if code != 200 || !strings.Contains(ev["content"].(string), " Deleted ") {
		t.Fatalf("events after delete: %d %v", code, ev)
	}
	if code, _, _ := call(t, srv, "GET", "/v1/sandboxes/"+id+"/diagnostics/logs?scope=all", ""); code != 404 {
		t.Fatalf("logs of a deleted sandbox: %d", code)
	}
}

func TestAuditLog(t *testing.T) {
	db, err := store.Open(context.Background(), filepath.Join(t.TempDir(), "s.db"), time.Second)
	if err != nil {
		t.Fatal(err)
	}
	rt := fake.New(fake.Hooks{})
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	svc, err := sandbox.New(sandbox.Config{Config: lifecycle.Config{}}, sandbox.Deps{Deps: lifecycle.Deps{Store: db, Runtime: rt, Images: images{}, Log: log}})
	if err != nil {
		t.Fatal(err)
	}
	// A real file-backed log, to check the bytes on disk too.
	path := filepath.Join(t.TempDir(), "audit.log")
	al, err := audit.Open(path, audit.Options{})
	if err != nil {
		t.Fatal(err)
	}
	sink := &audit.Memory{}
	tee := teeSink{sink, al}
	srv := httptest.NewServer(httpapi.New(httpapi.Config{APIKey: key, Audit: tee}, svc, log).Handler())
	t.Cleanup(func() { srv.Close(); svc.Close(); rt.Close(); db.Close() })

	secretBody := `{"image":{"uri":"busybox","auth":{"username":"u","password":"hunter2-secret"}},"entrypoint":["tail","-f","/dev/null"],"env":{"TOKEN":"env-secret"}}`
	code, body, hdr := call(t, srv, "POST", "/v1/sandboxes", secretBody, "X-Request-ID", "req-create-1")
	if code != 202 {
		t.Fatalf("create %d %v", code, body)
	}
	id := body["id"].(string)
	call(t, srv, "GET", "/v1/sandboxes/"+id, "")           // not audited
	call(t, srv, "GET", "/v1/sandboxes", "")               // not audited
	call(t, srv, "POST", "/v1/sandboxes/"+id+"/pause", "") // 202
	call(t, srv, "POST", "/v1/sandboxes/"+id+"/pause", "") // 409
	call(t, srv, "DELETE", "/sandboxes/"+id, "", "OPEN-SANDBOX-API-KEY", "wrong-key-value")
	call(t, srv, "POST", "/v1/sandboxes/"+id+"/proxy/8080/x", "") // data plane: not audited
	call(t, srv, "DELETE", "/sandboxes/"+id, "")
	_ = hdr

	want := []struct {
		method, path string
		status       int
	}{
		{"POST", "/v1/sandboxes", 202},
		{"POST", "/v1/sandboxes/" + id + "/pause", 202},
		{"POST", "/v1/sandboxes/" + id + "/pause", 409},
		{"DELETE", "/sandboxes/" + id, 401},
		{"DELETE", "/sandboxes/" + id, 204},
	}
	recs := sink.Records()
	if len(recs) != len(want) {
		t.Fatalf("%d records, want %d: %+v", len(recs), len(want), recs)
	}
	for i, w := range want {
		r := recs[i]
		if r.Method != w.method || r.Path != w.path || r.Status != w.status || r.SandboxID != id ||
			r.RequestID == "" || r.RemoteAddr == "" || r.Time.IsZero() || r.DurationMS < 0 {
			t.Errorf("record %d = %+v, want %+v for sandbox %s", i, r, w, id)
		}
	}
	if recs[0].RequestID != "req-create-1" || recs[0].Route != "POST /v1/sandboxes" {
		t.Errorf("create record %+v", recs[0])
	}
	al.Close()
	raw, _ := io.ReadAll(mustOpen(t, path))
	lines := strings.Split(strings.TrimSpace(string(raw)), "\n")
	if len(lines) != len(want) {
		t.Fatalf("file has %d lines: %s", len(lines), raw)
	}
	for _, secret := range []string{key, "wrong-key-value", "hunter2-secret", "env-secret", "agentToken"} {
		if strings.Contains(string(raw), secret) {
			t.Errorf("audit log contains %q:\n%s", secret, raw)
		}
	}
	var first map[string]any
	if err := json.Unmarshal([]byte(lines[0]), &first); err != nil || first["sandboxId"] != id || first["status"] != float64(202) {
		t.Errorf("first line %s: %v", lines[0], err)
	}
}

type teeSink []httpapi.AuditSink

func (t teeSink) Write(r audit.Record) error {
	for _, s := range t {
		if err := s.Write(r); err != nil {
			return err
		}
	}
	return nil
}

func mustOpen(t *testing.T, p string) io.Reader {
	t.Helper()
	b, err := readFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return strings.NewReader(b)
}

func readFile(p string) (string, error) {
	b, err := os.ReadFile(p)
	return string(b), err
}

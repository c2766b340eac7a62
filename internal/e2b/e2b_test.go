package e2b_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/moat-sandbox/moat/internal/agentproto"
	"github.com/moat-sandbox/moat/internal/e2b"
	"github.com/moat-sandbox/moat/internal/httpapi"
	"github.com/moat-sandbox/moat/internal/image"
	"github.com/moat-sandbox/moat/internal/lifecycle"
	"github.com/moat-sandbox/moat/internal/lifecycle/pool"
	"github.com/moat-sandbox/moat/internal/lifecycle/template"
	"github.com/moat-sandbox/moat/internal/runtime"
	"github.com/moat-sandbox/moat/internal/runtime/fake"
	"github.com/moat-sandbox/moat/internal/sandbox"
	"github.com/moat-sandbox/moat/internal/store"
	"github.com/moat-sandbox/moat/internal/tenant"
)

const rootKey = "0123456789abcdef0123456789abcdef0123456789abcdef"

type images struct{}

func (images) Ensure(ctx context.Context, ref string, auth *image.Auth) (image.Image, error) {
	return image.Image{Name: ref}, nil
}

type committer struct{}

func (committer) Commit(ctx context.Context, upperDir, baseRef, name string) (image.Image, error) {
	return image.Image{Name: name}, nil
}
func (committer) Remove(ctx context.Context, ref string) error { return nil }

type harness struct {
	rt   *fake.Runtime
	srv  *httptest.Server
	svc  *sandbox.Service
	reg  *tenant.Registry
	mu   sync.Mutex
	envs map[string]map[string]string // sandbox id -> env the runtime got
}

func newHarness(t testing.TB) *harness {
	t.Helper()
	h := &harness{envs: map[string]map[string]string{}}
	db, err := store.Open(context.Background(), filepath.Join(t.TempDir(), "s.db"), time.Second)
	if err != nil {
		t.Fatal(err)
	}
	rt := fake.New(fake.Hooks{Create: func(spec runtime.Spec) error {
		h.mu.Lock()
		h.envs[spec.ID] = spec.Env
		h.mu.Unlock()
		return nil
	}})
	h.rt = rt
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	h.reg, err = tenant.Open(db, tenant.Options{RootKey: rootKey, Secret: bytes.Repeat([]byte{7}, tenant.SecretLen)})
	if err != nil {
		t.Fatal(err)
	}
	h.svc, err = sandbox.New(sandbox.Config{Config: lifecycle.Config{MaxTimeout: 24 * time.Hour}},
		sandbox.Deps{Deps: lifecycle.Deps{Store: db, Runtime: rt, Images: images{}, Log: log, Quotas: h.reg}, Committer: committer{}})
	if err != nil {
		t.Fatal(err)
	}
	api := e2b.New(e2b.Config{Domain: "sbx.example.test"}, h.svc, log)
	h.srv = httptest.NewServer(httpapi.New(httpapi.Config{Auth: h.reg, Faces: []httpapi.Face{api.Face()}}, h.svc, log).Handler())
	t.Cleanup(func() { h.srv.Close(); h.svc.Close(); rt.Close(); db.Close() })
	return h
}

func (h *harness) env(id string) map[string]string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.envs[id]
}

func (h *harness) key(t *testing.T, tenantName string, role tenant.Role) string {
	t.Helper()
	_, k, err := h.reg.CreateKey(context.Background(), tenant.NewKey{Tenant: tenantName, Role: role})
	if err != nil {
		t.Fatal(err)
	}
	return k
}

type resp struct {
	code int
	raw  []byte
	hdr  http.Header
}

func (r resp) obj(t testing.TB) map[string]any {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal(r.raw, &m); err != nil {
		t.Fatalf("not a JSON object (%d): %q", r.code, r.raw)
	}
	return m
}

func (r resp) list(t *testing.T) []map[string]any {
	t.Helper()
	var m []map[string]any
	if err := json.Unmarshal(r.raw, &m); err != nil {
		t.Fatalf("not a JSON array (%d): %q", r.code, r.raw)
	}
	return m
}

// e2bErr checks E2B's error envelope: {code: status, message}.
func (r resp) e2bErr(t *testing.T, status int) string {
	t.Helper()
	if r.code != status {
		t.Fatalf("status %d, want %d: %s", r.code, status, r.raw)
	}
	m := r.obj(t)
	if c, ok := m["code"].(float64); !ok || int(c) != status {
		t.Fatalf("error body %s is not E2B's {code:%d, message}", r.raw, status)
	}
	msg, _ := m["message"].(string)
	if msg == "" {
		t.Fatalf("error body %s has no message", r.raw)
	}
	return msg
}

// do sends an E2B request (X-API-KEY) or, with osKey, an OpenSandbox one.
func (h *harness) do(t testing.TB, key, method, path, body string, osAPI bool) resp {
	t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, _ := http.NewRequest(method, h.srv.URL+path, rd)
	if osAPI {
		req.Header.Set("OPEN-SANDBOX-API-KEY", key)
	} else if key != "" {
		req.Header.Set("X-API-KEY", key)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	res, err := h.srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	raw, _ := io.ReadAll(res.Body)
	return resp{code: res.StatusCode, raw: raw, hdr: res.Header}
}

func (h *harness) e2b(t testing.TB, method, path, body string) resp {
	t.Helper()
	return h.do(t, rootKey, method, path, body, false)
}

func (h *harness) os(t *testing.T, method, path, body string) resp {
	t.Helper()
	return h.do(t, rootKey, method, path, body, true)
}

func (h *harness) create(t testing.TB, body string) string {
	t.Helper()
	r := h.e2b(t, "POST", "/v2/sandboxes", body)
	if r.code != http.StatusCreated {
		t.Fatalf("create %s: %d %s", body, r.code, r.raw)
	}
	return r.obj(t)["sandboxID"].(string)
}

func TestCreateShapes(t *testing.T) {
	h := newHarness(t)
	for _, path := range []string{"/v2/sandboxes", "/sandboxes"} {
		r := h.e2b(t, "POST", path, `{"templateID":"base","metadata":{"k":"v"},"envVars":{"A":"1"},"timeout":120,"secure":true}`)
		if r.code != http.StatusCreated {
			t.Fatalf("%s: %d %s", path, r.code, r.raw)
		}
		m := r.obj(t)
		id, _ := m["sandboxID"].(string)
		if len(id) != lifecycle.IDLen || strings.Trim(id, "abcdefghijklmnopqrstuvwxyz0123456789") != "" {
			t.Fatalf("sandboxID %q is not in E2B's alphabet", id)
		}
		if m["templateID"] != "base" || m["clientID"] == "" || m["envdVersion"] != agentproto.EnvdVersion || m["domain"] != "sbx.example.test" {
			t.Fatalf("%s: Sandbox %v", path, m)
		}
		// The envd token is the agent's token.
		tok, _ := h.svc.AgentToken(context.Background(), id)
		if tok == "" || m["envdAccessToken"] != tok {
			t.Fatalf("envdAccessToken %v, agent token %q", m["envdAccessToken"], tok)
		}
		env := h.env(id)
		if env["A"] != "1" || env["E2B_SANDBOX"] != "true" || env[agentproto.EnvdTemplateEnv] != "base" ||
			env[agentproto.EnvdUserEnv] != "user" || env[agentproto.EnvdWorkdirEnv] != "/home/user" {
			t.Fatalf("sandbox env %v", env)
		}
		// The sandbox starts with its id: no second call to its agent.
		if env["E2B_SANDBOX_ID"] != id {
			t.Fatalf("sandbox env %v: no E2B_SANDBOX_ID", env)
		}
		if _, agentEnv, err := h.rt.AgentState(id); err != nil || len(agentEnv) != 0 {
			t.Fatalf("agent env %v, %v: want none applied after the start", agentEnv, err)
		}
		sb, _ := h.svc.Get(context.Background(), id)
		if sb.Image != "moat-e2b-base:latest" || sb.ExpiresAt == nil || sb.ExpiresAt.Sub(sb.CreatedAt) != 120*time.Second {
			t.Fatalf("record %+v", sb)
		}
	}
	// No templateID: base, and E2B's default timeouts (v2 300 s, v1 15 s).
	for path, want := range map[string]time.Duration{"/v2/sandboxes": 300 * time.Second, "/sandboxes": 15 * time.Second} {
		r := h.e2b(t, "POST", path, `{}`)
		if r.code != http.StatusCreated || r.obj(t)["templateID"] != "base" {
			t.Fatalf("%s without template: %d %s", path, r.code, r.raw)
		}
		sb, _ := h.svc.Get(context.Background(), r.obj(t)["sandboxID"].(string))
		if sb.ExpiresAt.Sub(sb.CreatedAt) != want {
			t.Fatalf("%s default timeout %v, want %v", path, sb.ExpiresAt.Sub(sb.CreatedAt), want)
		}
	}
	// A short timeout, as the SDK tests use, is fine.
	h.create(t, `{"templateID":"base","timeout":5}`)
}

func TestCreateBadInput(t *testing.T) {
	h := newHarness(t)
	for _, c := range []struct {
		body   string
		status int
	}{
		{`{"templateID":"nope"}`, 404},
		{`{"templateID":"base:v9"}`, 404},
		{`{"templateID":"Bad Template"}`, 400},
		{`{"templateID":"base","timeout":0}`, 400},
		{`{"templateID":"base","timeout":-5}`, 400},
		{`{"templateID":"base","timeout":1.5}`, 400},
		{`{"templateID":"base","timeout":"x"}`, 400},
		{`{"templateID":"base","timeout":999999999}`, 400},
		{`{"templateID":"base","envVars":{"A=B":"1"}}`, 400},
		{`{"templateID":"base","metadata":{"":"x"}}`, 400},
		{`{"templateID":"base","autoPause":true}`, 501},
		{`{"templateID":"base","mcp":{"x":{}}}`, 501},
		{`{"templateID":"base","volumeMounts":[{"name":"v","path":"/v"}]}`, 501},
		{`{"templateID":"base","allow_internet_access":false}`, 501}, // no egress on this server
		{`{"templateID":"base","network":{"allowPublicTraffic":false}}`, 501},
		{`not json`, 400},
		{``, 400},
	} {
		r := h.e2b(t, "POST", "/v2/sandboxes", c.body)
		msg := r.e2bErr(t, c.status)
		for _, leak := range []string{"/tmp", "goroutine", ".go:", "panic"} {
			if strings.Contains(msg, leak) {
				t.Errorf("%s: message %q leaks %q", c.body, msg, leak)
			}
		}
	}
	if n := h.e2b(t, "GET", "/v2/sandboxes", "").list(t); len(n) != 0 {
		t.Fatalf("failed creates left sandboxes: %v", n)
	}
	all, _ := h.svc.List(context.Background(), lifecycle.ListFilter{}, 1, 100)
	if len(all) != 0 {
		t.Fatalf("failed creates left %d sandboxes in the service", len(all))
	}
}

func TestGetKillPauseConnectTimeout(t *testing.T) {
	h := newHarness(t)
	id := h.create(t, `{"templateID":"base","timeout":60,"metadata":{"team":"ml"}}`)
	r := h.e2b(t, "GET", "/sandboxes/"+id, "")
	if r.code != 200 {
		t.Fatalf("get: %d %s", r.code, r.raw)
	}
	d := r.obj(t)
	for _, k := range []string{"templateID", "sandboxID", "clientID", "startedAt", "endAt", "envdVersion", "cpuCount", "memoryMB", "diskSizeMB", "state"} {
		if _, ok := d[k]; !ok {
			t.Errorf("SandboxDetail lacks %s: %v", k, d)
		}
	}
	if d["state"] != "running" || d["metadata"].(map[string]any)["team"] != "ml" || d["envdAccessToken"] == nil {
		t.Fatalf("detail %v", d)
	}

	// setTimeout overwrites the TTL (it may shorten it).
	if r := h.e2b(t, "POST", "/sandboxes/"+id+"/timeout", `{"timeout":30}`); r.code != 204 {
		t.Fatalf("timeout: %d %s", r.code, r.raw)
	}
	sb, _ := h.svc.Get(context.Background(), id)
	if left := time.Until(*sb.ExpiresAt); left > 31*time.Second || left < 20*time.Second {
		t.Fatalf("after setTimeout(30) expiry in %v", left)
	}
	h.e2b(t, "POST", "/sandboxes/"+id+"/timeout", `{"timeout":0}`).e2bErr(t, 400)
	h.e2b(t, "POST", "/sandboxes/"+id+"/timeout", `{}`).e2bErr(t, 400)
	// Connect to a running sandbox: 200, the TTL only grows.
	r = h.e2b(t, "POST", "/v2/sandboxes/"+id+"/connect", `{"timeout":10}`)
	if r.code != 200 || r.obj(t)["sandboxID"] != id || r.obj(t)["envdAccessToken"] == nil {
		t.Fatalf("connect: %d %s", r.code, r.raw)
	}
	sb2, _ := h.svc.Get(context.Background(), id)
	if !sb2.ExpiresAt.Equal(*sb.ExpiresAt) {
		t.Fatalf("connect with a shorter timeout moved the expiry %v -> %v", sb.ExpiresAt, sb2.ExpiresAt)
	}
	if r := h.e2b(t, "POST", "/sandboxes/"+id+"/connect", `{"timeout":600}`); r.code != 200 {
		t.Fatalf("v1 connect: %d %s", r.code, r.raw)
	}
	sb3, _ := h.svc.Get(context.Background(), id)
	if !sb3.ExpiresAt.After(*sb2.ExpiresAt) {
		t.Fatalf("connect with a longer timeout did not extend the expiry")
	}
	h.e2b(t, "POST", "/sandboxes/"+id+"/connect", `{}`).e2bErr(t, 400) // v1 needs timeout
	if r := h.e2b(t, "POST", "/sandboxes/"+id+"/refreshes", `{"duration":3600}`); r.code != 204 {
		t.Fatalf("refresh: %d %s", r.code, r.raw)
	}

	// Pause: 204, then 409; GET shows paused; connect resumes (201).
	if r := h.e2b(t, "POST", "/sandboxes/"+id+"/pause", `{}`); r.code != 204 {
		t.Fatalf("pause: %d %s", r.code, r.raw)
	}
	h.e2b(t, "POST", "/sandboxes/"+id+"/pause", `{}`).e2bErr(t, 409)
	if st := h.e2b(t, "GET", "/sandboxes/"+id, "").obj(t)["state"]; st != "paused" {
		t.Fatalf("state after pause %v", st)
	}
	if r := h.e2b(t, "POST", "/v2/sandboxes/"+id+"/connect", `{}`); r.code != 201 {
		t.Fatalf("connect to paused: %d %s", r.code, r.raw)
	}
	h.e2b(t, "POST", "/sandboxes/"+id+"/resume", `{}`).e2bErr(t, 409) // not paused
	if r := h.e2b(t, "POST", "/sandboxes/"+id+"/pause", ``); r.code != 204 {
		t.Fatalf("pause without a body: %d %s", r.code, r.raw)
	}
	if r := h.e2b(t, "POST", "/sandboxes/"+id+"/resume", `{"timeout":60}`); r.code != 201 {
		t.Fatalf("resume: %d %s", r.code, r.raw)
	}

	// Kill: 204, then 404 everywhere.
	if r := h.e2b(t, "DELETE", "/sandboxes/"+id, ""); r.code != 204 {
		t.Fatalf("kill: %d %s", r.code, r.raw)
	}
	for _, c := range [][2]string{{"DELETE", "/sandboxes/" + id}, {"GET", "/sandboxes/" + id}, {"POST", "/sandboxes/" + id + "/pause"},
		{"POST", "/v2/sandboxes/" + id + "/connect"}, {"POST", "/sandboxes/" + id + "/timeout"}, {"GET", "/sandboxes/" + id + "/metrics"},
		{"GET", "/sandboxes/" + id + "/logs"}, {"GET", "/v2/sandboxes/" + id + "/logs"}} {
		body := ""
		if c[0] == "POST" {
			body = `{"timeout":10}`
		}
		h.e2b(t, c[0], c[1], body).e2bErr(t, 404)
	}
}

func TestListFiltersAndPages(t *testing.T) {
	h := newHarness(t)
	var ids []string
	for i := range 5 {
		ids = append(ids, h.create(t, fmt.Sprintf(`{"templateID":"base","metadata":{"n":"%d","group":"a b/c","app":"x"}}`, i)))
		time.Sleep(2 * time.Millisecond) // distinct start times
	}
	if r := h.e2b(t, "POST", "/sandboxes/"+ids[0]+"/pause", `{}`); r.code != 204 {
		t.Fatal(r.code)
	}
	other := h.create(t, `{"templateID":"base","metadata":{"app":"y"}}`)

	all := h.e2b(t, "GET", "/v2/sandboxes", "")
	if l := all.list(t); len(l) != 6 || l[0]["sandboxID"] != other || all.hdr.Get("X-Next-Token") != "" || all.hdr.Get("X-Total-Running") != "5" {
		t.Fatalf("list: %d items, first %v, headers %v", len(l), l[0]["sandboxID"], all.hdr)
	}
	for _, l := range all.list(t) {
		if _, ok := l["envdAccessToken"]; ok {
			t.Fatalf("a listed sandbox carries its token: %v", l)
		}
	}
	// Metadata as the JS SDK encodes it: encodeURIComponent per key and
	// value, URLSearchParams, then the query serializer.
	enc := func(m string) string { return url.QueryEscape(m) }
	md := enc("group=" + url.QueryEscape("a b/c") + "&app=x")
	if l := h.e2b(t, "GET", "/v2/sandboxes?metadata="+md, "").list(t); len(l) != 5 {
		t.Fatalf("metadata filter: %d", len(l))
	}
	if l := h.e2b(t, "GET", "/v2/sandboxes?state=paused&metadata="+md, "").list(t); len(l) != 1 || l[0]["sandboxID"] != ids[0] || l[0]["state"] != "paused" {
		t.Fatalf("paused filter: %v", l)
	}
	if l := h.e2b(t, "GET", "/v2/sandboxes?state=running,paused&metadata="+enc("app=y"), "").list(t); len(l) != 1 || l[0]["sandboxID"] != other {
		t.Fatalf("app=y: %v", l)
	}
	// The free-form value round-trips, and the label-safe pairs are moat
	// metadata too.
	d := h.e2b(t, "GET", "/sandboxes/"+ids[1], "").obj(t)
	if d["metadata"].(map[string]any)["group"] != "a b/c" {
		t.Fatalf("metadata %v", d["metadata"])
	}
	if osv := h.os(t, "GET", "/v1/sandboxes/"+ids[1], "").obj(t); osv["metadata"].(map[string]any)["app"] != "x" {
		t.Fatalf("OpenSandbox view of metadata %v", osv["metadata"])
	}

	// Pages of 2 over the 6, newest first, then the same ascending.
	for _, order := range []string{"", "asc"} {
		var seen []string
		tok := ""
		for range 10 {
			q := "/v2/sandboxes?limit=2&order=" + order
			if tok != "" {
				q += "&nextToken=" + url.QueryEscape(tok)
			}
			r := h.e2b(t, "GET", q, "")
			if r.code != 200 {
				t.Fatalf("page: %d %s", r.code, r.raw)
			}
			for _, l := range r.list(t) {
				seen = append(seen, l["sandboxID"].(string))
			}
			if tok = r.hdr.Get("X-Next-Token"); tok == "" {
				break
			}
		}
		if len(seen) != 6 {
			t.Fatalf("order %q: pages gave %v", order, seen)
		}
		first, last := other, ids[0]
		if order == "asc" {
			first, last = ids[0], other
		}
		if seen[0] != first || seen[5] != last {
			t.Fatalf("order %q: %v", order, seen)
		}
	}

	// v1 list: running only.
	if l := h.e2b(t, "GET", "/sandboxes", "").list(t); len(l) != 5 {
		t.Fatalf("v1 list: %d", len(l))
	}
	for _, bad := range []string{"state=dead", "limit=0", "limit=101", "limit=x", "nextToken=%25%25", "nextToken=bm90LWEtdG9rZW4",
		"metadata=novalue", "order=sideways", "startedAfter=yesterday"} {
		h.e2b(t, "GET", "/v2/sandboxes?"+bad, "").e2bErr(t, 400)
	}
	// After a kill, the filter finds nothing (the SDK test).
	h.e2b(t, "DELETE", "/sandboxes/"+other, "")
	if l := h.e2b(t, "GET", "/v2/sandboxes?state=running&metadata="+enc("app=y"), "").list(t); len(l) != 0 {
		t.Fatalf("killed sandbox listed: %v", l)
	}
}

func TestCrossAPI(t *testing.T) {
	h := newHarness(t)
	// E2B -> OpenSandbox.
	id := h.create(t, `{"templateID":"base","metadata":{"app":"x"}}`)
	r := h.os(t, "GET", "/v1/sandboxes/"+id, "")
	if r.code != 200 || r.obj(t)["status"].(map[string]any)["state"] != "Running" {
		t.Fatalf("OpenSandbox get of an E2B sandbox: %d %s", r.code, r.raw)
	}
	// The same root path with OPEN-SANDBOX-API-KEY is the Lifecycle API.
	if r := h.os(t, "GET", "/sandboxes/"+id, ""); r.code != 200 || r.obj(t)["id"] != id {
		t.Fatalf("root path with the OpenSandbox key: %d %s", r.code, r.raw)
	}
	if l := h.os(t, "GET", "/v1/sandboxes?metadata=app%3Dx", "").obj(t)["items"].([]any); len(l) != 1 {
		t.Fatalf("OpenSandbox list: %v", l)
	}
	if r := h.os(t, "DELETE", "/v1/sandboxes/"+id, ""); r.code != 204 {
		t.Fatalf("OpenSandbox delete: %d %s", r.code, r.raw)
	}
	h.e2b(t, "GET", "/sandboxes/"+id, "").e2bErr(t, 404)

	// OpenSandbox -> E2B.
	r = h.os(t, "POST", "/v1/sandboxes", `{"image":{"uri":"busybox"},"entrypoint":["sh"],"timeout":600,"metadata":{"k":"v"}}`)
	if r.code != 202 {
		t.Fatalf("OpenSandbox create: %d %s", r.code, r.raw)
	}
	id = r.obj(t)["id"].(string)
	d := h.e2b(t, "GET", "/sandboxes/"+id, "").obj(t)
	if d["templateID"] != "busybox" || d["state"] != "running" || d["metadata"].(map[string]any)["k"] != "v" {
		t.Fatalf("E2B view of an OpenSandbox sandbox: %v", d)
	}
	if l := h.e2b(t, "GET", "/v2/sandboxes", "").list(t); len(l) != 1 || l[0]["sandboxID"] != id {
		t.Fatalf("E2B list: %v", l)
	}
	// An E2B connect gives its processes E2B's variables.
	if r := h.e2b(t, "POST", "/v2/sandboxes/"+id+"/connect", `{}`); r.code != 200 {
		t.Fatalf("E2B connect: %d %s", r.code, r.raw)
	}
	if _, agentEnv, err := h.rt.AgentState(id); err != nil || agentEnv["E2B_SANDBOX_ID"] != id || agentEnv["E2B_SANDBOX"] != "true" {
		t.Fatalf("agent env after an E2B connect %v, %v", agentEnv, err)
	}
	if r := h.e2b(t, "POST", "/sandboxes/"+id+"/pause", `{}`); r.code != 204 {
		t.Fatalf("E2B pause: %d", r.code)
	}
	if st := h.os(t, "GET", "/v1/sandboxes/"+id, "").obj(t)["status"].(map[string]any)["state"]; st != "Paused" {
		t.Fatalf("OpenSandbox state after E2B pause: %v", st)
	}
	if r := h.e2b(t, "DELETE", "/sandboxes/"+id, ""); r.code != 204 {
		t.Fatalf("E2B kill: %d", r.code)
	}
	if r := h.os(t, "GET", "/v1/sandboxes/"+id, ""); r.code != 404 {
		t.Fatalf("OpenSandbox get after E2B kill: %d", r.code)
	}
	// A manual-cleanup sandbox has no expiry: E2B shows a far endAt.
	r = h.os(t, "POST", "/v1/sandboxes", `{"image":{"uri":"busybox"},"entrypoint":["sh"]}`)
	d = h.e2b(t, "GET", "/sandboxes/"+r.obj(t)["id"].(string), "").obj(t)
	if !strings.HasPrefix(d["endAt"].(string), "9999-") {
		t.Fatalf("endAt of a manual sandbox: %v", d["endAt"])
	}
}

func TestAuthRolesAndTenants(t *testing.T) {
	h := newHarness(t)
	h.do(t, "", "GET", "/v2/sandboxes", "", false).e2bErr(t, 401)
	h.do(t, "e2b_00000000000000000000000000000000000000000000000000000000000000000000000000000000", "GET", "/v2/sandboxes", "", false).e2bErr(t, 401)
	op, viewer, other := h.key(t, "acme", tenant.RoleOperator), h.key(t, "acme", tenant.RoleViewer), h.key(t, "zeta", tenant.RoleOperator)
	r := h.do(t, op, "POST", "/v2/sandboxes", `{"templateID":"base"}`, false)
	if r.code != 201 {
		t.Fatalf("operator create: %d %s", r.code, r.raw)
	}
	id := r.obj(t)["sandboxID"].(string)
	if sb, _ := h.svc.Get(context.Background(), id); sb.Tenant != "acme" {
		t.Fatalf("owner %q", sb.Tenant)
	}
	h.do(t, viewer, "POST", "/v2/sandboxes", `{}`, false).e2bErr(t, 403)
	h.do(t, viewer, "DELETE", "/sandboxes/"+id, "", false).e2bErr(t, 403)
	d := h.do(t, viewer, "GET", "/sandboxes/"+id, "", false).obj(t)
	if _, ok := d["envdAccessToken"]; ok || d["sandboxID"] != id {
		t.Fatalf("viewer's get: %v", d)
	}
	// Another tenant sees nothing.
	h.do(t, other, "GET", "/sandboxes/"+id, "", false).e2bErr(t, 404)
	h.do(t, other, "DELETE", "/sandboxes/"+id, "", false).e2bErr(t, 404)
	if l := h.do(t, other, "GET", "/v2/sandboxes", "", false).list(t); len(l) != 0 {
		t.Fatalf("other tenant lists %v", l)
	}
	// The e2b_ form of a moat key is the same key.
	e2bForm := tenant.E2BKey(op)
	if !strings.HasPrefix(e2bForm, "e2b_") || strings.Trim(e2bForm[4:], "0123456789abcdef") != "" {
		t.Fatalf("E2B form %q", e2bForm)
	}
	if l := h.do(t, e2bForm, "GET", "/v2/sandboxes", "", false).list(t); len(l) != 1 {
		t.Fatalf("list with the e2b_ form: %v", l)
	}
	if l := h.do(t, "e2b_"+rootKey, "GET", "/v2/sandboxes", "", false).list(t); len(l) != 1 {
		t.Fatalf("list with the root key's e2b_ form: %v", l)
	}
	// A tenant at its quota: E2B's 429, and nothing is made.
	if _, _, err := h.reg.PutTenant(context.Background(), "acme", tenant.Quota{Sandboxes: 1}); err != nil {
		t.Fatal(err)
	}
	h.do(t, op, "POST", "/v2/sandboxes", `{"templateID":"base"}`, false).e2bErr(t, 429)
	if l := h.do(t, op, "GET", "/v2/sandboxes", "", false).list(t); len(l) != 1 {
		t.Fatalf("after a refused create: %v", l)
	}
}

func TestTemplatesAndSnapshots(t *testing.T) {
	h := newHarness(t)
	ctx := context.Background()
	if _, err := h.svc.Templates.Create(ctx, template.Template{ID: "py", Image: "python:3", Env: map[string]string{"T": "1"},
		ResourceLimits: map[string]string{"cpu": "2", "memory": "1Gi"}, User: "root", Workdir: "/work"}); err != nil {
		t.Fatal(err)
	}
	id := h.create(t, `{"templateID":"py","envVars":{"T":"req"}}`)
	sb, _ := h.svc.Get(ctx, id)
	if sb.Image != "python:3" || sb.Resources.CPUMillis != 2000 || h.env(id)["T"] != "req" || h.env(id)[agentproto.EnvdUserEnv] != "root" {
		t.Fatalf("from template py: %+v env %v", sb, h.env(id))
	}
	d := h.e2b(t, "GET", "/sandboxes/"+id, "").obj(t)
	if d["templateID"] != "py" || d["cpuCount"].(float64) != 2 || d["memoryMB"].(float64) != 1024 {
		t.Fatalf("detail %v", d)
	}
	if l := h.e2b(t, "GET", "/v2/sandboxes?template=py", "").list(t); len(l) != 1 {
		t.Fatalf("template filter: %v", l)
	}
	if r := h.e2b(t, "GET", "/templates/aliases/py", ""); r.code != 200 || r.obj(t)["templateID"] != "py" {
		t.Fatalf("alias: %d %s", r.code, r.raw)
	}
	h.e2b(t, "GET", "/templates/aliases/nope", "").e2bErr(t, 404)
	if l := h.e2b(t, "GET", "/templates", "").list(t); len(l) != 3 {
		t.Fatalf("templates: %v", l)
	}

	// Snapshot, list, create from it (its id as the templateID), delete.
	r := h.e2b(t, "POST", "/sandboxes/"+id+"/snapshots", `{"name":"snap1"}`)
	if r.code != 201 {
		t.Fatalf("snapshot: %d %s", r.code, r.raw)
	}
	snapID := r.obj(t)["snapshotID"].(string)
	if l := h.e2b(t, "GET", "/snapshots?sandboxID="+id, "").list(t); len(l) != 1 || l[0]["snapshotID"] != snapID || l[0]["names"].([]any)[0] != "snap1" {
		t.Fatalf("snapshots: %v", l)
	}
	fork := h.create(t, `{"templateID":"`+snapID+`"}`)
	if sb, _ := h.svc.Get(ctx, fork); sb.SnapshotID != snapID {
		t.Fatalf("created from snapshot: %+v", sb)
	}
	if r := h.e2b(t, "GET", "/templates/aliases/"+snapID, ""); r.code != 200 {
		t.Fatalf("snapshot exists: %d", r.code)
	}
	h.e2b(t, "POST", "/sandboxes/"+id+"/fork", `{}`).e2bErr(t, 501)
	h.e2b(t, "DELETE", "/sandboxes/"+fork, "")
	if r := h.e2b(t, "DELETE", "/templates/"+snapID, ""); r.code != 204 {
		t.Fatalf("delete snapshot: %d %s", r.code, r.raw)
	}
	h.e2b(t, "DELETE", "/templates/"+snapID, "").e2bErr(t, 404)
	h.e2b(t, "DELETE", "/templates/base", "").e2bErr(t, 409)
	if r := h.e2b(t, "DELETE", "/templates/py", ""); r.code != 204 {
		t.Fatalf("delete template: %d %s", r.code, r.raw)
	}
	h.e2b(t, "POST", "/v2/sandboxes", `{"templateID":"py"}`).e2bErr(t, 404)
}

func TestMetricsLogsAndUnknownRoutes(t *testing.T) {
	h := newHarness(t)
	id := h.create(t, `{}`)
	if r := h.e2b(t, "GET", "/sandboxes/"+id+"/metrics?start=0&end=9999999999", ""); r.code != 200 || r.raw[0] != '[' {
		t.Fatalf("metrics: %d %s", r.code, r.raw)
	}
	if r := h.e2b(t, "GET", "/sandboxes/metrics?sandbox_ids="+id, ""); r.code != 200 || r.obj(t)["sandboxes"] == nil {
		t.Fatalf("metrics of many: %d %s", r.code, r.raw)
	}
	for _, p := range []string{"/sandboxes/" + id + "/logs", "/v2/sandboxes/" + id + "/logs"} {
		if r := h.e2b(t, "GET", p, ""); r.code != 200 || r.obj(t)["logs"] == nil {
			t.Fatalf("%s: %d %s", p, r.code, r.raw)
		}
	}
	h.e2b(t, "PUT", "/sandboxes/"+id+"/network", `{}`).e2bErr(t, 501)
	h.e2b(t, "GET", "/v2/nothing-here", "").e2bErr(t, 404)
	h.e2b(t, "GET", "/sandboxes/"+id+"/nothing", "").e2bErr(t, 404)
}

// A template with a pool makes E2B's create a warm claim: the sandbox is
// one of the pool's idle ones, with the request's env applied.
func TestPooledTemplateIsAWarmClaim(t *testing.T) {
	h := newHarness(t)
	ctx := context.Background()
	if _, err := h.svc.CreatePool(ctx, pool.Pool{Name: "warm", Template: pool.PoolTemplate{Image: "moat-e2b-base:latest",
		Entrypoint: []string{"tail", "-f", "/dev/null"}}, Capacity: pool.Capacity{BufferMin: 1, BufferMax: 1, PoolMax: 3}}); err != nil {
		t.Fatal(err)
	}
	var idle []string
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		if _, st, _ := h.svc.GetPool(ctx, "warm"); st.Available == 1 {
			h.mu.Lock()
			for id := range h.envs {
				idle = append(idle, id)
			}
			h.mu.Unlock()
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if len(idle) != 1 {
		t.Fatalf("the pool did not fill: %v", idle)
	}
	if _, err := h.svc.Templates.Create(ctx, template.Template{ID: "warm-base", Pool: "warm", User: "user"}); err != nil {
		t.Fatal(err)
	}
	id := h.create(t, `{"templateID":"warm-base","envVars":{"X":"1"},"metadata":{"note":"a b"},"timeout":30}`)
	if id != idle[0] {
		t.Fatalf("created %s, want the idle sandbox %s (a claim)", id, idle[0])
	}
	sb, _ := h.svc.Get(ctx, id)
	if sb.Pool == "" || sb.Env["X"] != "1" || sb.Env[agentproto.EnvdTemplateEnv] != "warm-base" || sb.Env["E2B_SANDBOX"] != "true" ||
		sb.Env["E2B_SANDBOX_ID"] != id {
		t.Fatalf("claimed %+v", sb)
	}
	// The claim applied the request's env and the id in one call.
	if _, agentEnv, err := h.rt.AgentState(id); err != nil || agentEnv["X"] != "1" || agentEnv["E2B_SANDBOX_ID"] != id {
		t.Fatalf("agent env of the claimed sandbox %v, %v", agentEnv, err)
	}
	d := h.e2b(t, "GET", "/sandboxes/"+id, "").obj(t)
	if d["templateID"] != "warm-base" || d["metadata"].(map[string]any)["note"] != "a b" {
		t.Fatalf("detail of the claimed sandbox: %v", d)
	}
}

// TestTenantAdminFencedEveryRoute: a tenant admin of another tenant
// addresses acme's sandbox on every route of the E2B face that names one:
// each answers 404 (or the 501 of a route that names no sandbox it looks
// up), and lists show none of acme's sandboxes. acme's sandbox is intact.
func TestTenantAdminFencedEveryRoute(t *testing.T) {
	h := newHarness(t)
	op, zetaAdmin := h.key(t, "acme", tenant.RoleOperator), h.key(t, "zeta", tenant.RoleAdmin)
	r := h.do(t, op, "POST", "/v2/sandboxes", `{"templateID":"base"}`, false)
	if r.code != 201 {
		t.Fatalf("create: %d %s", r.code, r.raw)
	}
	id := r.obj(t)["sandboxID"].(string)
	bodies := map[string]string{"POST /sandboxes/{id}/timeout": `{"timeout":60}`, "POST /sandboxes/{id}/connect": `{"timeout":60}`,
		"POST /v2/sandboxes/{id}/connect": `{"timeout":60}`, "POST /sandboxes/{id}/resume": `{"timeout":60}`, "POST /sandboxes/{id}/snapshots": `{}`}
	n := 0
	for _, rt := range e2b.New(e2b.Config{Domain: "sbx.example.test"}, h.svc, nil).Face().Routes {
		method, pattern, _ := strings.Cut(rt.Pattern, " ")
		if !strings.Contains(pattern, "{id}") || !strings.HasPrefix(strings.TrimPrefix(pattern, "/v2"), "/sandboxes/") {
			continue
		}
		n++
		path := strings.ReplaceAll(pattern, "{id}", id)
		got := h.do(t, zetaAdmin, method, path, bodies[rt.Pattern], false)
		if got.code != 404 && got.code != 501 {
			t.Errorf("zeta admin %s %s: %d %s, want 404", method, path, got.code, got.raw)
		}
	}
	if n < 14 {
		t.Errorf("only %d sandbox routes checked", n)
	}
	for _, p := range []string{"/sandboxes", "/v2/sandboxes", "/snapshots"} {
		if got := h.do(t, zetaAdmin, "GET", p, "", false); got.code != 200 || strings.Contains(string(got.raw), id) {
			t.Errorf("zeta admin GET %s: %d %s", p, got.code, got.raw)
		}
	}
	if sb, err := h.svc.Get(context.Background(), id); err != nil || sb.Status.State != "Running" {
		t.Errorf("acme's sandbox after the calls: %+v %v", sb.Status, err)
	}
}

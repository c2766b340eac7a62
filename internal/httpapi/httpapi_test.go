package httpapi_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/moat-sandbox/moat/internal/httpapi"
	"github.com/moat-sandbox/moat/internal/image"
	"github.com/moat-sandbox/moat/internal/lifecycle"
	"github.com/moat-sandbox/moat/internal/runtime/fake"
	"github.com/moat-sandbox/moat/internal/sandbox"
	"github.com/moat-sandbox/moat/internal/store"
	"github.com/moat-sandbox/moat/internal/web/webtest"
)

const key = "test-key"

type images struct{}

func (images) Ensure(ctx context.Context, ref string, auth *image.Auth) (image.Image, error) {
	return image.Image{Name: ref}, nil
}

func newAPI(t *testing.T) *httptest.Server {
	t.Helper()
	return newAPIWith(t, httpapi.Config{APIKey: key})
}

// newAPIWith is newAPI with cfg, over the fake runtime.
func newAPIWith(t *testing.T, cfg httpapi.Config) *httptest.Server {
	t.Helper()
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
	srv := httptest.NewServer(httpapi.New(cfg, svc, log).Handler())
	t.Cleanup(func() { srv.Close(); svc.Close(); rt.Close(); db.Close() })
	return srv
}

func call(t *testing.T, srv *httptest.Server, method, path, body string, hdr ...string) (int, map[string]any, http.Header) {
	t.Helper()
	var r io.Reader
	if body != "" {
		r = strings.NewReader(body)
	}
	req, _ := http.NewRequest(method, srv.URL+path, r)
	req.Header.Set("OPEN-SANDBOX-API-KEY", key)
	for i := 0; i+1 < len(hdr); i += 2 {
		if hdr[i+1] == "" {
			req.Header.Del(hdr[i])
		} else {
			req.Header.Set(hdr[i], hdr[i+1])
		}
	}
	resp, err := srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	var m map[string]any
	if len(bytes.TrimSpace(raw)) > 0 {
		if err := json.Unmarshal(raw, &m); err != nil {
			t.Fatalf("%s %s: non-JSON body %q", method, path, raw)
		}
	}
	return resp.StatusCode, m, resp.Header
}

const createBody = `{"image":{"uri":"busybox"},"entrypoint":["tail","-f","/dev/null"],"metadata":{"app":"x"},"timeout":120}`

func TestCreateShapeAndRoutesUnderBothPrefixes(t *testing.T) {
	srv := newAPI(t)
	code, m, hdr := call(t, srv, "POST", "/v1/sandboxes", createBody)
	if code != 202 {
		t.Fatalf("create: %d %v", code, m)
	}
	id, _ := m["id"].(string)
	if id == "" || hdr.Get("Location") != "/v1/sandboxes/"+id || hdr.Get("X-Request-ID") == "" {
		t.Fatalf("create response %v headers %v", m, hdr)
	}
	// CreateSandboxResponse has no image; omitted fields are absent, not null.
	for _, k := range []string{"image", "snapshotId", "updatedAt", "platform"} {
		if _, ok := m[k]; ok {
			t.Errorf("create response has %q", k)
		}
	}
	st := m["status"].(map[string]any)
	if st["state"] != "Running" || m["expiresAt"] == nil || m["createdAt"] == nil {
		t.Fatalf("create response %v", m)
	}
	for _, p := range []string{"/sandboxes/", "/v1/sandboxes/"} {
		code, m, _ = call(t, srv, "GET", p+id, "")
		if code != 200 || m["image"].(map[string]any)["uri"] != "busybox" || m["metadata"].(map[string]any)["app"] != "x" {
			t.Fatalf("GET %s: %d %v", p, code, m)
		}
	}
	// Manual cleanup: no expiresAt at all.
	_, m, _ = call(t, srv, "POST", "/sandboxes", `{"image":{"uri":"busybox"},"entrypoint":["sh"],"timeout":null}`)
	if _, ok := m["expiresAt"]; ok {
		t.Fatalf("manual cleanup sandbox has expiresAt: %v", m)
	}
	code, m, _ = call(t, srv, "GET", "/v1/sandboxes?pageSize=1", "")
	pg := m["pagination"].(map[string]any)
	if code != 200 || len(m["items"].([]any)) != 1 || pg["totalItems"].(float64) != 2 || pg["hasNextPage"] != true || pg["totalPages"].(float64) != 2 {
		t.Fatalf("list: %v", m)
	}
	code, m, _ = call(t, srv, "GET", "/v1/sandboxes?metadata="+"app%3Dx", "")
	if code != 200 || m["pagination"].(map[string]any)["totalItems"].(float64) != 1 {
		t.Fatalf("list by metadata: %v", m)
	}
}

func TestLifecycleOperations(t *testing.T) {
	srv := newAPI(t)
	_, m, _ := call(t, srv, "POST", "/v1/sandboxes", createBody)
	id := m["id"].(string)
	if code, m, _ := call(t, srv, "POST", "/v1/sandboxes/"+id+"/pause", ""); code != 202 || m != nil {
		t.Fatalf("pause: %d %v", code, m)
	}
	_, m, _ = call(t, srv, "GET", "/v1/sandboxes/"+id, "")
	if m["status"].(map[string]any)["state"] != "Paused" {
		t.Fatalf("after pause %v", m)
	}
	if code, m, _ := call(t, srv, "POST", "/v1/sandboxes/"+id+"/pause", ""); code != 409 || m["code"] != "SANDBOX::NOT_RUNNING" {
		t.Fatalf("double pause: %d %v", code, m)
	}
	if code, _, _ := call(t, srv, "POST", "/v1/sandboxes/"+id+"/resume", ""); code != 202 {
		t.Fatalf("resume: %d", code)
	}
	if code, m, _ := call(t, srv, "POST", "/v1/sandboxes/"+id+"/resume", ""); code != 409 || m["code"] != "SANDBOX::NOT_PAUSED" {
		t.Fatalf("double resume: %d %v", code, m)
	}
	at := time.Now().Add(time.Hour).UTC().Format(time.RFC3339)
	code, m, _ := call(t, srv, "POST", "/v1/sandboxes/"+id+"/renew-expiration", `{"expiresAt":"`+at+`"}`)
	if code != 200 || !strings.HasPrefix(m["expiresAt"].(string), at[:19]) {
		t.Fatalf("renew: %d %v", code, m)
	}
	code, m, _ = call(t, srv, "PATCH", "/v1/sandboxes/"+id+"/metadata", `{"app":null,"k":"v"}`)
	md := m["metadata"].(map[string]any)
	if code != 200 || md["k"] != "v" || md["app"] != nil {
		t.Fatalf("patch: %d %v", code, m)
	}
	if code, m, _ := call(t, srv, "PATCH", "/v1/sandboxes/"+id+"/metadata", `["x"]`); code != 400 || m["code"] != "SANDBOX::INVALID_PARAMETER" {
		t.Fatalf("bad patch: %d %v", code, m)
	}
	code, m, _ = call(t, srv, "GET", "/v1/sandboxes/"+id+"/endpoints/44772", "")
	if code != 200 || m["endpoint"] == "" || m["headers"].(map[string]any)["X-EXECD-ACCESS-TOKEN"] == "" {
		t.Fatalf("endpoint: %d %v", code, m)
	}
	code, m, _ = call(t, srv, "GET", "/v1/sandboxes/"+id+"/endpoints/8080?use_server_proxy=true", "")
	if code != 200 || m["endpoint"] != strings.TrimPrefix(srv.URL, "http://")+"/sandboxes/"+id+"/proxy/8080" {
		t.Fatalf("proxy endpoint: %d %v", code, m)
	}
	if code, m, _ := call(t, srv, "GET", "/v1/sandboxes/"+id+"/endpoints/8080?use_server_proxy=true&expires=99", ""); code != 400 {
		t.Fatalf("expires with proxy: %d %v", code, m)
	}
	if code, m, _ := call(t, srv, "GET", "/v1/sandboxes/"+id+"/endpoints/8080?expires=99", ""); code != 501 || m["code"] != "SANDBOX::API_NOT_SUPPORTED" {
		t.Fatalf("signed endpoint: %d %v", code, m)
	}
	if code, m, _ := call(t, srv, "DELETE", "/v1/sandboxes/"+id, ""); code != 204 || m != nil {
		t.Fatalf("delete: %d %v", code, m)
	}
	if code, m, _ := call(t, srv, "GET", "/v1/sandboxes/"+id, ""); code != 404 || m["code"] != "SANDBOX::NOT_FOUND" {
		t.Fatalf("get deleted: %d %v", code, m)
	}
}

func TestAuthAndProxy(t *testing.T) {
	srv := newAPI(t)
	if code, m, _ := call(t, srv, "GET", "/v1/sandboxes", "", "OPEN-SANDBOX-API-KEY", ""); code != 401 || m["code"] != "MISSING_API_KEY" {
		t.Fatalf("no key: %d %v", code, m)
	}
	if code, m, _ := call(t, srv, "GET", "/v1/sandboxes", "", "OPEN-SANDBOX-API-KEY", "wrong"); code != 401 || m["code"] != "INVALID_API_KEY" {
		t.Fatalf("bad key: %d %v", code, m)
	}
	if code, _, _ := call(t, srv, "GET", "/v1/sandboxes", "", "OPEN-SANDBOX-API-KEY", "", "X-API-Key", key); code != 200 {
		t.Fatalf("X-API-Key: %d", code)
	}
	if code, m, _ := call(t, srv, "GET", "/health", "", "OPEN-SANDBOX-API-KEY", ""); code != 200 || m["status"] != "healthy" {
		t.Fatalf("health: %d %v", code, m)
	}
	_, m, _ := call(t, srv, "POST", "/v1/sandboxes", createBody)
	id := m["id"].(string)
	p := "/sandboxes/" + id + "/proxy/44772/ping"
	// No API key and no agent token: the proxy forwards, the agent refuses.
	if code, _, _ := call(t, srv, "GET", p, "", "OPEN-SANDBOX-API-KEY", ""); code != 401 {
		t.Fatalf("proxy without credentials: %d", code)
	}
	// The API key presented as the agent token is swapped for the real one.
	if code, _, _ := call(t, srv, "GET", p, "", "OPEN-SANDBOX-API-KEY", "", "X-EXECD-ACCESS-TOKEN", key); code != 200 {
		t.Fatalf("proxy with api key as token: %d", code)
	}
	if code, _, _ := call(t, srv, "GET", "/v1"+p, ""); code != 200 {
		t.Fatalf("proxy with api key header: %d", code)
	}
	// A wrong API key is not swapped.
	if code, _, _ := call(t, srv, "GET", p, "", "OPEN-SANDBOX-API-KEY", "", "X-EXECD-ACCESS-TOKEN", "guess"); code != 401 {
		t.Fatalf("proxy with a guessed token: %d", code)
	}
	if code, m, _ := call(t, srv, "GET", "/sandboxes/nope/proxy/44772/ping", ""); code != 404 || m["code"] != "SANDBOX::NOT_FOUND" {
		t.Fatalf("proxy to unknown sandbox: %d %v", code, m)
	}
}

// The server proxy carries an answer that starts while the request body
// is still arriving (web.ServeProxy through the API's middleware): the
// JavaScript SDK's first command through the proxy was cut off ("other
// side closed") when the agent's stream started before the proxy had
// read the end of the request body.
func TestProxyFullDuplex(t *testing.T) {
	srv := newAPI(t)
	_, m, _ := call(t, srv, "POST", "/v1/sandboxes", createBody)
	id := m["id"].(string)
	// The fake runtime resolves ports other than the agent's to loopback.
	port := webtest.DuplexBackend(t).Listener.Addr().(*net.TCPAddr).Port
	webtest.CheckDuplex(t, srv.Client(), fmt.Sprintf("%s/sandboxes/%s/proxy/%d/upload", srv.URL, id, port),
		http.Header{"OPEN-SANDBOX-API-KEY": {key}})
}

func TestBadInput(t *testing.T) {
	srv := newAPI(t)
	cases := []struct {
		method, path, body string
		code               int
		errCode            string
	}{
		{"POST", "/v1/sandboxes", `{`, 400, "SANDBOX::INVALID_PARAMETER"},
		{"POST", "/v1/sandboxes", ``, 400, "SANDBOX::INVALID_PARAMETER"},
		{"POST", "/v1/sandboxes", `{"image":{"uri":""},"entrypoint":["sh"]}`, 400, "SANDBOX::INVALID_PARAMETER"},
		{"POST", "/v1/sandboxes", `{"image":{"uri":"b"},"entrypoint":["sh"],"timeout":"soon"}`, 400, "SANDBOX::INVALID_PARAMETER"},
		{"POST", "/v1/sandboxes", `{"image":{"uri":"b"},"entrypoint":["sh"],"timeout":60.5}`, 400, "SANDBOX::INVALID_PARAMETER"},
		{"POST", "/v1/sandboxes", `{"image":{"uri":"b"},"entrypoint":["sh"],"timeout":1e20}`, 400, "SANDBOX::INVALID_PARAMETER"},
		{"POST", "/v1/sandboxes", `{"image":{"uri":"b"},"entrypoint":["sh"],"volumes":[{"name":"v"}]}`, 400, "VOLUME::INVALID_BACKEND"},
		{"POST", "/v1/sandboxes", `{"image":{"uri":"b"},"entrypoint":["sh"],"volumes":[{"name":"v","host":{"path":"/etc"},"mountPath":"/data"}]}`, 400, "VOLUME::HOST_PATH_NOT_ALLOWED"},
		{"POST", "/v1/sandboxes", `{"image":{"uri":"b"},"entrypoint":["sh"],"networkPolicy":{"defaultAction":"deny"}}`, 501, "SANDBOX::API_NOT_SUPPORTED"},
		{"POST", "/v1/sandboxes", `{"snapshotId":"s1"}`, 404, "SNAPSHOT::NOT_FOUND"},
		{"POST", "/v1/sandboxes", `{"image":{"uri":"b"},"entrypoint":["sh"]} trailing`, 400, "SANDBOX::INVALID_PARAMETER"},
		{"GET", "/v1/sandboxes?pageSize=0", "", 400, "SANDBOX::INVALID_PARAMETER"},
		{"GET", "/v1/sandboxes?page=x", "", 400, "SANDBOX::INVALID_PARAMETER"},
		{"GET", "/v1/sandboxes?metadata=%zz", "", 400, "SANDBOX::INVALID_PARAMETER"},
		{"POST", "/v1/sandboxes/x/renew-expiration", `{}`, 400, "SANDBOX::INVALID_PARAMETER"},
		{"GET", "/v1/sandboxes/x/endpoints/99999", "", 400, "SANDBOX::INVALID_PORT"},
		{"GET", "/v1/sandboxes/x/endpoints/80?use_server_proxy=maybe", "", 400, "SANDBOX::INVALID_PARAMETER"},
		{"PUT", "/v1/sandboxes/x", "", 405, ""},
	}
	for _, c := range cases {
		code, m, _ := call(t, srv, c.method, c.path, c.body)
		if code != c.code || (c.errCode != "" && (m["code"] != c.errCode || m["message"] == "")) {
			t.Errorf("%s %s %s: %d %v, want %d %s", c.method, c.path, c.body, code, m, c.code, c.errCode)
		}
	}
}

func TestPoolsAndBatch(t *testing.T) {
	srv := newAPI(t)
	pool := `{"name":"warm","template":{"image":{"uri":"busybox"},"entrypoint":["tail","-f","/dev/null"]},"capacitySpec":{"bufferMin":1,"bufferMax":2,"poolMin":0,"poolMax":10}}`
	code, m, _ := call(t, srv, "POST", "/v1/pools", pool)
	if code != 201 || m["name"] != "warm" || m["status"] == nil || m["capacitySpec"].(map[string]any)["bufferMax"].(float64) != 2 {
		t.Fatalf("create pool: %d %v", code, m)
	}
	if code, m, _ := call(t, srv, "POST", "/v1/pools", pool); code != 409 || m["code"] != "POOL::ALREADY_EXISTS" {
		t.Fatalf("duplicate pool: %d %v", code, m)
	}
	for _, bad := range []string{`{"name":"x"}`, `{"name":"x","template":{"image":{"uri":"b"},"entrypoint":["sh"]}}`,
		`{"name":"X!","template":{"image":{"uri":"b"},"entrypoint":["sh"]},"capacitySpec":{"poolMax":1}}`} {
		if code, m, _ := call(t, srv, "POST", "/v1/pools", bad); code != 400 || m["code"] == "" {
			t.Errorf("bad pool %s: %d %v", bad, code, m)
		}
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		_, m, _ = call(t, srv, "GET", "/v1/pools/warm", "")
		if m["status"].(map[string]any)["available"].(float64) == 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("pool never filled: %v", m)
		}
		time.Sleep(10 * time.Millisecond)
	}
	code, m, _ = call(t, srv, "POST", "/v1/sandboxes/batch", `{"count":3,"extensions":{"poolRef":"warm"},"metadata":{"b":"1"},"timeout":300}`)
	if code != 202 || len(m["items"].([]any)) != 3 {
		t.Fatalf("batch: %d %v", code, m)
	}
	for _, it := range m["items"].([]any) {
		item := it.(map[string]any)
		if item["status"].(map[string]any)["state"] != "Running" || item["expiresAt"] == nil || item["metadata"].(map[string]any)["b"] != "1" {
			t.Fatalf("batch item %v", item)
		}
	}
	if code, m, _ := call(t, srv, "POST", "/v1/sandboxes/batch", `{"count":0,"extensions":{"poolRef":"warm"}}`); code != 400 {
		t.Fatalf("count 0: %d %v", code, m)
	}
	if code, m, _ := call(t, srv, "POST", "/v1/sandboxes", `{"extensions":{"poolRef":"nope"}}`); code != 400 || m["code"] != "SANDBOX::INVALID_POOL_REF" {
		t.Fatalf("unknown pool: %d %v", code, m)
	}
	code, m, _ = call(t, srv, "GET", "/v1/pools", "")
	if code != 200 || len(m["items"].([]any)) != 1 {
		t.Fatalf("list pools: %d %v", code, m)
	}
	if code, _, _ := call(t, srv, "PUT", "/v1/pools/warm", strings.Replace(pool, `"bufferMax":2`, `"bufferMax":3`, 1)); code != 200 {
		t.Fatalf("update pool: %d", code)
	}
	if code, _, _ := call(t, srv, "DELETE", "/v1/pools/warm", ""); code != 204 {
		t.Fatalf("delete pool: %d", code)
	}
	if code, m, _ := call(t, srv, "GET", "/v1/pools/warm", ""); code != 404 || m["code"] != "POOL::NOT_FOUND" {
		t.Fatalf("deleted pool: %d %v", code, m)
	}
	// Claimed sandboxes outlive their pool.
	_, m, _ = call(t, srv, "GET", "/v1/sandboxes?metadata=b%3D1", "")
	if m["pagination"].(map[string]any)["totalItems"].(float64) != 3 {
		t.Fatalf("claimed sandboxes after pool delete: %v", m)
	}
}

// A list filter naming a state moat never reports (upstream's Kubernetes
// providers report Allocated; the Python SDK's pool filters on it) matches
// nothing and is no error; known states still match case-insensitively.
func TestListStateFilterUnknownStates(t *testing.T) {
	srv := newAPI(t)
	if code, m, _ := call(t, srv, "POST", "/v1/sandboxes", createBody); code != 202 {
		t.Fatalf("create: %d %v", code, m)
	}
	for i, c := range []struct {
		query string
		want  float64
	}{
		{"state=Pending&state=Allocated&state=Running", 1},
		{"state=Allocated", 0},
		{"state=allocated,Sleepy", 0},
		{"state=Allocated,running", 1},
		{"state=Paused", 0},
	} {
		code, m, _ := call(t, srv, "GET", "/v1/sandboxes?"+c.query, "")
		if code != 200 {
			t.Fatalf("%d. %s: %d %v", i, c.query, code, m)
		}
		if got := m["pagination"].(map[string]any)["totalItems"].(float64); got != c.want {
			t.Errorf("%d. %s: %v items, want %v", i, c.query, got, c.want)
		}
	}
}

// null is the empty list (and map) wherever an empty one is valid, as
// upstream's servers decode it: SDKs without omitempty send null.
func TestNullListsAreEmpty(t *testing.T) {
	srv := newAPI(t)
	const nulls = `"volumes":null,"env":null,"metadata":null,"extensions":null,"resourceLimits":null,"platform":null,"networkPolicy":null,"credentialProxy":null`
	code, m, _ := call(t, srv, "POST", "/v1/sandboxes", `{"image":{"uri":"busybox"},"entrypoint":["sh"],"timeout":60,`+nulls+`}`)
	if code != 202 {
		t.Fatalf("create with null lists: %d %v", code, m)
	}
	pool := `{"name":"p","template":{"image":{"uri":"busybox"},"entrypoint":["sh"],"env":null,"resourceLimits":null,"extensions":null,"volumes":null},"capacitySpec":{"bufferMin":0,"bufferMax":1,"poolMin":0,"poolMax":2}}`
	if code, m, _ := call(t, srv, "POST", "/v1/pools", pool); code != 201 {
		t.Fatalf("pool with null lists: %d %v", code, m)
	}
	if code, m, _ := call(t, srv, "POST", "/v1/sandboxes/batch", `{"count":1,"image":{"uri":"busybox"},"entrypoint":["sh"],"timeout":60,`+nulls+`}`); code != 202 {
		t.Fatalf("batch with null lists: %d %v", code, m)
	}
	// An empty list is not valid for entrypoint: null is refused as [] is.
	if code, m, _ := call(t, srv, "POST", "/v1/sandboxes", `{"image":{"uri":"busybox"},"entrypoint":null,"timeout":60}`); code != 400 {
		t.Fatalf("null entrypoint: %d %v", code, m)
	}
}

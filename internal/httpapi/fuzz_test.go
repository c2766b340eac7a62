package httpapi_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/moat-sandbox/moat/internal/httpapi"
	"github.com/moat-sandbox/moat/internal/lifecycle"
	"github.com/moat-sandbox/moat/internal/runtime/fake"
	"github.com/moat-sandbox/moat/internal/sandbox"
	"github.com/moat-sandbox/moat/internal/store"
)

// fuzzAPI is the real Lifecycle API handler over a fake runtime, shared by
// all iterations of one fuzz worker.
type fuzzAPI struct {
	h  http.Handler
	id string // a running sandbox for the per-sandbox routes
}

func newFuzzAPI(f *testing.F) *fuzzAPI {
	f.Helper()
	db, err := store.Open(context.Background(), filepath.Join(f.TempDir(), "s.db"), time.Second)
	if err != nil {
		f.Fatal(err)
	}
	rt := fake.New(fake.Hooks{})
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	svc, err := sandbox.New(sandbox.Config{Config: lifecycle.Config{}}, sandbox.Deps{Deps: lifecycle.Deps{Store: db, Runtime: rt, Images: images{}, Log: log}})
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { svc.Close(); rt.Close(); db.Close() })
	a := &fuzzAPI{h: httpapi.New(httpapi.Config{APIKey: key}, svc, log).Handler()}
	code, body := a.do(f, "POST", "/v1/sandboxes", []byte(createBody))
	var m struct{ ID string }
	if code != http.StatusAccepted || json.Unmarshal(body, &m) != nil || m.ID == "" {
		f.Fatalf("seed sandbox: %d %s", code, body)
	}
	a.id = m.ID
	return a
}

func (a *fuzzAPI) do(tb testing.TB, method, target string, body []byte) (int, []byte) {
	tb.Helper()
	req := httptest.NewRequest(method, "http://moat.test/", bytes.NewReader(body))
	// target may hold bytes NewRequest rejects; set the URL parts directly.
	path, query, _ := strings.Cut(target, "?")
	req.URL.Path, req.URL.RawQuery, req.RequestURI = path, query, target
	req.Header.Set("OPEN-SANDBOX-API-KEY", key)
	req.Header.Set("Content-Type", "application/json")
	rec := httptest.NewRecorder()
	a.h.ServeHTTP(rec, req)
	return rec.Code, rec.Body.Bytes()
}

// checkEnvelope asserts the invariant of every API answer to client input:
// never a 5xx (501 Not Implemented, a deliberate answer to an unsupported
// feature, excepted), and every non-2xx carries {code, message}.
func checkEnvelope(t *testing.T, what string, code int, body []byte) {
	t.Helper()
	if code >= 500 && code != http.StatusNotImplemented {
		t.Fatalf("%s: status %d: %s", what, code, body)
	}
	if code >= 200 && code < 300 {
		return
	}
	var eb struct{ Code, Message string }
	if err := json.Unmarshal(body, &eb); err != nil || eb.Code == "" || eb.Message == "" {
		t.Fatalf("%s: status %d without an error envelope: %q", what, code, body)
	}
}

// bodyRoutes are the routes whose JSON body the fuzzer drives.
var bodyRoutes = []struct{ method, path string }{
	{"POST", "/v1/sandboxes"},
	{"POST", "/v1/sandboxes/batch"},
	{"POST", "/v1/pools"},
	{"PATCH", "/v1/sandboxes/{id}/metadata"},
	{"POST", "/v1/sandboxes/{id}/renew-expiration"},
	{"PUT", "/v1/pools/fz"},
	{"POST", "/v1/keys"},
	{"PUT", "/v1/tenants/fz"},
}

// FuzzAPIBodies feeds arbitrary bodies to every Lifecycle API route that
// decodes one. Objects the server accepts are deleted again so the fake
// runtime stays small.
func FuzzAPIBodies(f *testing.F) {
	seeds := [][]string{
		{createBody, `{"image":{"uri":"busybox"},"entrypoint":["sh"],"timeout":null}`,
			`{"image":{"uri":"busybox"},"entrypoint":["sh"],"resourceLimits":{"cpu":"500m","memory":"512Mi"},"env":{"A":"1","B":null}}`,
			`{"image":{"uri":""},"entrypoint":[]}`, `{"snapshotId":"s"}`, `{"image":{"uri":"b"},"entrypoint":["sh"],"timeout":1e400}`,
			`{"image":{"uri":"b"},"entrypoint":["sh"],"platform":{"os":"linux","arch":"amd64"},"extensions":{"moat.renewOnAccess":"600"}}`,
			`{"image":{"uri":"b"},"entrypoint":["sh"],"networkPolicy":{"defaultAction":"deny","egress":[{"action":"allow","target":"example.com"}]}}`,
			`{"image":{"uri":"b"},"entrypoint":["sh"],"volumes":[{"name":"v","host":{"path":"/"},"mountPath":"/m"}]}`},
		{`{"count":3,"image":{"uri":"busybox"},"entrypoint":["sh"],"timeout":300}`, `{"count":0}`, `{"count":2,"extensions":{"poolRef":"nope"}}`},
		{`{"name":"warm","template":{"image":{"uri":"busybox"},"entrypoint":["tail","-f","/dev/null"]},"capacitySpec":{"bufferMin":1,"bufferMax":2,"poolMin":0,"poolMax":3}}`,
			`{"name":"X!","template":{"image":{"uri":"b"},"entrypoint":["sh"]},"capacitySpec":{"poolMax":1}}`, `{"name":"x"}`},
		{`{"app":"y","gone":null}`, `{"a/b":"c"}`, `[]`, `null`, `{"":""}`},
		{`{"expiresAt":"2099-01-01T00:00:00Z"}`, `{"expiresAt":"2000-01-01T00:00:00.123456789+02:00"}`, `{"expiresAt":1}`, `{}`},
		{`{"template":{"image":{"uri":"busybox"},"entrypoint":["sh"]},"capacitySpec":{"bufferMin":0,"bufferMax":1,"poolMax":1}}`, `{"name":"other"}`},
		{`{"tenant":"acme","role":"viewer","name":"n","expiresAt":"2099-01-01T00:00:00Z"}`, `{"tenant":"A","role":"admin"}`, `{"tenant":"acme","role":"root"}`,
			`{"tenant":"acme","role":"operator","name":"\u0007"}`, `{"tenant":"acme","role":"viewer","expiresAt":"1999-01-01T00:00:00Z"}`},
		{`{"quota":{"sandboxes":2,"cpu":"1500m","memory":"2Gi"}}`, `{"quota":{"sandboxes":-1}}`, `{"quota":{"cpu":"NaN"}}`,
			`{"quota":{"memory":"1e400"}}`, `{"quota":null}`, `{}`},
	}
	for i, ss := range seeds {
		for _, s := range ss {
			f.Add(uint8(i), []byte(s))
		}
		f.Add(uint8(i), []byte(`{"a":`))
		f.Add(uint8(i), []byte{})
	}
	a := newFuzzAPI(f)
	f.Fuzz(func(t *testing.T, route uint8, body []byte) {
		r := bodyRoutes[int(route)%len(bodyRoutes)]
		path := strings.ReplaceAll(r.path, "{id}", a.id)
		code, out := a.do(t, r.method, path, body)
		checkEnvelope(t, r.method+" "+path, code, out)
		if code < 200 || code >= 300 {
			return
		}
		// Undo what was created: sandboxes and pools.
		var created struct {
			ID    string
			Name  string
			Items []struct{ ID string }
		}
		json.Unmarshal(out, &created)
		switch {
		case r.path == "/v1/keys":
			a.do(t, "DELETE", "/v1/keys/"+created.ID, nil)
		case strings.HasPrefix(r.path, "/v1/tenants/"):
			a.do(t, "DELETE", r.path, nil)
		case r.path == "/v1/pools" || r.method == "PUT":
			a.do(t, "DELETE", "/v1/pools/"+created.Name, nil)
		case r.path == "/v1/sandboxes":
			a.do(t, "DELETE", "/v1/sandboxes/"+created.ID, nil)
		case r.path == "/v1/sandboxes/batch":
			for _, it := range created.Items {
				a.do(t, "DELETE", "/v1/sandboxes/"+it.ID, nil)
			}
		}
	})
}

// FuzzAPIListQuery feeds arbitrary query strings to GET /v1/sandboxes.
func FuzzAPIListQuery(f *testing.F) {
	for _, s := range []string{"", "pageSize=1", "page=2&pageSize=1000", "state=Running,Paused", "state=running&state=",
		"metadata=app%3Dx", "metadata=app%3Dx%26b%3D", "metadata=%ZZ", "page=0", "pageSize=-1", "page=99999999999999999999",
		"state=Bogus", "a=%", ";;", "metadata=a%3D%25"} {
		f.Add(s)
	}
	a := newFuzzAPI(f)
	f.Fuzz(func(t *testing.T, q string) {
		if strings.ContainsAny(q, "#") {
			return // a fragment never reaches a server
		}
		code, out := a.do(t, "GET", "/v1/sandboxes?"+q, nil)
		checkEnvelope(t, "GET /v1/sandboxes?"+q, code, out)
		if code == http.StatusOK {
			var m struct {
				Items      []any
				Pagination map[string]any
			}
			if err := json.Unmarshal(out, &m); err != nil || m.Items == nil || m.Pagination == nil {
				t.Fatalf("list answer %s", out)
			}
		}
	})
}

package httpapi_test

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

func keyed(t *testing.T, srv *httptest.Server, method, path, body, idemKey string) (int, string, http.Header) {
	t.Helper()
	req, _ := http.NewRequest(method, srv.URL+path, strings.NewReader(body))
	req.Header.Set("OPEN-SANDBOX-API-KEY", key)
	if idemKey != "" {
		req.Header.Set("Idempotency-Key", idemKey)
	}
	resp, err := srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), resp.Header
}

// Every mutating route the middleware wraps answers a retry with the
// first answer and does not run again.
func TestIdempotentRoutes(t *testing.T) {
	srv := newSnapshotAPI(t)
	create := `{"image":{"uri":"busybox"},"entrypoint":["sh"]}`
	code, first, _ := keyed(t, srv, "POST", "/v1/sandboxes", create, "c1")
	if code != 202 {
		t.Fatalf("create: %d %s", code, first)
	}
	var sb struct{ ID string }
	json.Unmarshal([]byte(first), &sb)
	for _, tc := range []struct{ path, body, key string }{
		{"/v1/sandboxes", create, "c1"},
		{"/v1/sandboxes/batch", `{"count":2,"image":{"uri":"busybox"},"entrypoint":["sh"]}`, "b1"},
		{"/v1/sandboxes/" + sb.ID + "/snapshots", `{"name":"x"}`, "s1"},
		{"/v1/sandboxes/" + sb.ID + "/pause", ``, "p1"},
	} {
		c1, b1, _ := keyed(t, srv, "POST", tc.path, tc.body, tc.key)
		c2, b2, h := keyed(t, srv, "POST", tc.path, tc.body, tc.key)
		if c1 != 202 || c2 != c1 || b2 != b1 || h.Get("Idempotent-Replayed") != "true" {
			t.Errorf("%s: first %d %s, retry %d %s %v", tc.path, c1, b1, c2, b2, h)
		}
	}
	// Exactly one sandbox from the create and two from the batch.
	_, list, _ := keyed(t, srv, "GET", "/v1/sandboxes", "", "")
	var l struct{ Items []struct{ ID string } }
	json.Unmarshal([]byte(list), &l)
	if len(l.Items) != 3 {
		t.Errorf("%d sandboxes, want 3: %s", len(l.Items), list)
	}
	_, snaps, _ := keyed(t, srv, "GET", "/v1/snapshots", "", "")
	if n := strings.Count(snaps, `"sandboxId"`); n != 1 {
		t.Errorf("%d snapshots, want 1: %s", n, snaps)
	}
	// The same key with another body is refused.
	code, body, _ := keyed(t, srv, "POST", "/v1/sandboxes", `{"image":{"uri":"other"},"entrypoint":["sh"]}`, "c1")
	if code != 409 || !strings.Contains(body, "SANDBOX::IDEMPOTENCY_KEY_REUSED") {
		t.Errorf("reused key: %d %s", code, body)
	}
}

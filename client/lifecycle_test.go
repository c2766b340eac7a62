package client

import (
	"context"
	"net/http"
	"net/url"
	"reflect"
	"testing"
	"time"
)

const sandboxJSON = `{"id":"sb1","image":{"uri":"busybox"},"status":{"state":"Running","reason":"RUNNING","lastTransitionAt":"2026-01-02T03:04:05Z"},"metadata":{"team":"infra"},"entrypoint":["sleep","inf"],"expiresAt":"2026-01-02T04:04:05Z","createdAt":"2026-01-02T03:04:00Z"}`

func raw(status int, body string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if body != "" {
			w.Header().Set("Content-Type", "application/json")
		}
		w.WriteHeader(status)
		_, _ = w.Write([]byte(body))
	}
}

func TestNewValidates(t *testing.T) {
	for i, u := range []string{"", "127.0.0.1:8080", "ftp://x", "http://"} {
		if _, err := New(u); err == nil {
			t.Errorf("%d: New(%q) accepted", i, u)
		}
	}
	if _, err := New("http://127.0.0.1:1", WithRetry(-1, 0)); err == nil {
		t.Error("negative retry accepted")
	}
	if _, err := New("http://127.0.0.1:1", WithHTTPClient(nil)); err == nil {
		t.Error("nil http client accepted")
	}
}

func TestCreateSandbox(t *testing.T) {
	f := newFake(t)
	f.handle("POST /v1/sandboxes", raw(202, `{"id":"sb1","status":{"state":"Running"},"metadata":{},"entrypoint":["sleep","inf"],"createdAt":"2026-01-02T03:04:00Z"}`))
	// The "/v1" suffix of the base URL is accepted.
	c := mustClient(t, f.srv.URL+"/v1/", WithAPIKey("k1"), WithHeader("X-Extra", "e"))
	sb, err := c.CreateSandbox(context.Background(), CreateRequest{
		Image: &ImageSpec{URI: "busybox", Auth: &ImageAuth{Username: "u", Password: "p"}}, Entrypoint: []string{"sleep", "inf"},
		Timeout: 90 * time.Second, Env: map[string]string{"A": "1"}, Extensions: map[string]string{"moat.runtime": "crun"},
		NetworkPolicy: &NetworkPolicy{DefaultAction: "deny", Egress: []NetworkRule{{Action: "allow", Target: "pypi.org"}}},
	})
	if err != nil {
		t.Fatal(err)
	}
	if sb.ID != "sb1" || sb.Status.State != StateRunning || sb.ExpiresAt != nil || len(sb.Entrypoint) != 2 {
		t.Fatalf("sandbox %+v", sb)
	}
	r := f.last("/v1/sandboxes")
	if r.Header.Get(APIKeyHeader) != "k1" || r.Header.Get("X-Extra") != "e" || r.Header.Get("Content-Type") != "application/json" {
		t.Fatalf("headers %v", r.Header)
	}
	body := decodeBody(t, r.Body)
	want := map[string]any{
		"image":      map[string]any{"uri": "busybox", "auth": map[string]any{"username": "u", "password": "p"}},
		"entrypoint": []any{"sleep", "inf"}, "timeout": 90.0, "env": map[string]any{"A": "1"},
		"extensions":    map[string]any{"moat.runtime": "crun"},
		"networkPolicy": map[string]any{"defaultAction": "deny", "egress": []any{map[string]any{"action": "allow", "target": "pypi.org"}}},
	}
	if !reflect.DeepEqual(body, want) {
		t.Fatalf("body\n got %v\nwant %v", body, want)
	}
}

func TestCreateWithoutTimeoutOmitsIt(t *testing.T) {
	f := newFake(t)
	f.handle("POST /v1/sandboxes", raw(202, `{"id":"sb1","status":{"state":"Running"},"metadata":{},"entrypoint":[],"createdAt":"2026-01-02T03:04:00Z"}`))
	c := mustClient(t, f.srv.URL)
	if _, err := c.CreateSandbox(context.Background(), CreateRequest{Image: &ImageSpec{URI: "busybox"}, Entrypoint: []string{"sh"}}); err != nil {
		t.Fatal(err)
	}
	body := decodeBody(t, f.last("/v1/sandboxes").Body)
	if _, ok := body["timeout"]; ok {
		t.Fatalf("timeout sent: %v", body)
	}
	if _, ok := body["count"]; ok {
		t.Fatalf("count sent: %v", body)
	}
}

func TestGetListDeletePauseResume(t *testing.T) {
	f := newFake(t)
	f.handle("GET /v1/sandboxes/{id}", raw(200, sandboxJSON))
	f.handle("GET /v1/sandboxes", raw(200, `{"items":[`+sandboxJSON+`],"pagination":{"page":2,"pageSize":5,"totalItems":6,"totalPages":2,"hasNextPage":false}}`))
	f.handle("DELETE /v1/sandboxes/{id}", raw(204, ""))
	f.handle("POST /v1/sandboxes/{id}/pause", raw(202, ""))
	f.handle("POST /v1/sandboxes/{id}/resume", raw(202, ""))
	c := mustClient(t, f.srv.URL)
	ctx := context.Background()

	sb, err := c.GetSandbox(ctx, "sb1")
	if err != nil {
		t.Fatal(err)
	}
	wantExp := time.Date(2026, 1, 2, 4, 4, 5, 0, time.UTC)
	if sb.Image.URI != "busybox" || sb.ExpiresAt == nil || !sb.ExpiresAt.Equal(wantExp) || sb.Metadata["team"] != "infra" ||
		sb.Status.LastTransitionAt.IsZero() {
		t.Fatalf("sandbox %+v", sb)
	}

	list, err := c.ListSandboxes(ctx, ListOptions{States: []string{"Running", "Paused"}, Metadata: map[string]string{"team": "infra", "env": "a&b"}, Page: 2, PageSize: 5})
	if err != nil {
		t.Fatal(err)
	}
	if len(list.Items) != 1 || list.Pagination.TotalItems != 6 || list.Pagination.Page != 2 {
		t.Fatalf("list %+v", list)
	}
	q, _ := url.ParseQuery(f.last("/v1/sandboxes").RawQuery)
	if !reflect.DeepEqual(q["state"], []string{"Running", "Paused"}) || q.Get("page") != "2" || q.Get("pageSize") != "5" {
		t.Fatalf("query %v", q)
	}
	meta, err := url.ParseQuery(q.Get("metadata"))
	if err != nil || meta.Get("team") != "infra" || meta.Get("env") != "a&b" || len(meta) != 2 {
		t.Fatalf("metadata filter %q: %v", q.Get("metadata"), meta)
	}

	if _, err := c.ListSandboxes(ctx, ListOptions{}); err != nil {
		t.Fatal(err)
	}
	if rq := f.last("/v1/sandboxes").RawQuery; rq != "" {
		t.Fatalf("empty options sent query %q", rq)
	}

	for i, fn := range []func() error{
		func() error { return c.DeleteSandbox(ctx, "sb1") },
		func() error { return c.Pause(ctx, "sb1") },
		func() error { return c.Resume(ctx, "sb1") },
	} {
		if err := fn(); err != nil {
			t.Fatalf("%d: %v", i, err)
		}
	}
	rs := f.requests("/v1/sandboxes/sb1")
	var got []string
	for _, r := range rs {
		got = append(got, r.Method+" "+r.Path)
	}
	want := []string{"GET /v1/sandboxes/sb1", "DELETE /v1/sandboxes/sb1", "POST /v1/sandboxes/sb1/pause", "POST /v1/sandboxes/sb1/resume"}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("requests %v", got)
	}
}

func TestRenewPatchEndpoint(t *testing.T) {
	f := newFake(t)
	f.handle("POST /v1/sandboxes/{id}/renew-expiration", raw(200, `{"expiresAt":"2026-05-01T00:00:00Z"}`))
	f.handle("PATCH /v1/sandboxes/{id}/metadata", raw(200, sandboxJSON))
	f.handle("GET /v1/sandboxes/{id}/endpoints/{port}", raw(200, `{"endpoint":"127.0.0.1:9/sandboxes/sb1/proxy/8000","headers":{"X-A":"b"}}`))
	c := mustClient(t, f.srv.URL)
	ctx := context.Background()

	at := time.Date(2026, 5, 1, 2, 0, 0, 0, time.FixedZone("x", 2*3600))
	got, err := c.Renew(ctx, "sb1", at)
	if err != nil || !got.Equal(at) {
		t.Fatalf("renew %v %v", got, err)
	}
	if b := decodeBody(t, f.last("/v1/sandboxes/sb1/renew").Body); b["expiresAt"] != "2026-05-01T00:00:00Z" {
		t.Fatalf("renew body %v", b)
	}

	v := "x"
	if _, err := c.PatchMetadata(ctx, "sb1", map[string]*string{"add": &v, "drop": nil}); err != nil {
		t.Fatal(err)
	}
	r := f.last("/v1/sandboxes/sb1/metadata")
	if r.Header.Get("Content-Type") != "application/merge-patch+json" || string(r.Body) != `{"add":"x","drop":null}` {
		t.Fatalf("patch %q %q", r.Header.Get("Content-Type"), r.Body)
	}

	ep, err := c.Endpoint(ctx, "sb1", 8000, true)
	if err != nil || ep.Address != "127.0.0.1:9/sandboxes/sb1/proxy/8000" || ep.Headers["X-A"] != "b" {
		t.Fatalf("endpoint %+v %v", ep, err)
	}
	if r := f.last("/v1/sandboxes/sb1/endpoints/8000"); r.RawQuery != "use_server_proxy=true" {
		t.Fatalf("query %q", r.RawQuery)
	}
	if _, err := c.Endpoint(ctx, "sb1", 8000, false); err != nil {
		t.Fatal(err)
	}
	if r := f.last("/v1/sandboxes/sb1/endpoints/8000"); r.RawQuery != "" {
		t.Fatalf("query %q", r.RawQuery)
	}
}

func TestEndpointURL(t *testing.T) {
	c := mustClient(t, "https://moat.example:8443")
	for i, tc := range []struct{ in, want string }{
		{"10.88.0.5:44772", "http://10.88.0.5:44772"},
		{"moat.example:8443/sandboxes/a/proxy/44772", "https://moat.example:8443/sandboxes/a/proxy/44772"},
		{"http://x:1/", "http://x:1"},
		{"https://x:1/p", "https://x:1/p"},
	} {
		got, err := c.endpointURL(tc.in)
		if err != nil || got != tc.want {
			t.Errorf("%d: endpointURL(%q) = %q, %v; want %q", i, tc.in, got, err, tc.want)
		}
	}
}

func TestPoolsAndBatch(t *testing.T) {
	const pool = `{"name":"p1","template":{"image":{"uri":"busybox"},"entrypoint":["sleep","inf"]},"capacitySpec":{"bufferMin":1,"bufferMax":2,"poolMin":0,"poolMax":4},"status":{"total":2,"allocated":1,"available":1,"revision":"3"},"createdAt":"2026-01-02T03:04:00Z"}`
	f := newFake(t)
	f.handle("POST /v1/pools", raw(201, pool))
	f.handle("GET /v1/pools/{name}", raw(200, pool))
	f.handle("PUT /v1/pools/{name}", raw(200, pool))
	f.handle("GET /v1/pools", raw(200, `{"items":[`+pool+`]}`))
	f.handle("DELETE /v1/pools/{name}", raw(204, ""))
	f.handle("POST /v1/sandboxes/batch", raw(202, `{"items":[{"id":"a","status":{"state":"Running"},"metadata":{},"entrypoint":[],"createdAt":"2026-01-02T03:04:00Z"},{"id":"b","status":{"state":"Running"},"metadata":{},"entrypoint":[],"createdAt":"2026-01-02T03:04:00Z"}]}`))
	c := mustClient(t, f.srv.URL)
	ctx := context.Background()
	spec := PoolSpec{Name: "p1", Template: PoolTemplate{Image: &ImageSpec{URI: "busybox"}, Entrypoint: []string{"sleep", "inf"}},
		CapacitySpec: PoolCapacity{BufferMin: 1, BufferMax: 2, PoolMax: 4}}
	p, err := c.CreatePool(ctx, spec)
	if err != nil || p.Status.Revision != "3" || p.CapacitySpec.PoolMax != 4 || p.Template.Image.URI != "busybox" {
		t.Fatalf("create pool %+v %v", p, err)
	}
	b := decodeBody(t, f.last("/v1/pools").Body)
	if b["name"] != "p1" || b["capacitySpec"].(map[string]any)["bufferMax"] != 2.0 {
		t.Fatalf("pool body %v", b)
	}
	if p, err := c.GetPool(ctx, "p1"); err != nil || p.Name != "p1" {
		t.Fatalf("get pool %+v %v", p, err)
	}
	if ps, err := c.ListPools(ctx); err != nil || len(ps) != 1 {
		t.Fatalf("list pools %+v %v", ps, err)
	}
	if _, err := c.UpdatePool(ctx, spec); err != nil {
		t.Fatal(err)
	}
	if r := f.last("/v1/pools/p1"); r.Method != "PUT" {
		t.Fatalf("update used %s", r.Method)
	}
	if err := c.DeletePool(ctx, "p1"); err != nil {
		t.Fatal(err)
	}

	sbs, err := c.CreateBatch(ctx, CreateRequest{Extensions: map[string]string{"poolRef": "p1"}}, 2)
	if err != nil || len(sbs) != 2 || sbs[1].ID != "b" {
		t.Fatalf("batch %+v %v", sbs, err)
	}
	b = decodeBody(t, f.last("/v1/sandboxes/batch").Body)
	if b["count"] != 2.0 || b["extensions"].(map[string]any)["poolRef"] != "p1" {
		t.Fatalf("batch body %v", b)
	}
	if _, err := c.CreateBatch(ctx, CreateRequest{}, 0); !IsInvalid(err) {
		t.Fatalf("count 0: %v", err)
	}
}

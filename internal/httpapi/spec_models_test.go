package httpapi_test

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/moat-sandbox/moat/internal/gen/lifecycleapi"
	"github.com/moat-sandbox/moat/internal/gen/wirecheck"
)

// rawBody sends one request and returns the status and body.
func rawBody(t *testing.T, srv *httptest.Server, method, path, body string) (int, json.RawMessage) {
	t.Helper()
	var r io.Reader
	if body != "" {
		r = strings.NewReader(body)
	}
	req, _ := http.NewRequest(method, srv.URL+path, r)
	req.Header.Set("OPEN-SANDBOX-API-KEY", key)
	resp, err := srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, raw
}

// expect checks the status and that the body is an instance of model M.
func expect[M any](t *testing.T, srv *httptest.Server, method, path, body string, status int) M {
	t.Helper()
	code, raw := rawBody(t, srv, method, path, body)
	if code != status {
		t.Fatalf("%s %s: status %d, want %d: %s", method, path, code, status, raw)
	}
	wirecheck.Response[M](t, method+" "+path, raw)
	var m M
	if err := json.Unmarshal(raw, &m); err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	return m
}

// TestHandlersMatchSpecModels drives the real handlers (fake runtime) and
// holds every JSON body they answer to the model generated from
// lifecycle.yaml: no undeclared field, no missing required field, no null.
func TestHandlersMatchSpecModels(t *testing.T) {
	srv := newSnapshotAPI(t)
	expect[struct {
		Status string `json:"status"`
	}](t, srv, "GET", "/health", "", 200)

	created := expect[lifecycleapi.CreateSandboxResponse](t, srv, "POST", "/v1/sandboxes",
		`{"image":{"uri":"busybox"},"entrypoint":["sh"],"metadata":{"app":"x"},"timeout":120,"platform":{"os":"linux","arch":"amd64"}}`, 202)
	manual := expect[lifecycleapi.CreateSandboxResponse](t, srv, "POST", "/v1/sandboxes", `{"image":{"uri":"busybox"},"entrypoint":["sh"]}`, 202)
	if manual.ExpiresAt != nil {
		t.Errorf("manual-cleanup sandbox has expiresAt %v", manual.ExpiresAt)
	}
	id := created.ID
	expect[lifecycleapi.Sandbox](t, srv, "GET", "/v1/sandboxes/"+id, "", 200)
	expect[lifecycleapi.Sandbox](t, srv, "GET", "/sandboxes/"+manual.ID, "", 200)
	list := expect[lifecycleapi.ListSandboxesResponse](t, srv, "GET", "/v1/sandboxes?pageSize=1", "", 200)
	if len(list.Items) != 1 || list.Pagination.TotalItems != 2 || !list.Pagination.HasNextPage {
		t.Errorf("list: %+v", list)
	}
	expect[lifecycleapi.ListSandboxesResponse](t, srv, "GET", "/v1/sandboxes?metadata=app%3Dnone", "", 200)
	at := time.Now().Add(2 * time.Hour).UTC().Format(time.RFC3339)
	expect[lifecycleapi.RenewSandboxExpirationResponse](t, srv, "POST", "/v1/sandboxes/"+id+"/renew-expiration", `{"expiresAt":"`+at+`"}`, 200)
	expect[lifecycleapi.Sandbox](t, srv, "PATCH", "/v1/sandboxes/"+id+"/metadata", `{"app":null,"k":"v"}`, 200)
	expect[lifecycleapi.Endpoint](t, srv, "GET", "/v1/sandboxes/"+id+"/endpoints/8000", "", 200)
	expect[lifecycleapi.Endpoint](t, srv, "GET", "/v1/sandboxes/"+id+"/endpoints/8000?use_server_proxy=true", "", 200)

	sn := expect[lifecycleapi.Snapshot](t, srv, "POST", "/v1/sandboxes/"+id+"/snapshots", `{"name":"s1"}`, 202)
	expect[lifecycleapi.Snapshot](t, srv, "POST", "/v1/sandboxes/"+id+"/snapshots", "", 202)
	expect[lifecycleapi.Snapshot](t, srv, "GET", "/v1/snapshots/"+sn.ID, "", 200)
	op := expect[lifecycleapi.Operation](t, srv, "POST", "/v1/sandboxes/"+id+"/fork", `{"count":1,"metadata":{"k":"v"}}`, 202)
	for deadline := time.Now().Add(10 * time.Second); op.State == lifecycleapi.OperationStateRunning && time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		op = expect[lifecycleapi.Operation](t, srv, "GET", "/v1/operations/"+op.ID, "", 200)
	}
	if op.State == lifecycleapi.OperationStateRunning {
		t.Fatalf("fork %s still Running", op.ID)
	}
	expect[lifecycleapi.ListSnapshotsResponse](t, srv, "GET", "/v1/snapshots?sandboxId="+id, "", 200)

	pool := `{"name":"warm","template":{"image":{"uri":"busybox"},"entrypoint":["sh"],"env":{"A":"b"},"extensions":{"other":"v"}},"capacitySpec":{"bufferMin":0,"bufferMax":1,"poolMin":0,"poolMax":2}}`
	expect[lifecycleapi.Pool](t, srv, "POST", "/v1/pools", pool, 201)
	expect[lifecycleapi.Pool](t, srv, "POST", "/v1/pools", `{"name":"fork","template":{"snapshotId":"`+sn.ID+`"},"capacitySpec":{"poolMax":1}}`, 201)
	expect[lifecycleapi.Pool](t, srv, "GET", "/v1/pools/warm", "", 200)
	expect[lifecycleapi.Pool](t, srv, "PUT", "/v1/pools/warm", strings.Replace(pool, `"bufferMax":1`, `"bufferMax":2`, 1), 200)
	expect[lifecycleapi.ListPoolsResponse](t, srv, "GET", "/v1/pools", "", 200)
	batch := expect[lifecycleapi.BatchCreateSandboxResponse](t, srv, "POST", "/v1/sandboxes/batch", `{"count":2,"extensions":{"poolRef":"warm"}}`, 202)
	if len(batch.Items) != 2 {
		t.Errorf("batch: %+v", batch)
	}

	// Errors share one envelope.
	expect[lifecycleapi.ErrorResponse](t, srv, "GET", "/v1/sandboxes/nope", "", 404)
	expect[lifecycleapi.ErrorResponse](t, srv, "POST", "/v1/sandboxes", `{"image":{"uri":""}}`, 400)
	expect[lifecycleapi.ErrorResponse](t, srv, "GET", "/v1/pools/nope", "", 404)
	expect[lifecycleapi.ErrorResponse](t, srv, "GET", "/v1/snapshots/nope", "", 404)
}

package httpapi_test

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"testing"
	"time"

	"github.com/moat-sandbox/moat/internal/httpapi"
	"github.com/moat-sandbox/moat/internal/image"
	"github.com/moat-sandbox/moat/internal/lifecycle"
	"github.com/moat-sandbox/moat/internal/runtime/fake"
	"github.com/moat-sandbox/moat/internal/sandbox"
	"github.com/moat-sandbox/moat/internal/store"
)

type committer struct{}

func (committer) Commit(ctx context.Context, upperDir, baseRef, name string) (image.Image, error) {
	return image.Image{Name: name}, nil
}
func (committer) Remove(ctx context.Context, ref string) error { return nil }

func newSnapshotAPI(t *testing.T) *httptest.Server {
	t.Helper()
	db, err := store.Open(context.Background(), filepath.Join(t.TempDir(), "s.db"), time.Second)
	if err != nil {
		t.Fatal(err)
	}
	rt := fake.New(fake.Hooks{})
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	svc, err := sandbox.New(sandbox.Config{Config: lifecycle.Config{}}, sandbox.Deps{Deps: lifecycle.Deps{Store: db, Runtime: rt, Images: images{}, Log: log}, Committer: committer{}})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(httpapi.New(httpapi.Config{APIKey: key}, svc, log).Handler())
	t.Cleanup(func() { srv.Close(); svc.Close(); rt.Close(); db.Close() })
	return srv
}

func TestSnapshotRoutes(t *testing.T) {
	srv := newSnapshotAPI(t)
	code, sb, _ := call(t, srv, "POST", "/v1/sandboxes", createBody)
	if code != http.StatusAccepted {
		t.Fatalf("create sandbox: %d %v", code, sb)
	}
	id := sb["id"].(string)

	// No body is accepted, as upstream (name is optional).
	code, sn, hdr := call(t, srv, "POST", "/sandboxes/"+id+"/snapshots", "")
	if code != http.StatusAccepted || sn["sandboxId"] != id || sn["status"].(map[string]any)["state"] != "Ready" || sn["createdAt"] == nil {
		t.Fatalf("snapshot: %d %v", code, sn)
	}
	if _, ok := sn["name"]; ok {
		t.Fatalf("empty name not omitted: %v", sn)
	}
	if _, ok := sn["image"]; ok {
		t.Fatalf("internal image field leaked: %v", sn)
	}
	snID := sn["id"].(string)
	if hdr.Get("Location") != "/v1/snapshots/"+snID {
		t.Fatalf("location %q", hdr.Get("Location"))
	}
	code, named, _ := call(t, srv, "POST", "/v1/sandboxes/"+id+"/snapshots", `{"name":"two"}`)
	if code != http.StatusAccepted || named["name"] != "two" {
		t.Fatalf("named snapshot: %d %v", code, named)
	}
	if code, body, _ := call(t, srv, "POST", "/v1/sandboxes/nope/snapshots", `{}`); code != http.StatusNotFound {
		t.Fatalf("unknown sandbox: %d %v", code, body)
	}

	code, got, _ := call(t, srv, "GET", "/v1/snapshots/"+snID, "")
	if code != http.StatusOK || got["id"] != snID {
		t.Fatalf("get: %d %v", code, got)
	}
	if code, body, _ := call(t, srv, "GET", "/snapshots/nope", ""); code != http.StatusNotFound || body["code"] != "SNAPSHOT::NOT_FOUND" {
		t.Fatalf("get unknown: %d %v", code, body)
	}

	code, list, _ := call(t, srv, "GET", "/v1/snapshots?sandboxId="+id+"&state=ready&pageSize=1", "")
	if code != http.StatusOK {
		t.Fatalf("list: %d %v", code, list)
	}
	items := list["items"].([]any)
	pg := list["pagination"].(map[string]any)
	if len(items) != 1 || pg["totalItems"].(float64) != 2 || pg["totalPages"].(float64) != 2 || pg["hasNextPage"] != true {
		t.Fatalf("list: %v", list)
	}
	// A state moat never reports matches nothing; it is no error.
	if code, body, _ := call(t, srv, "GET", "/v1/snapshots?state=Running", ""); code != http.StatusOK || len(body["items"].([]any)) != 0 {
		t.Fatalf("unknown state filter: %d %v", code, body)
	}
	if code, body, _ := call(t, srv, "GET", "/v1/snapshots?sandboxId="+id+"&state=Archived,READY", ""); code != http.StatusOK || len(body["items"].([]any)) != 2 {
		t.Fatalf("unknown and known state filter: %d %v", code, body)
	}
	if code, body, _ := call(t, srv, "GET", "/v1/snapshots?sandboxId=other", ""); code != http.StatusOK || len(body["items"].([]any)) != 0 {
		t.Fatalf("other sandbox: %d %v", code, body)
	}

	// Fork: a batch from the snapshot, then delete refused while in use.
	code, batch, _ := call(t, srv, "POST", "/v1/sandboxes/batch", `{"snapshotId":"`+snID+`","count":2}`)
	if code != http.StatusAccepted || len(batch["items"].([]any)) != 2 {
		t.Fatalf("batch: %d %v", code, batch)
	}
	fork := batch["items"].([]any)[0].(map[string]any)
	code, fsb, _ := call(t, srv, "GET", "/v1/sandboxes/"+fork["id"].(string), "")
	if code != http.StatusOK || fsb["snapshotId"] != snID || fsb["image"] != nil {
		t.Fatalf("fork: %d %v", code, fsb)
	}
	if ep := fsb["entrypoint"].([]any); len(ep) != 3 || ep[0] != "tail" {
		t.Fatalf("fork entrypoint %v", ep)
	}
	if code, body, _ := call(t, srv, "DELETE", "/v1/snapshots/"+snID, ""); code != http.StatusConflict || body["code"] != "SNAPSHOT::IN_USE" {
		t.Fatalf("delete in use: %d %v", code, body)
	}
	for _, it := range batch["items"].([]any) {
		if code, _, _ := call(t, srv, "DELETE", "/v1/sandboxes/"+it.(map[string]any)["id"].(string), ""); code != http.StatusNoContent {
			t.Fatalf("delete fork: %d", code)
		}
	}
	if code, body, _ := call(t, srv, "DELETE", "/v1/snapshots/"+snID, ""); code != http.StatusNoContent {
		t.Fatalf("delete: %d %v", code, body)
	}
	if code, _, _ := call(t, srv, "GET", "/v1/snapshots/"+snID, ""); code != http.StatusNotFound {
		t.Fatalf("get deleted: %d", code)
	}

	// Only Running or Paused sandboxes.
	if code, _, _ := call(t, srv, "POST", "/v1/sandboxes/"+id+"/pause", ""); code != http.StatusAccepted {
		t.Fatalf("pause: %d", code)
	}
	if code, body, _ := call(t, srv, "POST", "/v1/sandboxes/"+id+"/snapshots", `{}`); code != http.StatusAccepted {
		t.Fatalf("snapshot paused: %d %v", code, body)
	}
}

func TestSnapshotUnsupportedRuntime(t *testing.T) {
	srv := newAPI(t) // no committer
	code, sb, _ := call(t, srv, "POST", "/v1/sandboxes", createBody)
	if code != http.StatusAccepted {
		t.Fatalf("create: %d %v", code, sb)
	}
	code, body, _ := call(t, srv, "POST", "/v1/sandboxes/"+sb["id"].(string)+"/snapshots", `{}`)
	if code != http.StatusNotImplemented || body["code"] != "SANDBOX::API_NOT_SUPPORTED" {
		t.Fatalf("snapshot without committer: %d %v", code, body)
	}
	if code, body, _ := call(t, srv, "POST", "/v1/sandboxes", `{"snapshotId":"nope"}`); code != http.StatusNotFound || body["code"] != "SNAPSHOT::NOT_FOUND" {
		t.Fatalf("create from unknown snapshot: %d %v", code, body)
	}
}

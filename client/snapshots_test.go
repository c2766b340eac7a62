package client

import (
	"context"
	"net/url"
	"reflect"
	"testing"
)

func TestSnapshots(t *testing.T) {
	const snap = `{"id":"s1","sandboxId":"sb1","name":"n","status":{"state":"Ready","reason":"snapshot_ready"},"createdAt":"2026-01-02T03:04:00Z"}`
	f := newFake(t)
	f.handle("POST /v1/sandboxes/{id}/snapshots", raw(202, snap))
	f.handle("GET /v1/snapshots/{id}", raw(200, snap))
	f.handle("GET /v1/snapshots", raw(200, `{"items":[`+snap+`],"pagination":{"page":1,"pageSize":20,"totalItems":1,"totalPages":1,"hasNextPage":false}}`))
	f.handle("DELETE /v1/snapshots/{id}", raw(409, `{"code":"SNAPSHOT::IN_USE","message":"in use"}`))
	c := mustClient(t, f.srv.URL)
	ctx := context.Background()
	s, err := c.CreateSnapshot(ctx, "sb1", "n")
	if err != nil || s.ID != "s1" || s.Status.State != SnapshotReady || s.SandboxID != "sb1" {
		t.Fatalf("create %+v %v", s, err)
	}
	if b := f.last("/v1/sandboxes/sb1/snapshots").Body; string(b) != `{"name":"n"}` {
		t.Fatalf("create body %q", b)
	}
	if s, err := c.GetSnapshot(ctx, "s1"); err != nil || s.Name != "n" {
		t.Fatalf("get %+v %v", s, err)
	}
	l, err := c.ListSnapshots(ctx, SnapshotListOptions{SandboxID: "sb1", States: []string{"Ready", "Failed"}})
	if err != nil || len(l.Items) != 1 {
		t.Fatalf("list %+v %v", l, err)
	}
	q, _ := url.ParseQuery(f.last("/v1/snapshots").RawQuery)
	if q.Get("sandboxId") != "sb1" || !reflect.DeepEqual(q["state"], []string{"Ready", "Failed"}) {
		t.Fatalf("query %v", q)
	}
	if err := c.DeleteSnapshot(ctx, "s1"); !IsConflict(err) {
		t.Fatalf("delete in use: %v", err)
	}
}

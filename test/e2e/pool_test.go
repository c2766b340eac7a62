package e2e

import (
	"encoding/json"
	"testing"
	"time"
)

func TestWarmPoolAndBatch(t *testing.T) {
	srv := newServer(t)
	ref := startRegistry(t)
	srv.start()
	srv.mustJSON(201, "POST", "/v1/pools", map[string]any{
		"name":         "warm",
		"template":     map[string]any{"image": map[string]string{"uri": ref}, "entrypoint": []string{"tail", "-f", "/dev/null"}, "extensions": map[string]string{"moat.runtime": "crun"}},
		"capacitySpec": map[string]int{"bufferMin": 2, "bufferMax": 3, "poolMin": 0, "poolMax": 20},
	}, nil)
	waitPool := func(avail int) {
		t.Helper()
		deadline := time.Now().Add(60 * time.Second)
		for {
			var p struct {
				Status struct{ Available, Allocated, Total int }
			}
			srv.mustJSON(200, "GET", "/v1/pools/warm", nil, &p)
			if p.Status.Available == avail {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("pool status %+v, want %d available", p.Status, avail)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	waitPool(3)

	var c sandboxResp
	srv.mustJSON(202, "POST", "/v1/sandboxes", map[string]any{"extensions": map[string]string{"poolRef": "warm"},
		"metadata": map[string]string{"who": "claim"}, "env": map[string]string{"CLAIMED": "yes"}, "timeout": 300}, &c)
	if c.Status.State != "Running" || c.Metadata["who"] != "claim" || c.ExpiresAt == "" {
		t.Fatalf("claim: %+v", c)
	}
	if out, ok := shell(t, srv, c.ID, "echo claimed $CLAIMED"); !ok || out != "claimed yes" {
		t.Fatalf("command in claimed sandbox: %v %q", ok, out)
	}
	waitPool(2) // still >= bufferMin: no refill yet

	// A batch larger than the warm buffer: 2 claimed + 5 cold.
	var b struct{ Items []sandboxResp }
	srv.mustJSON(202, "POST", "/v1/sandboxes/batch", map[string]any{"count": 7, "extensions": map[string]string{"poolRef": "warm"},
		"metadata": map[string]string{"who": "batch"}}, &b)
	if len(b.Items) != 7 {
		t.Fatalf("batch returned %d", len(b.Items))
	}
	for _, it := range b.Items {
		if it.Status.State != "Running" {
			t.Fatalf("batch member %+v", it)
		}
	}
	if out, ok := shell(t, srv, b.Items[6].ID, "echo cold"); !ok || out != "cold" {
		t.Fatalf("command in cold batch member: %v %q", ok, out)
	}

	// The pool and its ledger survive a crash of the server.
	srv.kill9()
	srv.start()
	var p struct {
		Status struct{ Available, Allocated, Total int }
	}
	srv.mustJSON(200, "GET", "/v1/pools/warm", nil, &p)
	if p.Status.Allocated != 8 {
		t.Fatalf("after restart: %+v, want 8 allocated", p.Status)
	}
	waitPool(3)

	// Back-pressure: 8 claimed + 3 idle + 10 cold would pass poolMax 20.
	// The claim is refused with upstream's 429 and nothing is claimed.
	code, body, hdr := srv.do("POST", "/v1/sandboxes/batch", map[string]any{"count": 13, "extensions": map[string]string{"poolRef": "warm"}})
	var e struct{ Code, Message string }
	json.Unmarshal(body, &e)
	if code != 429 || e.Code != "KUBERNETES::POOL_CAPACITY_EXHAUSTED" || hdr.Get("Retry-After") == "" {
		t.Fatalf("batch past poolMax: %d %s (Retry-After %q)", code, body, hdr.Get("Retry-After"))
	}
	srv.mustJSON(200, "GET", "/v1/pools/warm", nil, &p)
	if p.Status.Allocated != 8 || p.Status.Available != 3 {
		t.Fatalf("a refused claim changed the pool: %+v", p.Status)
	}

	if code, body, _ := srv.do("DELETE", "/v1/pools/warm", nil); code != 204 {
		t.Fatalf("delete pool: %d %s", code, body)
	}
	ids := []string{c.ID}
	for _, it := range b.Items {
		ids = append(ids, it.ID)
	}
	for _, id := range ids {
		if code, body, _ := srv.do("DELETE", "/v1/sandboxes/"+id, nil); code != 204 {
			t.Fatalf("delete %s: %d %s", id, code, body)
		}
		assertNoLeaks(t, srv, id)
	}
	var list struct{ Pagination struct{ TotalItems int } }
	srv.mustJSON(200, "GET", "/v1/sandboxes", nil, &list)
	if list.Pagination.TotalItems != 0 {
		t.Fatalf("%d sandboxes left", list.Pagination.TotalItems)
	}
}

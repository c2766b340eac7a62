package e2e

import (
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestMemorySnapshotFork snapshots a running gVisor sandbox with its
// memory (runsc checkpoint) and forks it: the forks continue the source's
// background process from its in-memory state, see its writable layer,
// get their own address, access token and env, and the snapshot and the
// forks survive a server restart. It needs a runsc that can checkpoint
// (scripts/build-runsc.sh; `make test` puts it first on PATH).
func TestMemorySnapshotFork(t *testing.T) {
	srv := newServer(t)
	ref := startRegistry(t)
	srv.start("--runtime-class", "runsc")

	var src sandboxResp
	srv.mustJSON(202, "POST", "/v1/sandboxes", map[string]any{
		"image":      map[string]any{"uri": ref},
		"entrypoint": []string{"sleep", "3600"},
		"timeout":    600,
	}, &src)
	counter := func(id string) int {
		t.Helper()
		out, ok := shell(t, srv, id, "cat /tmp/counter")
		n, err := strconv.Atoi(out)
		if !ok || err != nil {
			t.Fatalf("counter of %s: ok=%v %q", id, ok, out)
		}
		return n
	}
	// The loop's count lives in the shell's memory; the file only shows it.
	if out, ok := shell(t, srv, src.ID, "mkdir -p /work && echo source-state > /work/state.txt && "+
		"(i=0; while :; do i=$((i+1)); echo $i > /tmp/counter; sleep 0.1; done) </dev/null >/dev/null 2>&1 & echo started"); !ok || out != "started" {
		t.Fatalf("start loop: ok=%v %q", ok, out)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		if out, _ := shell(t, srv, src.ID, "cat /tmp/counter 2>/dev/null"); out != "" {
			if n, _ := strconv.Atoi(out); n >= 10 {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatal("the loop does not count")
		}
		time.Sleep(100 * time.Millisecond)
	}
	before := counter(src.ID)

	var sn snapshotResp
	srv.mustJSON(202, "POST", "/v1/sandboxes/"+src.ID+"/snapshots", map[string]any{"name": "mem"}, &sn)
	srv.mustJSON(200, "GET", "/v1/snapshots/"+sn.ID, nil, &sn)
	if sn.Status.State != "Ready" || !strings.Contains(sn.Status.Message, "memory") {
		t.Fatalf("snapshot %+v", sn)
	}
	if strings.Contains(string(mustBody(t, srv, "GET", "/v1/snapshots/"+sn.ID)), "oken") {
		t.Fatal("the snapshot exposes a token")
	}
	// The source keeps running and counting.
	if a, b := counter(src.ID), before; a <= b {
		time.Sleep(time.Second)
		if a = counter(src.ID); a <= b {
			t.Fatalf("source counter after snapshot %d, before %d", a, b)
		}
	}

	// Requests a memory snapshot cannot honour are refused.
	if code, body, _ := srv.do("POST", "/v1/sandboxes", map[string]any{"snapshotId": sn.ID,
		"extensions": map[string]string{"moat.runtime": "runc"}}); code != 400 {
		t.Fatalf("restore with runc: %d %s", code, body)
	}

	var batch struct{ Items []sandboxResp }
	srv.mustJSON(202, "POST", "/v1/sandboxes/batch", map[string]any{"snapshotId": sn.ID, "count": 2, "timeout": 600,
		"env": map[string]string{"FORKED": "yes"}}, &batch)
	if len(batch.Items) != 2 {
		t.Fatalf("batch returned %d sandboxes", len(batch.Items))
	}
	srcBase, srcHdr := srv.agent(src.ID)
	for _, f := range batch.Items {
		if f.Status.State != "Running" || strings.Join(f.Entrypoint, " ") != "sleep 3600" {
			t.Fatalf("fork %+v", f)
		}
		base, hdr := srv.agent(f.ID)
		if base == srcBase {
			t.Fatalf("fork %s has the source's address %s", f.ID, base)
		}
		if hdr["X-EXECD-ACCESS-TOKEN"] == srcHdr["X-EXECD-ACCESS-TOKEN"] {
			t.Fatalf("fork %s has the source's token", f.ID)
		}
		// The restored agent was given its own token: the source's is refused.
		req, _ := http.NewRequest("GET", base+"/ping", nil)
		req.Header.Set("X-EXECD-ACCESS-TOKEN", srcHdr["X-EXECD-ACCESS-TOKEN"])
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 401 {
			t.Fatalf("fork %s accepts the source's token: %d", f.ID, resp.StatusCode)
		}
		out, ok := shell(t, srv, f.ID, "cat /work/state.txt; echo $FORKED")
		if !ok || out != "source-state\nyes" {
			t.Fatalf("fork %s: ok=%v %q", f.ID, ok, out)
		}
		// The loop runs in the fork and counts on from its saved value: a
		// loop started afresh would begin at 1.
		shell(t, srv, f.ID, "rm -f /tmp/counter")
		var n int
		deadline := time.Now().Add(10 * time.Second)
		for {
			if out, _ := shell(t, srv, f.ID, "cat /tmp/counter 2>/dev/null"); out != "" {
				n, _ = strconv.Atoi(out)
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("fork %s: the checkpointed loop is not running", f.ID)
			}
			time.Sleep(100 * time.Millisecond)
		}
		if n <= before {
			t.Fatalf("fork %s counter %d, source was at %d before the snapshot", f.ID, n, before)
		}
		// Forks are independent copies.
		shell(t, srv, f.ID, "echo "+f.ID+" > /work/state.txt")
	}
	if out, _ := shell(t, srv, src.ID, "cat /work/state.txt; echo -$FORKED-"); out != "source-state\n--" {
		t.Fatalf("a fork changed the source: %q", out)
	}

	// A paused gVisor sandbox cannot be snapshotted with its memory.
	srv.mustJSON(202, "POST", "/v1/sandboxes/"+src.ID+"/pause", nil, nil)
	if code, body, _ := srv.do("POST", "/v1/sandboxes/"+src.ID+"/snapshots", map[string]any{}); code != 409 || !strings.Contains(string(body), "SNAPSHOT::INVALID_SOURCE_STATE") {
		t.Fatalf("snapshot of a paused runsc sandbox: %d %s", code, body)
	}
	srv.mustJSON(202, "POST", "/v1/sandboxes/"+src.ID+"/resume", nil, nil)

	// Snapshot, checkpoint and forks survive a server restart; the source
	// can go, the snapshot stays usable.
	srv.stop()
	srv.start("--runtime-class", "runsc")
	srv.mustJSON(204, "DELETE", "/v1/sandboxes/"+src.ID, nil, nil)
	for _, f := range batch.Items {
		if out, ok := shell(t, srv, f.ID, "cat /work/state.txt"); !ok || out != f.ID {
			t.Fatalf("fork %s after restart: ok=%v %q", f.ID, ok, out)
		}
	}
	var late sandboxResp
	srv.mustJSON(202, "POST", "/v1/sandboxes", map[string]any{"snapshotId": sn.ID, "timeout": 600}, &late)
	if out, ok := shell(t, srv, late.ID, "cat /work/state.txt"); !ok || out != "source-state" {
		t.Fatalf("restore after restart: ok=%v %q", ok, out)
	}

	code, body, _ := srv.do("DELETE", "/v1/snapshots/"+sn.ID, nil)
	if code != 409 || !strings.Contains(string(body), "SNAPSHOT::IN_USE") {
		t.Fatalf("delete in use: %d %s", code, body)
	}
	ckpt, _ := filepath.Glob(filepath.Join(srv.root, "*", "checkpoints", sn.ID))
	if len(ckpt) != 1 {
		t.Fatalf("checkpoint dir of %s: %v", sn.ID, ckpt)
	}
	for _, id := range []string{batch.Items[0].ID, batch.Items[1].ID, late.ID} {
		srv.mustJSON(204, "DELETE", "/v1/sandboxes/"+id, nil, nil)
	}
	srv.mustJSON(204, "DELETE", "/v1/snapshots/"+sn.ID, nil, nil)
	if _, err := os.Stat(ckpt[0]); !os.IsNotExist(err) {
		t.Fatalf("checkpoint left after the snapshot was deleted: %v", err)
	}
}

func mustBody(t *testing.T, srv *server, method, path string) []byte {
	t.Helper()
	code, body, _ := srv.do(method, path, nil)
	if code != 200 {
		t.Fatalf("%s %s: %d %s", method, path, code, body)
	}
	return body
}

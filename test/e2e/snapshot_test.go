package e2e

import (
	"strings"
	"testing"
)

type snapshotResp struct {
	ID        string `json:"id"`
	SandboxID string `json:"sandboxId"`
	Name      string `json:"name"`
	Status    struct {
		State, Reason, Message string
	} `json:"status"`
	CreatedAt string `json:"createdAt"`
}

// TestSnapshotFork writes a file in a sandbox, snapshots it, forks three
// sandboxes from the snapshot in one batch call, checks each sees the
// file, and that the snapshot cannot be deleted while they exist.
func TestSnapshotFork(t *testing.T) {
	srv := newServer(t)
	ref := startRegistry(t)
	srv.start()

	var src sandboxResp
	srv.mustJSON(202, "POST", "/v1/sandboxes", map[string]any{
		"image":      map[string]any{"uri": ref},
		"entrypoint": []string{"tail", "-f", "/dev/null"},
		"timeout":    600,
	}, &src)
	base, hdr := srv.agent(src.ID)
	evs := runCommand(t, base, hdr, "mkdir -p /work && echo forked-state > /work/state.txt && rm /etc/motd 2>/dev/null; echo ok")
	assertCompleted(t, evs)

	var sn snapshotResp
	srv.mustJSON(202, "POST", "/v1/sandboxes/"+src.ID+"/snapshots", map[string]any{"name": "e2e"}, &sn)
	if sn.ID == "" || sn.SandboxID != src.ID || sn.Name != "e2e" || (sn.Status.State != "Ready" && sn.Status.State != "Creating") {
		t.Fatalf("snapshot %+v", sn)
	}
	// Clients poll until Ready (moat is synchronous: already Ready).
	srv.mustJSON(200, "GET", "/v1/snapshots/"+sn.ID, nil, &sn)
	if sn.Status.State != "Ready" {
		t.Fatalf("snapshot state %+v", sn.Status)
	}
	// The source was thawed and still works.
	var got sandboxResp
	srv.mustJSON(200, "GET", "/v1/sandboxes/"+src.ID, nil, &got)
	if got.Status.State != "Running" {
		t.Fatalf("source after snapshot: %s", got.Status.State)
	}
	if out := stdoutOf(runCommand(t, base, hdr, "cat /work/state.txt")); out != "forked-state" {
		t.Fatalf("source stdout %q", out)
	}

	var batch struct{ Items []sandboxResp }
	srv.mustJSON(202, "POST", "/v1/sandboxes/batch", map[string]any{"snapshotId": sn.ID, "count": 3, "timeout": 600}, &batch)
	if len(batch.Items) != 3 {
		t.Fatalf("batch returned %d sandboxes", len(batch.Items))
	}
	for _, f := range batch.Items {
		if f.Status.State != "Running" || strings.Join(f.Entrypoint, " ") != "tail -f /dev/null" {
			t.Fatalf("fork %+v", f)
		}
		b, h := srv.agent(f.ID)
		evs := runCommand(t, b, h, "cat /work/state.txt; test -e /etc/motd && echo motd-present; echo $((1+1))")
		assertCompleted(t, evs)
		if out := stdoutOf(evs); out != "forked-state\n2" {
			t.Fatalf("fork %s sees %q", f.ID, out)
		}
		// Forks are independent copies.
		runCommand(t, b, h, "echo "+f.ID+" > /work/state.txt")
	}
	if out := stdoutOf(runCommand(t, base, hdr, "cat /work/state.txt")); out != "forked-state" {
		t.Fatalf("a fork changed the source: %q", out)
	}

	var list struct {
		Items      []snapshotResp
		Pagination struct{ TotalItems int }
	}
	srv.mustJSON(200, "GET", "/v1/snapshots?sandboxId="+src.ID+"&state=Ready", nil, &list)
	if len(list.Items) != 1 || list.Items[0].ID != sn.ID || list.Pagination.TotalItems != 1 {
		t.Fatalf("list %+v", list)
	}

	// The snapshot survives a server restart.
	srv.stop()
	srv.start()
	srv.mustJSON(200, "GET", "/v1/snapshots/"+sn.ID, nil, &sn)
	if sn.Status.State != "Ready" {
		t.Fatalf("after restart: %+v", sn.Status)
	}

	code, body, _ := srv.do("DELETE", "/v1/snapshots/"+sn.ID, nil)
	if code != 409 || !strings.Contains(string(body), "SNAPSHOT::IN_USE") {
		t.Fatalf("delete in use: %d %s", code, body)
	}
	for _, f := range batch.Items {
		srv.mustJSON(204, "DELETE", "/v1/sandboxes/"+f.ID, nil, nil)
	}
	srv.mustJSON(204, "DELETE", "/v1/snapshots/"+sn.ID, nil, nil)
	if code, _, _ := srv.do("GET", "/v1/snapshots/"+sn.ID, nil); code != 404 {
		t.Fatalf("get deleted snapshot: %d", code)
	}
	if code, body, _ := srv.do("POST", "/v1/sandboxes", map[string]any{"snapshotId": sn.ID}); code != 404 {
		t.Fatalf("create from deleted snapshot: %d %s", code, body)
	}
}

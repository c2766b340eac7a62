package e2e

import (
	"context"
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/client"

	sbv1 "github.com/moat-sandbox/moat/api/v1alpha1"
	"github.com/moat-sandbox/moat/internal/k8s/kclient"
	"github.com/moat-sandbox/moat/internal/k8s/snapreg"
)

// TestKubernetesSnapshot drives snapshots through `moat serve --runtime
// kubernetes` on a real node: a file written in a sandbox is in the
// snapshot (a SandboxSnapshot, committed by moat node and pushed to the
// node's loopback registry), the source keeps running, a create and a
// batch from the snapshot see the file, and deleting the snapshot
// deletes its SandboxSnapshot and its image; with moat node down a
// snapshot fails with a clear error and leaves the sandbox running.
func TestKubernetesSnapshot(t *testing.T) {
	k := startKubeStack(t)
	k.enableSnapshots(t)
	srv := newServer(t)
	srv.start(k.serverArgs()...)
	ctx := context.Background()
	c, err := client.New(k.node.Config, client.Options{Scheme: kclient.Scheme()})
	if err != nil {
		t.Fatal(err)
	}

	var src sandboxResp
	srv.mustJSON(202, "POST", "/v1/sandboxes", map[string]any{
		"image": map[string]any{"uri": k.ref}, "entrypoint": []string{"tail", "-f", "/dev/null"}, "timeout": 600,
	}, &src)
	t.Cleanup(func() { srv.do("DELETE", "/v1/sandboxes/"+src.ID, nil) })
	base, hdr := srv.agent(src.ID)
	assertCompleted(t, runCommand(t, base, hdr, "mkdir -p /work && echo snapped > /work/state.txt && rm /linuxrc; echo ok"))

	var sn snapshotResp
	srv.mustJSON(202, "POST", "/v1/sandboxes/"+src.ID+"/snapshots", map[string]any{"name": "k8s"}, &sn)
	srv.mustJSON(200, "GET", "/v1/snapshots/"+sn.ID, nil, &sn)
	if sn.Status.State != "Ready" || sn.SandboxID != src.ID {
		t.Fatalf("snapshot %+v", sn)
	}
	var cr sbv1.SandboxSnapshot
	if err := c.Get(ctx, client.ObjectKey{Namespace: k.ns, Name: sn.ID}, &cr); err != nil {
		t.Fatal(err)
	}
	if cr.Status.Phase != sbv1.SnapshotSucceed || len(cr.Status.Containers) != 1 || cr.Status.Containers[0].ImageDigest == "" {
		t.Fatalf("SandboxSnapshot status %+v", cr.Status)
	}
	image := cr.Status.Containers[0].ImageURI
	reg := snapreg.Registry{Host: k.node.Registry.Host}
	if ok, err := reg.Exists(ctx, image); !ok || err != nil {
		t.Fatalf("image %s in the registry: %v %v", image, ok, err)
	}
	// The source was thawed and runs on.
	var got sandboxResp
	srv.mustJSON(200, "GET", "/v1/sandboxes/"+src.ID, nil, &got)
	if got.Status.State != "Running" {
		t.Fatalf("source after the snapshot: %s", got.Status.State)
	}
	if out := stdoutOf(runCommand(t, base, hdr, "echo later > /work/later; cat /work/state.txt")); out != "snapped" {
		t.Fatalf("source after the snapshot: %q", out)
	}

	// A create and a batch from the snapshot see its files.
	var one sandboxResp
	srv.mustJSON(202, "POST", "/v1/sandboxes", map[string]any{"snapshotId": sn.ID, "timeout": 600}, &one)
	var batch struct{ Items []sandboxResp }
	srv.mustJSON(202, "POST", "/v1/sandboxes/batch", map[string]any{"snapshotId": sn.ID, "count": 2, "timeout": 600}, &batch)
	if len(batch.Items) != 2 {
		t.Fatalf("batch returned %d sandboxes", len(batch.Items))
	}
	for _, f := range append(batch.Items, one) {
		if f.Status.State != "Running" {
			t.Fatalf("sandbox from the snapshot: %+v", f)
		}
		b, h := srv.agent(f.ID)
		evs := runCommand(t, b, h, "cat /work/state.txt; test -e /linuxrc && echo linuxrc; test -e /work/later && echo later; echo end")
		assertCompleted(t, evs)
		if out := stdoutOf(evs); out != "snapped\nend" {
			t.Fatalf("sandbox %s from the snapshot sees %q", f.ID, out)
		}
	}
	code, body, _ := srv.do("DELETE", "/v1/snapshots/"+sn.ID, nil)
	if code != 409 || !strings.Contains(string(body), "SNAPSHOT::IN_USE") {
		t.Fatalf("delete in use: %d %s", code, body)
	}
	for _, f := range append(batch.Items, one) {
		srv.mustJSON(204, "DELETE", "/v1/sandboxes/"+f.ID, nil, nil)
	}

	// Deleting the snapshot deletes its SandboxSnapshot and its image.
	srv.mustJSON(204, "DELETE", "/v1/snapshots/"+sn.ID, nil, nil)
	if err := c.Get(ctx, client.ObjectKey{Namespace: k.ns, Name: sn.ID}, &cr); client.IgnoreNotFound(err) != nil || err == nil {
		t.Fatalf("SandboxSnapshot after the delete: %v", err)
	}
	if ok, err := reg.Exists(ctx, image); ok || err != nil {
		t.Fatalf("image %s after the delete: %v %v", image, ok, err)
	}
	if code, _, _ := srv.do("GET", "/v1/snapshots/"+sn.ID, nil); code != 404 {
		t.Fatalf("get deleted snapshot: %d", code)
	}

	// moat node is down: after the controller's commit timeout a clear
	// error; the sandbox runs on, no SandboxSnapshot or image is left.
	k.nodeAgent.stop()
	start := time.Now()
	code, body, _ = srv.do("POST", "/v1/sandboxes/"+src.ID+"/snapshots", map[string]any{"name": "no-node"})
	srv.expect5xx(code, "POST /v1/sandboxes/{id}/snapshots")
	if code < 500 || !strings.Contains(string(body), "SNAPSHOT::CAPTURE_FAILED") || !strings.Contains(string(body), "moat node") {
		t.Fatalf("snapshot with moat node down: %d %s", code, body)
	}
	t.Logf("snapshot without moat node failed after %v: %s", time.Since(start), body)
	srv.mustJSON(200, "GET", "/v1/sandboxes/"+src.ID, nil, &got)
	if got.Status.State != "Running" {
		t.Fatalf("source after a failed snapshot: %s", got.Status.State)
	}
	if out := stdoutOf(runCommand(t, base, hdr, "echo still-running")); out != "still-running" {
		t.Fatalf("source after a failed snapshot: %q", out)
	}
	var left sbv1.SandboxSnapshotList
	if err := c.List(ctx, &left, client.InNamespace(k.ns)); err != nil || len(left.Items) != 0 {
		t.Fatalf("SandboxSnapshots left: %d %v", len(left.Items), err)
	}
	var failed struct{ Items []snapshotResp }
	srv.mustJSON(200, "GET", "/v1/snapshots?sandboxId="+src.ID+"&state=Failed", nil, &failed)
	if len(failed.Items) != 1 || failed.Items[0].Name != "no-node" {
		t.Fatalf("failed snapshots %+v", failed)
	}
}

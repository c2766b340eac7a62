package docker

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/moby/moby/client"

	"github.com/moat-sandbox/moat/internal/runtime"
	"github.com/moat-sandbox/moat/internal/runtime/runtimetest"
)

// TestHostVolumes checks that host volumes become non-recursive binds
// with readOnly honoured.
func TestHostVolumes(t *testing.T) {
	e := newEnv(t, "")
	r := e.open(t)
	ctx := context.Background()
	dir := t.TempDir()
	rw, ro := filepath.Join(dir, "rw"), filepath.Join(dir, "ro")
	os.Mkdir(rw, 0o755)
	os.Mkdir(ro, 0o755)
	id := runtimetest.NewID("vol")
	if _, err := r.Create(ctx, runtime.Spec{ID: id, Image: e.image, AgentToken: runtimetest.Token, Mounts: []runtime.Mount{
		{Source: rw, Destination: "/work/rw"}, {Source: ro, Destination: "/work/ro", ReadOnly: true},
	}}); err != nil {
		t.Fatal(err)
	}
	runtimetest.WaitAgent(t, ctx, r, id, 10*time.Second)
	res, err := r.cli.ContainerInspect(ctx, containerName(id), client.ContainerInspectOptions{})
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]bool{} // destination -> RW
	for _, m := range res.Container.Mounts {
		got[m.Destination] = m.RW
	}
	if rwOK, ok := got["/work/rw"]; !ok || !rwOK {
		t.Errorf("rw volume: %+v", res.Container.Mounts)
	}
	if roRW, ok := got["/work/ro"]; !ok || roRW {
		t.Errorf("ro volume: %+v", res.Container.Mounts)
	}
	for _, m := range res.Container.HostConfig.Mounts {
		if m.Target == "/work/ro" && (m.BindOptions == nil || !m.BindOptions.NonRecursive) {
			t.Errorf("volume bind is recursive: %+v", m)
		}
	}
	if err := r.Delete(ctx, id); err != nil {
		t.Fatal(err)
	}
	assertNoLeaks(t, r, id)
}

package oci

import (
	"context"
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/moat-sandbox/moat/internal/errdefs"
	"github.com/moat-sandbox/moat/internal/runtime"
	"github.com/moat-sandbox/moat/internal/runtime/runtimetest"
	"github.com/moat-sandbox/moat/internal/volume"
)

// TestNamedVolumeQuotaAndRecovery: a named volume's quota holds inside the
// sandbox (ENOSPC at the size), a restarted backend (no Close: the server
// was killed) keeps the volume mounted for its running user, a failed
// create releases what it acquired, and once every user is gone no mount
// or loop device of the volume is left.
func TestNamedVolumeQuotaAndRecovery(t *testing.T) {
	e := newEnv(t, "runc", map[string]string{"runc": "runc", "broken": "false"})
	r := e.open(t)
	ctx := context.Background()
	volRoot := filepath.Join(e.cfg.Root, "volumes")
	if _, err := r.CreateVolume(ctx, runtime.VolumeSpec{Name: "quota", SizeBytes: 24 << 20}); err != nil {
		t.Fatal(err)
	}
	// A create that fails after acquiring the volume releases it.
	bad := runtimetest.NewID("volrb")
	_, err := r.Create(ctx, runtime.Spec{ID: bad, Image: testImage, Class: "broken", Mounts: []runtime.Mount{{Volume: "quota", Destination: "/data"}}})
	if !errors.Is(err, errdefs.ErrInternal) {
		t.Fatalf("Create with a failing runtime = %v", err)
	}
	assertNoLeaks(t, r, bad)
	if v, _ := r.GetVolume(ctx, "quota"); len(v.Users) != 0 || len(volume.LoopsReleased(volRoot, 10*time.Second)) != 0 {
		t.Fatalf("after a failed create: users %v, loops %v", v.Users, volume.LoopsBacking(volRoot))
	}

	id := runtimetest.NewID("volq")
	if _, err := r.Create(ctx, runtime.Spec{ID: id, Image: testImage, AgentToken: runtimetest.Token,
		Mounts: []runtime.Mount{{Volume: "quota", Destination: "/data"}}}); err != nil {
		t.Fatal(err)
	}
	runtimetest.WaitAgent(t, ctx, r, id, 20*time.Second)
	res := agentRun(t, ctx, r, id, "dd if=/dev/zero of=/data/fill bs=1M count=64 2>&1 | grep -c 'No space'; ls -l /data/fill | awk '{print $5}'", 30*time.Second)
	lines := strings.Fields(res.Out)
	if len(lines) != 2 || lines[0] != "1" || !sizeUnder(lines[1], 24<<20) {
		t.Fatalf("filling a 24 MiB volume: %q (%s)", res.Out, res.Err)
	}
	if l := volume.LoopsBacking(volRoot); len(l) != 1 {
		t.Fatalf("loop devices of a volume in use: %v", l)
	}

	// The server is killed and restarted: the sandbox keeps its volume.
	r2 := e.open(t)
	if v, err := r2.GetVolume(ctx, "quota"); err != nil || len(v.Users) != 1 || v.Users[0] != id {
		t.Fatalf("after restart: %+v %v", v, err)
	}
	if res := agentRun(t, ctx, r2, id, "rm /data/fill && echo after > /data/x && cat /data/x", 10*time.Second); strings.TrimSpace(res.Out) != "after" {
		t.Fatalf("volume after restart: %q %s", res.Out, res.Err)
	}
	if err := r2.DeleteVolume(ctx, "quota"); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Fatalf("delete in use: %v", err)
	}
	if err := r2.Delete(ctx, id); err != nil {
		t.Fatal(err)
	}
	if l := volume.LoopsReleased(volRoot, 10*time.Second); len(l) != 0 {
		t.Fatalf("loop devices left after the last user: %v", l)
	}
	if left := mountsUnder(volRoot); len(left) != 0 {
		t.Fatalf("mounts left: %v", left)
	}
	if err := r2.DeleteVolume(ctx, "quota"); err != nil {
		t.Fatal(err)
	}
}

func sizeUnder(s string, max int64) bool {
	var n int64
	for _, c := range s {
		if c < '0' || c > '9' {
			return false
		}
		n = n*10 + int64(c-'0')
	}
	return n > 0 && n < max
}

package mounts

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/moat-sandbox/moat/internal/errdefs"
	"github.com/moat-sandbox/moat/internal/lifecycle"
	"github.com/moat-sandbox/moat/internal/runtime"
	"github.com/moat-sandbox/moat/internal/runtime/fake"
)

// pvcReq is a create request mounting claim at /data (more volumes may
// follow in vols).
func pvcReq(vols ...lifecycle.Volume) lifecycle.CreateRequest {
	r := req(time.Hour)
	r.Volumes, r.HasVolumes = vols, true
	return r
}

func pvc(name, claim string, p lifecycle.PVCVolume) lifecycle.Volume {
	p.ClaimName = claim
	return lifecycle.Volume{Name: name, MountPath: "/" + name, PVC: &p}
}

func wantCode(t *testing.T, err error, code string, class error) {
	t.Helper()
	p, ok := errdefs.PublicOf(err)
	if !ok || p.Code != code || !errors.Is(err, class) {
		t.Fatalf("got %v, want %s (%v)", err, code, class)
	}
}

func no() *bool { b := false; return &b }

// TestPVCCreateShareDelete: a claim is created on first use, shared by a
// second sandbox, listed with its users, refused deletion while in use,
// and deleted once free.
func TestPVCCreateShareDelete(t *testing.T) {
	h := newHarness(t)
	ctx := context.Background()
	var specs []runtime.Spec
	h.hooks.Create = func(s runtime.Spec) error { specs = append(specs, s); return nil }
	a, err := h.svc.Create(ctx, pvcReq(pvc("data", "shared", lifecycle.PVCVolume{Storage: "64Mi"})))
	if err != nil {
		t.Fatal(err)
	}
	v, err := h.rt.GetVolume(ctx, "shared")
	if err != nil || v.SizeBytes != 64<<20 || v.Labels["moat.dev/created-by-sandbox"] != a.ID {
		t.Fatalf("volume after create: %+v %v", v, err)
	}
	wantMount := runtime.Mount{Volume: "shared", Destination: "/data"}
	if !slices.Equal(specs[0].Mounts, []runtime.Mount{wantMount}) || len(a.Claims) != 1 || a.Claims[0].Name != "shared" {
		t.Fatalf("runtime mounts %+v, claims %+v", specs[0].Mounts, a.Claims)
	}
	// The second sandbox asks for another size and read-only: the claim
	// exists, so it is mounted as is.
	b, err := h.svc.Create(ctx, pvcReq(lifecycle.Volume{Name: "ro", MountPath: "/ro", ReadOnly: true, SubPath: "sub", PVC: &lifecycle.PVCVolume{ClaimName: "shared", Storage: "1Gi", CreateIfNotExists: no()}}))
	if err != nil {
		t.Fatal(err)
	}
	if m := specs[1].Mounts; len(m) != 1 || m[0] != (runtime.Mount{Volume: "shared", SubPath: "sub", Destination: "/ro", ReadOnly: true}) {
		t.Fatalf("second sandbox mounts %+v", m)
	}
	if v, _ := h.rt.GetVolume(ctx, "shared"); v.SizeBytes != 64<<20 {
		t.Fatalf("an existing claim was resized: %+v", v)
	}
	info, err := h.svc.GetVolume(ctx, "shared")
	want := []string{a.ID, b.ID}
	slices.Sort(want)
	if err != nil || !slices.Equal(info.Sandboxes, want) {
		t.Fatalf("get volume: %+v %v, want users %v", info, err, want)
	}
	list, err := h.svc.ListVolumes(ctx)
	if err != nil || len(list) != 1 || list[0].Name != "shared" {
		t.Fatalf("list: %+v %v", list, err)
	}
	wantCode(t, h.svc.DeleteVolume(ctx, "shared"), codeVolumeInUse, errdefs.ErrConflict)
	h.svc.Delete(ctx, a.ID)
	wantCode(t, h.svc.DeleteVolume(ctx, "shared"), codeVolumeInUse, errdefs.ErrConflict)
	h.svc.Delete(ctx, b.ID)
	if err := h.svc.DeleteVolume(ctx, "shared"); err != nil {
		t.Fatal(err)
	}
	_, err = h.svc.GetVolume(ctx, "shared")
	wantCode(t, err, codeVolumeNotFound, errdefs.ErrNotFound)
	wantCode(t, h.svc.DeleteVolume(ctx, "shared"), codeVolumeNotFound, errdefs.ErrNotFound)
	wantCode(t, h.svc.DeleteVolume(ctx, "../etc"), codeVolumeNotFound, errdefs.ErrNotFound)
}

// TestPVCNotFound: a missing claim with createIfNotExists false is a
// 404-class VOLUME::PVC_NOT_FOUND, checked before any other claim of the
// request is created, and no sandbox reaches the runtime.
func TestPVCNotFound(t *testing.T) {
	h := newHarness(t)
	ctx := context.Background()
	created := 0
	h.hooks.Create = func(runtime.Spec) error { created++; return nil }
	_, err := h.svc.Create(ctx, pvcReq(pvc("a", "fresh", lifecycle.PVCVolume{}), pvc("b", "absent", lifecycle.PVCVolume{CreateIfNotExists: no()})))
	wantCode(t, err, codePVCNotFound, errdefs.ErrNotFound)
	if vols, _ := h.rt.ListVolumes(ctx); len(vols) != 0 || created != 0 {
		t.Fatalf("a refused create left volumes %+v / reached the runtime %d times", vols, created)
	}
	if list, _ := h.svc.List(ctx, lifecycle.ListFilter{States: []lifecycle.State{lifecycle.StateRunning, lifecycle.StatePending}}, 1, 10); len(list) != 0 {
		t.Fatalf("a refused create left sandboxes %+v", list)
	}
}

// TestPVCDeleteOnTermination: a claim marked deleteOnSandboxTermination
// goes with the sandbox whose create made it, unless another sandbox
// still uses it; a claim that existed before the create is never deleted.
func TestPVCDeleteOnTermination(t *testing.T) {
	h := newHarness(t)
	ctx := context.Background()
	gone := func(name string, want bool) {
		t.Helper()
		if _, err := h.rt.GetVolume(ctx, name); errdefs.IsNotFound(err) != want {
			t.Fatalf("volume %s: %v, want gone=%v", name, err, want)
		}
	}
	a, err := h.svc.Create(ctx, pvcReq(pvc("d", "scratch", lifecycle.PVCVolume{DeleteOnSandboxTermination: true})))
	if err != nil {
		t.Fatal(err)
	}
	if len(a.Claims) != 1 || !a.Claims[0].Created {
		t.Fatalf("claims of the creating sandbox: %+v", a.Claims)
	}
	b, err := h.svc.Create(ctx, pvcReq(pvc("d", "scratch", lifecycle.PVCVolume{})))
	if err != nil {
		t.Fatal(err)
	}
	h.svc.Delete(ctx, a.ID)
	gone("scratch", false) // still used by b
	h.svc.Delete(ctx, b.ID)
	gone("scratch", false) // b did not ask
	c, err := h.svc.Create(ctx, pvcReq(pvc("d", "scratch", lifecycle.PVCVolume{DeleteOnSandboxTermination: true}), pvc("e", "fresh", lifecycle.PVCVolume{DeleteOnSandboxTermination: true}),
		pvc("f", "keep", lifecycle.PVCVolume{})))
	if err != nil {
		t.Fatal(err)
	}
	h.svc.Delete(ctx, c.ID)
	gone("scratch", false) // existed before c
	gone("fresh", true)
	gone("keep", false)
}

// TestPVCFailedCreate: a create that fails after making its claims
// removes the volumes it made and leaves pre-existing ones alone.
func TestPVCFailedCreate(t *testing.T) {
	h := newHarness(t)
	ctx := context.Background()
	if _, err := h.rt.CreateVolume(ctx, runtime.VolumeSpec{Name: "old"}); err != nil {
		t.Fatal(err)
	}
	h.hooks.Create = func(runtime.Spec) error { return errors.New("boom") }
	if _, err := h.svc.Create(ctx, pvcReq(pvc("a", "old", lifecycle.PVCVolume{}), pvc("b", "new", lifecycle.PVCVolume{}))); err == nil {
		t.Fatal("create succeeded")
	}
	vols, _ := h.rt.ListVolumes(ctx)
	if len(vols) != 1 || vols[0].Name != "old" {
		t.Fatalf("volumes after a failed create: %+v", vols)
	}
}

// TestPVCRecover: after a restart the users of a volume come from the
// sandbox records, so deleting it is still refused.
func TestPVCRecover(t *testing.T) {
	h := newHarness(t)
	ctx := context.Background()
	sb, err := h.svc.Create(ctx, pvcReq(pvc("d", "kept", lifecycle.PVCVolume{})))
	if err != nil {
		t.Fatal(err)
	}
	h.rt = h.rt.Reopen(fake.Hooks{})
	svc := h.serviceWith(t, h.rt, nil)
	if err := svc.Recover(ctx); err != nil {
		t.Fatal(err)
	}
	wantCode(t, svc.DeleteVolume(ctx, "kept"), codeVolumeInUse, errdefs.ErrConflict)
	if err := svc.Delete(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	if err := svc.DeleteVolume(ctx, "kept"); err != nil {
		t.Fatal(err)
	}
}

// noVolumes hides the fake's runtime.Volumes.
type noVolumes struct{ runtime.Runtime }

// TestPVCUnsupportedRuntime: a runtime without named volumes refuses pvc
// volumes and the volume API with 501.
func TestPVCUnsupportedRuntime(t *testing.T) {
	h := newHarness(t)
	svc := h.serviceWith(t, noVolumes{h.rt}, nil)
	ctx := context.Background()
	_, err := svc.Create(ctx, pvcReq(pvc("d", "x", lifecycle.PVCVolume{})))
	wantCode(t, err, codeUnsupportedBackend, errdefs.ErrNotImplemented)
	_, err = svc.ListVolumes(ctx)
	wantCode(t, err, codeUnsupportedBackend, errdefs.ErrNotImplemented)
}

// TestPVCPool: a pool template with a pvc volume: every warm sandbox
// mounts the claim (created once, shared), the claim is in use while the
// pool holds sandboxes, a claimed sandbox keeps it, and deleting the pool
// and the claimed sandbox frees it.
func TestPVCPool(t *testing.T) {
	h := newHarness(t)
	ctx := context.Background()
	var mounts [][]runtime.Mount
	var mu sync.Mutex
	h.hooks.Create = func(s runtime.Spec) error { mu.Lock(); mounts = append(mounts, s.Mounts); mu.Unlock(); return nil }
	p := testPool("vp", 2, 2, 4)
	p.Template.Volumes = []lifecycle.Volume{pvc("data", "pooled", lifecycle.PVCVolume{Storage: "64Mi"})}
	if _, err := h.svc.CreatePool(ctx, p); err != nil {
		t.Fatal(err)
	}
	waitIdle(t, h.svc, "vp", 2)
	mu.Lock()
	for _, m := range mounts {
		if len(m) != 1 || m[0].Volume != "pooled" || m[0].Destination != "/data" {
			t.Fatalf("warm sandbox mounts %+v", m)
		}
	}
	mu.Unlock()
	if v, err := h.rt.GetVolume(ctx, "pooled"); err != nil || v.SizeBytes != 64<<20 {
		t.Fatalf("pool claim %+v %v", v, err)
	}
	wantCode(t, h.svc.DeleteVolume(ctx, "pooled"), codeVolumeInUse, errdefs.ErrConflict)
	sb, err := h.svc.Create(ctx, lifecycle.CreateRequest{Timeout: time.Hour, Extensions: map[string]string{lifecycle.ExtPoolRef: "vp"}})
	if err != nil {
		t.Fatal(err)
	}
	if len(sb.Claims) != 1 || sb.Claims[0].Name != "pooled" {
		t.Fatalf("claimed sandbox claims %+v", sb.Claims)
	}
	if err := h.svc.DeletePool(ctx, "vp"); err != nil {
		t.Fatal(err)
	}
	wantCode(t, h.svc.DeleteVolume(ctx, "pooled"), codeVolumeInUse, errdefs.ErrConflict)
	h.svc.Delete(ctx, sb.ID)
	if err := h.svc.DeleteVolume(ctx, "pooled"); err != nil {
		t.Fatal(err)
	}
	// A bad volume in a template is refused when the pool is defined.
	bad := testPool("vb", 1, 1, 1)
	bad.Template.Volumes = []lifecycle.Volume{pvc("data", "Bad", lifecycle.PVCVolume{})}
	_, err = h.svc.CreatePool(ctx, bad)
	wantCode(t, err, codeInvalidPVCName, errdefs.ErrInvalidArgument)
}

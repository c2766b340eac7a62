package runtimetest

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/moat-sandbox/moat/internal/errdefs"
	"github.com/moat-sandbox/moat/internal/runtime"
)

// volumes checks runtime.Volumes: a named volume is created, listed and
// deleted; two sandboxes mounting it see each other's writes; a read-only
// mount refuses writes; a subPath mounts a directory of the volume (made
// if missing) and can never lead out of it through a symlink; a sandbox
// mounting a missing volume, or an escaping subPath, fails and leaves
// nothing behind; and a volume in use cannot be deleted.
func (s *suite) volumes(t *testing.T) {
	rt := s.newRuntime(t)
	vr, ok := rt.(runtime.Volumes)
	if !ok {
		t.Skipf("%s does not implement runtime.Volumes", rt.Name())
	}
	v := &volumeCheck{s: s, t: t, ctx: s.ctxFor(t), rt: rt, vr: vr, name: NewID("vol")}
	t.Cleanup(func() { vr.DeleteVolume(context.Background(), v.name) })
	v.create()
	a, b := v.share()
	v.inUse(a, b)
	// The data outlives the sandboxes.
	if s.opts.NoCommands {
		if err := vr.DeleteVolume(v.ctx, v.name); err != nil {
			t.Fatalf("DeleteVolume: %v", err)
		}
		return
	}
	v.outlive()
}

// volumeCheck is the state of one run of the volumes test: the runtime
// and the volume under test.
type volumeCheck struct {
	s    *suite
	t    *testing.T
	ctx  context.Context
	rt   runtime.Runtime
	vr   runtime.Volumes
	name string
}

func (v *volumeCheck) mountSpec(id string, mounts ...runtime.Mount) runtime.Spec {
	sp := v.s.spec(id)
	sp.Mounts = mounts
	return sp
}

// mustFail checks that creating sp fails and leaves no sandbox behind.
func (v *volumeCheck) mustFail(what string, sp runtime.Spec) {
	v.t.Helper()
	if _, err := v.rt.Create(v.ctx, sp); err == nil {
		v.rt.Delete(context.Background(), sp.ID)
		v.t.Fatalf("Create with %s succeeded", what)
	}
	if _, err := v.rt.Status(v.ctx, sp.ID); !errdefs.IsNotFound(err) {
		v.t.Errorf("Create with %s left sandbox %s behind: %v", what, sp.ID, err)
	}
}

// run runs cmd in sandbox id and returns its output; it must succeed.
func (v *volumeCheck) run(id, cmd string) string {
	v.t.Helper()
	out, code, err := Exec(v.ctx, v.rt, id, cmd)
	if err != nil || code != 0 {
		v.t.Fatalf("%s: %q: exit %d, %v: %s", id, cmd, code, err, out)
	}
	return out
}

// create checks the errors of a missing volume, then creates and lists it.
func (v *volumeCheck) create() {
	t, ctx, name := v.t, v.ctx, v.name
	if _, err := v.vr.GetVolume(ctx, name); !errdefs.IsNotFound(err) {
		t.Fatalf("GetVolume of a missing volume: %v, want ErrNotFound", err)
	}
	if err := v.vr.DeleteVolume(ctx, name); !errdefs.IsNotFound(err) {
		t.Fatalf("DeleteVolume of a missing volume: %v, want ErrNotFound", err)
	}
	v.mustFail("a missing volume", v.mountSpec(NewID("vol-missing"), runtime.Mount{Volume: name, Destination: "/data"}))

	vol, err := v.vr.CreateVolume(ctx, runtime.VolumeSpec{Name: name, SizeBytes: 64 << 20, Labels: map[string]string{"suite": "runtimetest"}})
	if err != nil {
		t.Fatalf("CreateVolume: %v", err)
	}
	if vol.Name != name || !vol.Managed || vol.Labels["suite"] != "runtimetest" {
		t.Errorf("CreateVolume returned %+v", vol)
	}
	if _, err := v.vr.CreateVolume(ctx, runtime.VolumeSpec{Name: name}); !errdefs.IsAlreadyExists(err) {
		t.Errorf("second CreateVolume: %v, want ErrAlreadyExists", err)
	}
	list, err := v.vr.ListVolumes(ctx)
	if err != nil || !slices.ContainsFunc(list, func(x runtime.Volume) bool { return x.Name == name }) {
		t.Fatalf("ListVolumes = %+v, %v; want %s in it", list, err, name)
	}
}

// share starts two sandboxes on the volume, a read-write and b with a
// read-only root mount, and checks what each sees of the other's writes
// and that no subPath leads out through a symlink.
func (v *volumeCheck) share() (a, b string) {
	t, name := v.t, v.name
	a, b = NewID("vol-a"), NewID("vol-b")
	for _, sp := range []runtime.Spec{
		v.mountSpec(a, runtime.Mount{Volume: name, Destination: "/data"}, runtime.Mount{Volume: name, SubPath: "sub/dir", Destination: "/sub"}),
		v.mountSpec(b, runtime.Mount{Volume: name, Destination: "/data", ReadOnly: true}, runtime.Mount{Volume: name, SubPath: "sub", Destination: "/sub"}),
	} {
		if _, err := v.rt.Create(v.ctx, sp); err != nil {
			t.Fatalf("Create(%s) with volumes: %v", sp.ID, err)
		}
		t.Cleanup(func() { v.rt.Delete(context.Background(), sp.ID) })
		WaitAgent(t, v.ctx, v.rt, sp.ID, v.s.opts.AgentTimeout)
	}
	if v.s.opts.NoCommands {
		return a, b
	}
	v.run(a, "echo hello > /data/f && echo nested > /sub/g && ln -s / /data/abs && ln -s ../../../.. /data/sub/up")
	if out := v.run(b, "cat /data/f /sub/dir/g; touch /data/x 2>/dev/null && echo WRITABLE; true"); out != "hello\nnested\n" {
		t.Errorf("the second sandbox reads %q, want the first's writes and a read-only /data", out)
	}
	if out := v.run(b, "echo from-b > /sub/h && echo ok"); out != "ok\n" {
		t.Errorf("write through a read-write subPath mount: %q", out)
	}
	if out := v.run(a, "cat /data/sub/h"); out != "from-b\n" {
		t.Errorf("the first sandbox reads %q, want the second's write", out)
	}
	for _, sub := range []string{"abs", "abs/etc", "sub/up", "sub/up/etc"} {
		v.mustFail("subPath "+sub+" (a symlink out of the volume)", v.mountSpec(NewID("vol-esc"), runtime.Mount{Volume: name, SubPath: sub, Destination: "/esc"}))
	}
	return a, b
}

// inUse checks that the volume in use by a and b cannot be deleted, then
// deletes the sandboxes.
func (v *volumeCheck) inUse(a, b string) {
	t := v.t
	if vol, err := v.vr.GetVolume(v.ctx, v.name); err != nil || (vol.Users != nil && !slices.Contains(vol.Users, a)) {
		t.Errorf("GetVolume in use: %+v, %v; want %s among the users", vol, err, a)
	}
	if err := v.vr.DeleteVolume(v.ctx, v.name); !errors.Is(err, errdefs.ErrFailedPrecondition) && !errdefs.IsConflict(err) {
		t.Errorf("DeleteVolume in use: %v, want ErrFailedPrecondition or ErrConflict", err)
	}
	for _, id := range []string{a, b} {
		if err := v.rt.Delete(v.ctx, id); err != nil {
			t.Fatal(err)
		}
	}
}

// outlive checks that a later sandbox reads the data, then deletes the
// volume.
func (v *volumeCheck) outlive() {
	t, ctx := v.t, v.ctx
	c := NewID("vol-c")
	if _, err := v.rt.Create(ctx, v.mountSpec(c, runtime.Mount{Volume: v.name, Destination: "/data", ReadOnly: true})); err != nil {
		t.Fatal(err)
	}
	WaitAgent(t, ctx, v.rt, c, v.s.opts.AgentTimeout)
	if out := v.run(c, "cat /data/f"); strings.TrimSpace(out) != "hello" {
		t.Errorf("a later sandbox reads %q", out)
	}
	if err := v.rt.Delete(ctx, c); err != nil {
		t.Fatal(err)
	}
	if err := v.vr.DeleteVolume(ctx, v.name); err != nil {
		t.Fatalf("DeleteVolume: %v", err)
	}
	if _, err := v.vr.GetVolume(ctx, v.name); !errdefs.IsNotFound(err) {
		t.Errorf("GetVolume after DeleteVolume: %v, want ErrNotFound", err)
	}
}

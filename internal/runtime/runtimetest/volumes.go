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
	ctx := s.ctxFor(t)
	name := NewID("vol")
	t.Cleanup(func() { vr.DeleteVolume(context.Background(), name) })
	if _, err := vr.GetVolume(ctx, name); !errdefs.IsNotFound(err) {
		t.Fatalf("GetVolume of a missing volume: %v, want ErrNotFound", err)
	}
	if err := vr.DeleteVolume(ctx, name); !errdefs.IsNotFound(err) {
		t.Fatalf("DeleteVolume of a missing volume: %v, want ErrNotFound", err)
	}
	mountSpec := func(id string, mounts ...runtime.Mount) runtime.Spec {
		sp := s.spec(id)
		sp.Mounts = mounts
		return sp
	}
	mustFail := func(what string, sp runtime.Spec) {
		t.Helper()
		if _, err := rt.Create(ctx, sp); err == nil {
			rt.Delete(context.Background(), sp.ID)
			t.Fatalf("Create with %s succeeded", what)
		}
		if _, err := rt.Status(ctx, sp.ID); !errdefs.IsNotFound(err) {
			t.Errorf("Create with %s left sandbox %s behind: %v", what, sp.ID, err)
		}
	}
	mustFail("a missing volume", mountSpec(NewID("vol-missing"), runtime.Mount{Volume: name, Destination: "/data"}))

	v, err := vr.CreateVolume(ctx, runtime.VolumeSpec{Name: name, SizeBytes: 64 << 20, Labels: map[string]string{"suite": "runtimetest"}})
	if err != nil {
		t.Fatalf("CreateVolume: %v", err)
	}
	if v.Name != name || !v.Managed || v.Labels["suite"] != "runtimetest" {
		t.Errorf("CreateVolume returned %+v", v)
	}
	if _, err := vr.CreateVolume(ctx, runtime.VolumeSpec{Name: name}); !errdefs.IsAlreadyExists(err) {
		t.Errorf("second CreateVolume: %v, want ErrAlreadyExists", err)
	}
	list, err := vr.ListVolumes(ctx)
	if err != nil || !slices.ContainsFunc(list, func(x runtime.Volume) bool { return x.Name == name }) {
		t.Fatalf("ListVolumes = %+v, %v; want %s in it", list, err, name)
	}

	a, b := NewID("vol-a"), NewID("vol-b")
	for _, sp := range []runtime.Spec{
		mountSpec(a, runtime.Mount{Volume: name, Destination: "/data"}, runtime.Mount{Volume: name, SubPath: "sub/dir", Destination: "/sub"}),
		mountSpec(b, runtime.Mount{Volume: name, Destination: "/data", ReadOnly: true}, runtime.Mount{Volume: name, SubPath: "sub", Destination: "/sub"}),
	} {
		if _, err := rt.Create(ctx, sp); err != nil {
			t.Fatalf("Create(%s) with volumes: %v", sp.ID, err)
		}
		t.Cleanup(func() { rt.Delete(context.Background(), sp.ID) })
		WaitAgent(t, ctx, rt, sp.ID, s.opts.AgentTimeout)
	}
	run := func(id, cmd string) string {
		t.Helper()
		out, code, err := Exec(ctx, rt, id, cmd)
		if err != nil || code != 0 {
			t.Fatalf("%s: %q: exit %d, %v: %s", id, cmd, code, err, out)
		}
		return out
	}
	if !s.opts.NoCommands {
		run(a, "echo hello > /data/f && echo nested > /sub/g && ln -s / /data/abs && ln -s ../../../.. /data/sub/up")
		if out := run(b, "cat /data/f /sub/dir/g; touch /data/x 2>/dev/null && echo WRITABLE; true"); out != "hello\nnested\n" {
			t.Errorf("the second sandbox reads %q, want the first's writes and a read-only /data", out)
		}
		if out := run(b, "echo from-b > /sub/h && echo ok"); out != "ok\n" {
			t.Errorf("write through a read-write subPath mount: %q", out)
		}
		if out := run(a, "cat /data/sub/h"); out != "from-b\n" {
			t.Errorf("the first sandbox reads %q, want the second's write", out)
		}
		for _, sub := range []string{"abs", "abs/etc", "sub/up", "sub/up/etc"} {
			mustFail("subPath "+sub+" (a symlink out of the volume)", mountSpec(NewID("vol-esc"), runtime.Mount{Volume: name, SubPath: sub, Destination: "/esc"}))
		}
	}
	if v, err := vr.GetVolume(ctx, name); err != nil || (v.Users != nil && !slices.Contains(v.Users, a)) {
		t.Errorf("GetVolume in use: %+v, %v; want %s among the users", v, err, a)
	}
	if err := vr.DeleteVolume(ctx, name); !errors.Is(err, errdefs.ErrFailedPrecondition) && !errdefs.IsConflict(err) {
		t.Errorf("DeleteVolume in use: %v, want ErrFailedPrecondition or ErrConflict", err)
	}
	for _, id := range []string{a, b} {
		if err := rt.Delete(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
	// The data outlives the sandboxes.
	if s.opts.NoCommands {
		if err := vr.DeleteVolume(ctx, name); err != nil {
			t.Fatalf("DeleteVolume: %v", err)
		}
		return
	}
	c := NewID("vol-c")
	if _, err := rt.Create(ctx, mountSpec(c, runtime.Mount{Volume: name, Destination: "/data", ReadOnly: true})); err != nil {
		t.Fatal(err)
	}
	WaitAgent(t, ctx, rt, c, s.opts.AgentTimeout)
	if out := run(c, "cat /data/f"); strings.TrimSpace(out) != "hello" {
		t.Errorf("a later sandbox reads %q", out)
	}
	if err := rt.Delete(ctx, c); err != nil {
		t.Fatal(err)
	}
	if err := vr.DeleteVolume(ctx, name); err != nil {
		t.Fatalf("DeleteVolume: %v", err)
	}
	if _, err := vr.GetVolume(ctx, name); !errdefs.IsNotFound(err) {
		t.Errorf("GetVolume after DeleteVolume: %v, want ErrNotFound", err)
	}
}

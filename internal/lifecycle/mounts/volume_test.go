package mounts

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/moat-sandbox/moat/internal/errdefs"
	"github.com/moat-sandbox/moat/internal/lifecycle"
	"github.com/moat-sandbox/moat/internal/runtime"
)

// volumeTree is a host layout for the allow-list tests:
//
//	<tmp>/allowed/data/        allowed (via --allow-host-path <tmp>/allowed)
//	<tmp>/allowed/escape  ->   <tmp>/secret (symlink out of the allowed dir)
//	<tmp>/allowed-evil/        shares the prefix string, not the directory
//	<tmp>/secret/
//	<tmp>/link-to-allowed -> <tmp>/allowed
func volumeTree(t *testing.T) string {
	t.Helper()
	root, err := filepath.EvalSymlinks(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range []string{"allowed/data", "allowed-evil", "secret"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink(filepath.Join(root, "secret"), filepath.Join(root, "allowed", "escape")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join(root, "allowed"), filepath.Join(root, "link-to-allowed")); err != nil {
		t.Fatal(err)
	}
	return root
}

func TestVolumeMounts(t *testing.T) {
	root := volumeTree(t)
	allowed := []string{filepath.Join(root, "allowed")}
	host := func(p string) *lifecycle.HostVolume { return &lifecycle.HostVolume{Path: p} }
	for _, tc := range []struct {
		name    string
		vols    []lifecycle.Volume
		allowed []string
		want    []runtime.Mount
		code    string
	}{
		{name: "allowed dir", vols: []lifecycle.Volume{{Name: "data", MountPath: "/data", Host: host(root + "/allowed/data")}},
			want: []runtime.Mount{{Source: root + "/allowed/data", Destination: "/data"}}},
		{name: "allowed root itself, read-only", vols: []lifecycle.Volume{{Name: "a", MountPath: "/mnt/a/", ReadOnly: true, Host: host(root + "/allowed")}},
			want: []runtime.Mount{{Source: root + "/allowed", Destination: "/mnt/a", ReadOnly: true}}},
		{name: "subPath", vols: []lifecycle.Volume{{Name: "a", MountPath: "/a", SubPath: "data", Host: host(root + "/allowed")}},
			want: []runtime.Mount{{Source: root + "/allowed/data", Destination: "/a"}}},
		{name: "through a symlink to the allowed dir", vols: []lifecycle.Volume{{Name: "a", MountPath: "/a", Host: host(root + "/link-to-allowed/data")}},
			want: []runtime.Mount{{Source: root + "/allowed/data", Destination: "/a"}}},
		{name: "allow-list entry behind a symlink", allowed: []string{root + "/link-to-allowed"},
			vols: []lifecycle.Volume{{Name: "a", MountPath: "/a", Host: host(root + "/allowed/data")}},
			want: []runtime.Mount{{Source: root + "/allowed/data", Destination: "/a"}}},
		{name: "empty allow-list", allowed: []string{}, vols: []lifecycle.Volume{{Name: "a", MountPath: "/a", Host: host(root + "/allowed")}},
			code: lifecycle.CodeHostPathNotAllowed},
		{name: "outside", vols: []lifecycle.Volume{{Name: "a", MountPath: "/a", Host: host(root + "/secret")}}, code: lifecycle.CodeHostPathNotAllowed},
		{name: "prefix string only", vols: []lifecycle.Volume{{Name: "a", MountPath: "/a", Host: host(root + "/allowed-evil")}}, code: lifecycle.CodeHostPathNotAllowed},
		{name: "dotdot", vols: []lifecycle.Volume{{Name: "a", MountPath: "/a", Host: host(root + "/allowed/../secret")}}, code: lifecycle.CodeHostPathNotAllowed},
		{name: "symlink out", vols: []lifecycle.Volume{{Name: "a", MountPath: "/a", Host: host(root + "/allowed/escape")}}, code: lifecycle.CodeHostPathNotAllowed},
		{name: "subPath through symlink out", vols: []lifecycle.Volume{{Name: "a", MountPath: "/a", SubPath: "escape", Host: host(root + "/allowed")}}, code: lifecycle.CodeHostPathNotAllowed},
		{name: "subPath dotdot", vols: []lifecycle.Volume{{Name: "a", MountPath: "/a", SubPath: "../secret", Host: host(root + "/allowed")}}, code: lifecycle.CodeInvalidSubPath},
		{name: "missing path", vols: []lifecycle.Volume{{Name: "a", MountPath: "/a", Host: host(root + "/allowed/nope")}}, code: lifecycle.CodeHostPathNotAllowed},
		{name: "relative path", vols: []lifecycle.Volume{{Name: "a", MountPath: "/a", Host: host("allowed")}}, code: lifecycle.CodeHostPathNotAllowed},
		{name: "relative mountPath", vols: []lifecycle.Volume{{Name: "a", MountPath: "a", Host: host(root + "/allowed")}}, code: codeInvalidMountPath},
		{name: "mount over /", vols: []lifecycle.Volume{{Name: "a", MountPath: "/", Host: host(root + "/allowed")}}, code: codeInvalidMountPath},
		{name: "mount over the agent", vols: []lifecycle.Volume{{Name: "a", MountPath: "/.moat/x/..", Host: host(root + "/allowed")}}, code: codeInvalidMountPath},
		{name: "mount over /proc/sys", vols: []lifecycle.Volume{{Name: "a", MountPath: "/proc/sys", Host: host(root + "/allowed")}}, code: codeInvalidMountPath},
		{name: "bad name", vols: []lifecycle.Volume{{Name: "Data_1", MountPath: "/a", Host: host(root + "/allowed")}}, code: codeInvalidName},
		{name: "duplicate name", vols: []lifecycle.Volume{
			{Name: "a", MountPath: "/a", Host: host(root + "/allowed")}, {Name: "a", MountPath: "/b", Host: host(root + "/allowed")}}, code: codeDuplicateName},
		{name: "duplicate mountPath", vols: []lifecycle.Volume{
			{Name: "a", MountPath: "/a", Host: host(root + "/allowed")}, {Name: "b", MountPath: "/a/", Host: host(root + "/allowed")}}, code: codeInvalidMountPath},
		{name: "no backend", vols: []lifecycle.Volume{{Name: "a", MountPath: "/a"}}, code: codeInvalidBackend},
		{name: "two backends", vols: []lifecycle.Volume{{Name: "a", MountPath: "/a", Host: host(root + "/allowed"), PVC: &lifecycle.PVCVolume{ClaimName: "x"}}}, code: codeInvalidBackend},
		{name: "ossfs", vols: []lifecycle.Volume{{Name: "a", MountPath: "/a", OSSFS: json.RawMessage(`{"bucket":"b","endpoint":"e"}`)}}, code: codeUnsupportedBackend},
		{name: "pvc", vols: []lifecycle.Volume{{Name: "a", MountPath: "/a", ReadOnly: true, SubPath: "x/./y/", PVC: &lifecycle.PVCVolume{ClaimName: "data-1"}}},
			want: []runtime.Mount{{Volume: "data-1", SubPath: "x/y", Destination: "/a", ReadOnly: true}}},
		{name: "pvc and host", vols: []lifecycle.Volume{{Name: "a", MountPath: "/a", PVC: &lifecycle.PVCVolume{ClaimName: "d"}}, {Name: "b", MountPath: "/b", Host: host(root + "/allowed")}},
			want: []runtime.Mount{{Volume: "d", Destination: "/a"}, {Source: root + "/allowed", Destination: "/b"}}},
		{name: "pvc bad claimName", vols: []lifecycle.Volume{{Name: "a", MountPath: "/a", PVC: &lifecycle.PVCVolume{ClaimName: "../x"}}}, code: codeInvalidPVCName},
		{name: "pvc claimName with capitals", vols: []lifecycle.Volume{{Name: "a", MountPath: "/a", PVC: &lifecycle.PVCVolume{ClaimName: "Data"}}}, code: codeInvalidPVCName},
		{name: "pvc empty claimName", vols: []lifecycle.Volume{{Name: "a", MountPath: "/a", PVC: &lifecycle.PVCVolume{}}}, code: codeInvalidPVCName},
		{name: "pvc subPath escape", vols: []lifecycle.Volume{{Name: "a", MountPath: "/a", SubPath: "x/../../y", PVC: &lifecycle.PVCVolume{ClaimName: "d"}}}, code: lifecycle.CodeInvalidSubPath},
		{name: "pvc absolute subPath", vols: []lifecycle.Volume{{Name: "a", MountPath: "/a", SubPath: "/etc", PVC: &lifecycle.PVCVolume{ClaimName: "d"}}}, code: lifecycle.CodeInvalidSubPath},
		{name: "pvc bad storage", vols: []lifecycle.Volume{{Name: "a", MountPath: "/a", PVC: &lifecycle.PVCVolume{ClaimName: "d", Storage: "lots"}}}, code: codeInvalidStorage},
		{name: "pvc storage too small", vols: []lifecycle.Volume{{Name: "a", MountPath: "/a", PVC: &lifecycle.PVCVolume{ClaimName: "d", Storage: "1Ki"}}}, code: codeInvalidStorage},
		{name: "pvc negative storage", vols: []lifecycle.Volume{{Name: "a", MountPath: "/a", PVC: &lifecycle.PVCVolume{ClaimName: "d", Storage: "-1Gi"}}}, code: codeInvalidStorage},
		{name: "pvc bad access mode", vols: []lifecycle.Volume{{Name: "a", MountPath: "/a", PVC: &lifecycle.PVCVolume{ClaimName: "d", AccessModes: []string{"All"}}}}, code: lifecycle.CodeInvalidVolume},
	} {
		t.Run(tc.name, func(t *testing.T) {
			al := allowed
			if tc.allowed != nil {
				al = tc.allowed
			}
			got, _, err := volumeMounts(tc.vols, al, filepath.EvalSymlinks)
			if tc.code != "" {
				p, ok := errdefs.PublicOf(err)
				if !ok || p.Code != tc.code {
					t.Fatalf("got %v (%v), want code %s", got, err, tc.code)
				}
				return
			}
			if err != nil || !slices.Equal(got, tc.want) {
				t.Fatalf("got %+v, %v; want %+v", got, err, tc.want)
			}
		})
	}
}

// TestCreateWithVolumes checks the service end of host volumes: the
// allow-list is enforced at create and the mounts reach the runtime.
func TestCreateWithVolumes(t *testing.T) {
	root := volumeTree(t)
	h := newHarness(t)
	ctx := context.Background()
	var got []runtime.Mount
	h.hooks.Create = func(s runtime.Spec) error { got = s.Mounts; return nil }
	raw := []json.RawMessage{json.RawMessage(`{"name":"data","mountPath":"/data","readOnly":true,"host":{"path":"` + root + `/allowed/data"}}`)}
	vols, err := lifecycle.ParseVolumes(raw)
	if err != nil {
		t.Fatal(err)
	}
	r := req(time.Hour)
	r.Volumes, r.HasVolumes = vols, true
	// The harness service has no allow-list: refused.
	_, err = h.svc.Create(ctx, r)
	if p, ok := errdefs.PublicOf(err); !ok || p.Code != lifecycle.CodeHostPathNotAllowed || !errdefs.IsInvalidArgument(err) {
		t.Fatalf("create without an allow-list: %v", err)
	}
	svc := h.serviceWith(t, h.rt, []string{root + "/allowed"})
	sb, err := svc.Create(ctx, r)
	if err != nil {
		t.Fatal(err)
	}
	want := []runtime.Mount{{Source: root + "/allowed/data", Destination: "/data", ReadOnly: true}}
	if !slices.Equal(got, want) || !slices.Equal(sb.Mounts, want) {
		t.Fatalf("runtime got mounts %+v, sandbox %+v; want %+v", got, sb.Mounts, want)
	}
	r.Extensions = map[string]string{lifecycle.ExtPoolRef: "p"}
	if _, err := svc.Create(ctx, r); !errdefs.IsInvalidArgument(err) {
		t.Fatalf("volumes on a pool claim: %v", err)
	}
	if _, err := lifecycle.ParseVolumes([]json.RawMessage{json.RawMessage(`{"name":1}`)}); !errdefs.IsInvalidArgument(err) {
		t.Fatalf("bad volume JSON: %v", err)
	}
}

package e2e

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestHostVolumesAndDiskQuota runs a server with one allowed host path
// and a default disk quota: host volumes outside the allow-list are
// refused, readOnly is honoured, the writable layer fills up at the quota
// (resourceLimits.disk overrides the default) and a snapshot of a
// sandbox with a quota restores its files.
func TestHostVolumesAndDiskQuota(t *testing.T) {
	srv := newServer(t)
	ref := startRegistry(t)
	host := t.TempDir()
	allowed, secret := filepath.Join(host, "allowed"), filepath.Join(host, "secret")
	for _, d := range []string{filepath.Join(allowed, "data"), secret} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	os.WriteFile(filepath.Join(allowed, "data", "in.txt"), []byte("host-data"), 0o644)
	os.Symlink(secret, filepath.Join(allowed, "escape"))
	srv.start("--allow-host-path", allowed, "--disk-quota", "64Mi")

	body := func(vols any, limits map[string]string) map[string]any {
		b := map[string]any{"image": map[string]any{"uri": ref}, "entrypoint": []string{"tail", "-f", "/dev/null"}, "timeout": 600}
		if vols != nil {
			b["volumes"] = vols
		}
		if limits != nil {
			b["resourceLimits"] = limits
		}
		return b
	}
	vol := func(name, path, mountPath string, ro bool) map[string]any {
		return map[string]any{"name": name, "mountPath": mountPath, "readOnly": ro, "host": map[string]any{"path": path}}
	}
	for _, tc := range []struct {
		name string
		vols []map[string]any
		code string
	}{
		{"outside the allow-list", []map[string]any{vol("s", secret, "/s", false)}, "VOLUME::HOST_PATH_NOT_ALLOWED"},
		{"symlink out of the allow-list", []map[string]any{vol("s", filepath.Join(allowed, "escape"), "/s", false)}, "VOLUME::HOST_PATH_NOT_ALLOWED"},
		{"dotdot", []map[string]any{vol("s", allowed+"/../secret", "/s", false)}, "VOLUME::HOST_PATH_NOT_ALLOWED"},
		{"reserved mountPath", []map[string]any{vol("s", allowed, "/proc/x", false)}, "VOLUME::INVALID_MOUNT_PATH"},
	} {
		code, b, _ := srv.do("POST", "/v1/sandboxes", body(tc.vols, nil))
		var e struct{ Code, Message string }
		json.Unmarshal(b, &e)
		if code != 400 || e.Code != tc.code {
			t.Errorf("%s: %d %s, want 400 %s", tc.name, code, b, tc.code)
		}
	}

	var sb sandboxResp
	srv.mustJSON(202, "POST", "/v1/sandboxes", body([]map[string]any{
		vol("ro", filepath.Join(allowed, "data"), "/mnt/ro", true),
		{"name": "rw", "mountPath": "/mnt/rw", "subPath": "data", "host": map[string]any{"path": allowed}},
	}, nil), &sb)
	t.Cleanup(func() { srv.do("DELETE", "/v1/sandboxes/"+sb.ID, nil) })
	out, _ := shell(t, srv, sb.ID, "cat /mnt/ro/in.txt; echo; echo x > /mnt/ro/new 2>/dev/null && echo RO-WRITABLE; "+
		"echo from-sandbox > /mnt/rw/out.txt && echo RW-OK")
	if !strings.Contains(out, "host-data") || strings.Contains(out, "RO-WRITABLE") || !strings.Contains(out, "RW-OK") {
		t.Errorf("volumes: %q", out)
	}
	if data, _ := os.ReadFile(filepath.Join(allowed, "data", "out.txt")); string(data) != "from-sandbox\n" {
		t.Errorf("host sees %q", data)
	}
	// The default quota: dd stops at ENOSPC below 64 MiB.
	fill := "dd if=/dev/zero of=/fill bs=1M count=200 2>&1 | grep -E 'No space|records out'; ls -l /fill | awk '{print \"SIZE\", $5}'"
	if out, _ := shell(t, srv, sb.ID, fill); !strings.Contains(out, "No space left") || !sizeBelow(out, 64<<20) {
		t.Errorf("default quota fill: %q", out)
	}
	if out, _ := shell(t, srv, sb.ID, "rm /fill && echo state > /state.txt && cat /state.txt"); out != "state" {
		t.Errorf("after freeing the disk: %q", out)
	}
	// A snapshot of the quota'd sandbox carries its files.
	var sn struct{ ID string }
	srv.mustJSON(202, "POST", "/v1/sandboxes/"+sb.ID+"/snapshots", map[string]any{"name": "quota"}, &sn)
	var fork sandboxResp
	srv.mustJSON(202, "POST", "/v1/sandboxes", map[string]any{"snapshotId": sn.ID, "timeout": 600}, &fork)
	t.Cleanup(func() {
		srv.do("DELETE", "/v1/sandboxes/"+fork.ID, nil)
		srv.do("DELETE", "/v1/snapshots/"+sn.ID, nil)
	})
	if out, _ := shell(t, srv, fork.ID, "cat /state.txt"); out != "state" {
		t.Errorf("restored sandbox sees %q", out)
	}

	// resourceLimits.disk overrides the default.
	var small sandboxResp
	srv.mustJSON(202, "POST", "/v1/sandboxes", body(nil, map[string]string{"disk": "32Mi"}), &small)
	t.Cleanup(func() { srv.do("DELETE", "/v1/sandboxes/"+small.ID, nil) })
	if out, _ := shell(t, srv, small.ID, fill); !strings.Contains(out, "No space left") || !sizeBelow(out, 32<<20) {
		t.Errorf("32Mi quota fill: %q", out)
	}
}

// sizeBelow reports whether the "SIZE n" line of out is below max.
func sizeBelow(out string, max int64) bool {
	i := strings.Index(out, "SIZE ")
	if i < 0 {
		return false
	}
	var n int64
	for _, c := range out[i+5:] {
		if c < '0' || c > '9' {
			break
		}
		n = n*10 + int64(c-'0')
	}
	return n > 0 && n < max
}

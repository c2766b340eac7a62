package e2e

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/moat-sandbox/moat/internal/volume"
)

// Named volumes (the pvc backend) through a real `moat serve`, on the
// native and Docker runtimes: the same request works on both.

type namedVolumeResp struct {
	Name          string   `json:"name"`
	CapacityBytes int64    `json:"capacityBytes"`
	Managed       bool     `json:"managed"`
	Sandboxes     []string `json:"sandboxes"`
}

type pvcEnv struct {
	t       *testing.T
	srv     *server
	ref     string
	runtime string
}

func (p *pvcEnv) body(vols ...map[string]any) map[string]any {
	b := map[string]any{"image": map[string]any{"uri": p.ref}, "entrypoint": []string{"tail", "-f", "/dev/null"}, "timeout": 600}
	if vols != nil {
		b["volumes"] = vols
	}
	return b
}

func pvcVol(name, claim, mountPath string, extra map[string]any, pvc map[string]any) map[string]any {
	p := map[string]any{"claimName": claim}
	for k, v := range pvc {
		p[k] = v
	}
	v := map[string]any{"name": name, "mountPath": mountPath, "pvc": p}
	for k, val := range extra {
		v[k] = val
	}
	return v
}

func (p *pvcEnv) create(vols ...map[string]any) string {
	p.t.Helper()
	var sb sandboxResp
	p.srv.mustJSON(202, "POST", "/v1/sandboxes", p.body(vols...), &sb)
	p.t.Cleanup(func() { p.srv.do("DELETE", "/v1/sandboxes/"+sb.ID, nil) })
	return sb.ID
}

// refused posts a create that must fail with status and code, and checks
// that it left no running sandbox.
func (p *pvcEnv) refused(what string, status int, code string, vols ...map[string]any) {
	p.t.Helper()
	got, b, _ := p.srv.do("POST", "/v1/sandboxes", p.body(vols...))
	var e struct{ Code, Message string }
	json.Unmarshal(b, &e)
	if got != status || e.Code != code || e.Message == "" {
		p.t.Errorf("%s: %d %s, want %d %s", what, got, b, status, code)
	}
}

func (p *pvcEnv) volume(name string) (namedVolumeResp, int) {
	p.t.Helper()
	code, b, _ := p.srv.do("GET", "/v1/volumes/"+name, nil)
	var v namedVolumeResp
	json.Unmarshal(b, &v)
	return v, code
}

func (p *pvcEnv) sh(id, cmd string) string {
	p.t.Helper()
	out, ok := shell(p.t, p.srv, id, cmd)
	if !ok {
		p.t.Fatalf("%s: %q did not complete: %q", id, cmd, out)
	}
	return out
}

// pvcRoundTrip is the runtime-neutral part: bad input, sharing,
// read-only, subPath confinement, in-use refusal, the CLI verbs,
// persistence across sandboxes, deleteOnSandboxTermination.
func pvcRoundTrip(p *pvcEnv) {
	t, srv := p.t, p.srv
	claim := fmt.Sprintf("e2e-shared-%06x", rand.Uint32()&0xffffff)
	t.Cleanup(func() { srv.do("DELETE", "/v1/volumes/"+claim, nil) })

	// Bad input: clear codes, nothing made.
	p.refused("unknown claim without createIfNotExists", 404, "VOLUME::PVC_NOT_FOUND",
		pvcVol("a", "e2e-fresh", "/a", nil, nil), pvcVol("b", "e2e-absent", "/b", nil, map[string]any{"createIfNotExists": false}))
	p.refused("bad claimName", 400, "VOLUME::INVALID_PVC_NAME", pvcVol("a", "../etc", "/a", nil, nil))
	p.refused("subPath with ..", 400, "VOLUME::INVALID_SUB_PATH", pvcVol("a", claim, "/a", map[string]any{"subPath": "x/../../y"}, nil))
	p.refused("bad storage", 400, "VOLUME::INVALID_STORAGE", pvcVol("a", claim, "/a", nil, map[string]any{"storage": "lots"}))
	p.refused("two backends", 400, "VOLUME::INVALID_BACKEND", map[string]any{"name": "a", "mountPath": "/a",
		"pvc": map[string]any{"claimName": claim}, "host": map[string]any{"path": "/tmp"}})
	p.refused("ossfs", 501, "VOLUME::UNSUPPORTED_BACKEND", map[string]any{"name": "a", "mountPath": "/a",
		"ossfs": map[string]any{"bucket": "b", "endpoint": "e"}})
	var list struct{ Items []namedVolumeResp }
	srv.mustJSON(200, "GET", "/v1/volumes", nil, &list)
	if len(list.Items) != 0 {
		t.Fatalf("refused creates left volumes: %+v", list.Items)
	}

	// Two sandboxes share the claim; the second mounts it read-only.
	a := p.create(pvcVol("data", claim, "/data", nil, map[string]any{"storage": "32Mi"}),
		pvcVol("sub", claim, "/sub", map[string]any{"subPath": "nested/dir"}, nil))
	b := p.create(pvcVol("data", claim, "/data", map[string]any{"readOnly": true}, nil))
	p.sh(a, "echo from-a > /data/a.txt && echo deep > /sub/d.txt")
	if out := p.sh(b, "cat /data/a.txt /data/nested/dir/d.txt; echo x > /data/b.txt 2>/dev/null && echo RO-WRITABLE; true"); out != "from-a\ndeep" {
		t.Errorf("the read-only sharer sees %q", out)
	}
	// subPath confinement: symlinks the sandbox plants lead nowhere.
	p.sh(a, "ln -s / /data/esc && ln -s ../../.. /data/nested/up && echo f > /data/file")
	for _, sub := range []string{"esc", "esc/etc", "nested/up", "file/x"} {
		p.refused("subPath "+sub, 400, "VOLUME::INVALID_SUB_PATH", pvcVol("x", claim, "/x", map[string]any{"subPath": sub}, map[string]any{"createIfNotExists": false}))
	}

	v, code := p.volume(claim)
	if code != 200 || len(v.Sandboxes) != 2 || !v.Managed {
		t.Fatalf("volume while shared: %d %+v", code, v)
	}
	if code, body, _ := srv.do("DELETE", "/v1/volumes/"+claim, nil); code != 409 || !strings.Contains(string(body), "VOLUME::IN_USE") {
		t.Fatalf("delete in use: %d %s", code, body)
	}
	// The CLI verbs.
	r := mustCLI(t, srv, 0, "volume", "ls")
	if !strings.Contains(r.stdout, claim) {
		t.Errorf("volume ls:\n%s", r.stdout)
	}
	if r = mustCLI(t, srv, 0, "volume", "get", claim); !strings.Contains(r.stdout, a) || !strings.Contains(r.stdout, b) {
		t.Errorf("volume get:\n%s", r.stdout)
	}
	if r = cli(t, srv, nil, "volume", "rm", claim); r.code == 0 || !strings.Contains(r.stderr, "VOLUME::IN_USE") {
		t.Errorf("volume rm in use: %d %s", r.code, r.stderr)
	}
	srv.do("DELETE", "/v1/sandboxes/"+a, nil)
	srv.do("DELETE", "/v1/sandboxes/"+b, nil)

	// The data outlives its sandboxes. deleteOnSandboxTermination deletes
	// a volume that the sandbox's create made, as upstream does, and never
	// one that existed before or that another sandbox uses.
	c := p.create(pvcVol("data", claim, "/data", nil, map[string]any{"createIfNotExists": false, "deleteOnSandboxTermination": true}))
	if out := p.sh(c, "cat /data/a.txt"); out != "from-a" {
		t.Errorf("a later sandbox reads %q", out)
	}
	srv.do("DELETE", "/v1/sandboxes/"+c, nil)
	if _, code := p.volume(claim); code != 200 {
		t.Errorf("a pre-existing volume after a deleteOnSandboxTermination sandbox: %d, want 200", code)
	}
	if code, body, _ := srv.do("DELETE", "/v1/volumes/"+claim, nil); code != 204 {
		t.Errorf("delete: %d %s", code, body)
	}
	if _, code := p.volume(claim); code != 404 {
		t.Errorf("volume after delete: %d, want 404", code)
	}
	scratch := fmt.Sprintf("e2e-scratch-%06x", rand.Uint32()&0xffffff)
	t.Cleanup(func() { srv.do("DELETE", "/v1/volumes/"+scratch, nil) })
	d := p.create(pvcVol("s", scratch, "/s", nil, map[string]any{"deleteOnSandboxTermination": true}))
	e := p.create(pvcVol("s", scratch, "/s", nil, nil))
	srv.do("DELETE", "/v1/sandboxes/"+d, nil)
	if _, code := p.volume(scratch); code != 200 {
		t.Errorf("volume still used by another sandbox: %d, want 200", code)
	}
	srv.do("DELETE", "/v1/sandboxes/"+e, nil)
	srv.do("DELETE", "/v1/volumes/"+scratch, nil)
	f := p.create(pvcVol("s", scratch, "/s", nil, map[string]any{"deleteOnSandboxTermination": true}))
	srv.do("DELETE", "/v1/sandboxes/"+f, nil)
	if _, code := p.volume(scratch); code != 404 {
		t.Errorf("volume after the sandbox that made it: %d, want 404", code)
	}
}

// TestNamedVolumes runs the round trip on the native runtime, then the
// native-only parts: the quota, a kill -9 of the server with a sandbox
// holding the volume, and the absence of leaked loop devices and mounts.
func TestNamedVolumes(t *testing.T) {
	srv := newServer(t)
	p := &pvcEnv{t: t, srv: srv, ref: startRegistry(t), runtime: "oci"}
	srv.start()
	pvcRoundTrip(p)
	volRoot := filepath.Join(srv.root, "oci", "volumes")

	// The quota: 32Mi.
	claim := fmt.Sprintf("e2e-quota-%06x", rand.Uint32()&0xffffff)
	t.Cleanup(func() { srv.do("DELETE", "/v1/volumes/"+claim, nil) })
	q := p.create(pvcVol("data", claim, "/data", nil, map[string]any{"storage": "32Mi"}))
	out := p.sh(q, "dd if=/dev/zero of=/data/fill bs=1M count=64 2>&1 | grep -c 'No space'; ls -l /data/fill | awk '{print \"SIZE\", $5}'")
	if !strings.HasPrefix(out, "1\n") || !sizeBelow(out, 32<<20) {
		t.Errorf("filling a 32Mi volume: %q", out)
	}
	p.sh(q, "rm /data/fill && echo before-crash > /data/crash.txt && echo layer > /layer.txt")

	// A snapshot holds the writable layer, not the volumes: a sandbox from
	// it has the layer's file and an empty mount point, and sees the data
	// again only when its own request mounts the claim.
	var sn struct{ ID string }
	srv.mustJSON(202, "POST", "/v1/sandboxes/"+q+"/snapshots", map[string]any{"name": "with-volume"}, &sn)
	t.Cleanup(func() { srv.do("DELETE", "/v1/snapshots/"+sn.ID, nil) })
	var fork sandboxResp
	srv.mustJSON(202, "POST", "/v1/sandboxes", map[string]any{"snapshotId": sn.ID, "timeout": 600}, &fork)
	if out := p.sh(fork.ID, "cat /layer.txt; ls -A /data | wc -l"); out != "layer\n0" {
		t.Errorf("a sandbox from the snapshot sees %q, want the layer's file and an empty /data", out)
	}
	srv.do("DELETE", "/v1/sandboxes/"+fork.ID, nil)
	srv.mustJSON(202, "POST", "/v1/sandboxes", map[string]any{"snapshotId": sn.ID, "timeout": 600,
		"volumes": []map[string]any{pvcVol("data", claim, "/data", nil, map[string]any{"createIfNotExists": false})}}, &fork)
	if out := p.sh(fork.ID, "cat /layer.txt /data/crash.txt"); out != "layer\nbefore-crash" {
		t.Errorf("a sandbox from the snapshot with the claim sees %q", out)
	}
	srv.do("DELETE", "/v1/sandboxes/"+fork.ID, nil)
	srv.do("DELETE", "/v1/snapshots/"+sn.ID, nil)

	// A pool whose template mounts the claim: its warm sandboxes share it,
	// a claimed one reads the data, and the pool keeps it in use.
	srv.mustJSON(201, "POST", "/v1/pools", map[string]any{
		"name": "pvc-pool",
		"template": map[string]any{"image": map[string]string{"uri": p.ref}, "entrypoint": []string{"tail", "-f", "/dev/null"},
			"volumes": []map[string]any{pvcVol("data", claim, "/data", map[string]any{"readOnly": true}, nil)}},
		"capacitySpec": map[string]int{"bufferMin": 1, "bufferMax": 1, "poolMin": 0, "poolMax": 3},
	}, nil)
	var claimed sandboxResp
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		var pl struct{ Status struct{ Available int } }
		srv.mustJSON(200, "GET", "/v1/pools/pvc-pool", nil, &pl)
		if pl.Status.Available == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("pool never warmed: %+v", pl)
		}
	}
	srv.mustJSON(202, "POST", "/v1/sandboxes", map[string]any{"extensions": map[string]string{"poolRef": "pvc-pool"}, "timeout": 300}, &claimed)
	if out := p.sh(claimed.ID, "cat /data/crash.txt; touch /data/x 2>/dev/null || echo read-only"); out != "before-crash\nread-only" {
		t.Errorf("a sandbox claimed from the pool sees %q", out)
	}
	srv.do("DELETE", "/v1/sandboxes/"+claimed.ID, nil)
	if code, _, _ := srv.do("DELETE", "/v1/volumes/"+claim, nil); code != 409 {
		t.Errorf("delete of a volume the pool's warm sandboxes mount: %d, want 409", code)
	}
	if code, body, _ := srv.do("DELETE", "/v1/pools/pvc-pool", nil); code != 204 {
		t.Fatalf("delete pool: %d %s", code, body)
	}

	// kill -9 with the sandbox running: it keeps its volume, and the new
	// server knows it is in use.
	srv.kill9()
	srv.start()
	if out := p.sh(q, "cat /data/crash.txt"); out != "before-crash" {
		t.Errorf("after the crash the sandbox reads %q", out)
	}
	if code, body, _ := srv.do("DELETE", "/v1/volumes/"+claim, nil); code != 409 {
		t.Fatalf("delete in use after restart: %d %s", code, body)
	}
	if l := volume.LoopsBacking(volRoot); len(l) != 1 {
		t.Errorf("loop devices while in use: %v", l)
	}
	srv.do("DELETE", "/v1/sandboxes/"+q, nil)
	if l := volume.LoopsReleased(volRoot, 10*time.Second); len(l) != 0 {
		t.Errorf("loop devices left when no sandbox uses the volume: %v", l)
	}
	if m := mountsBelow(volRoot); len(m) != 0 {
		t.Errorf("mounts left: %v", m)
	}
	if code, body, _ := srv.do("DELETE", "/v1/volumes/"+claim, nil); code != 204 {
		t.Fatalf("delete: %d %s", code, body)
	}
	if _, code := p.volume(claim); code != 404 {
		t.Errorf("volume after delete: %d", code)
	}
	if ents, _ := os.ReadDir(volRoot); len(ents) != 0 {
		t.Errorf("left in the volume store: %v", ents)
	}
}

// TestNamedVolumesDocker: the same requests on the Docker runtime, where a
// claim is a Docker named volume.
func TestNamedVolumesDocker(t *testing.T) {
	srv := newServer(t)
	ref := startRegistry(t)
	srv.startDocker()
	p := &pvcEnv{t: t, srv: srv, ref: ref, runtime: "docker"}
	pvcRoundTrip(p)
	claim := fmt.Sprintf("e2e-docker-%06x", rand.Uint32()&0xffffff)
	t.Cleanup(func() { srv.do("DELETE", "/v1/volumes/"+claim, nil) })
	id := p.create(pvcVol("data", claim, "/data", nil, nil))
	p.sh(id, "echo hi > /data/x")
	srv.do("DELETE", "/v1/sandboxes/"+id, nil)
	if out, err := exec.Command("/usr/bin/docker", "volume", "inspect", claim, "--format", "{{.Driver}}").CombinedOutput(); err != nil || strings.TrimSpace(string(out)) != "local" {
		t.Errorf("docker volume inspect %s: %s %v", claim, out, err)
	}
	if code, body, _ := srv.do("DELETE", "/v1/volumes/"+claim, nil); code != 204 {
		t.Fatalf("delete: %d %s", code, body)
	}
	if err := exec.Command("/usr/bin/docker", "volume", "inspect", claim).Run(); err == nil {
		t.Errorf("docker volume %s still exists", claim)
	}
}

// mountsBelow lists the mount points under dir.
func mountsBelow(dir string) []string {
	data, _ := os.ReadFile("/proc/self/mountinfo")
	var out []string
	for line := range strings.SplitSeq(string(data), "\n") {
		f := strings.Fields(line)
		if len(f) > 4 && strings.HasPrefix(f[4], dir+"/") {
			out = append(out, f[4])
		}
	}
	return out
}

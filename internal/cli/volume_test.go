package cli

import (
	"net/http"
	"reflect"
	"strings"
	"testing"

	"github.com/moat-sandbox/moat/client"
)

func TestVolumeVerbsAgainstFake(t *testing.T) {
	f := newFakeServer(t)
	vol := map[string]any{"name": "work", "capacityBytes": 1 << 30, "usedBytes": 1536 << 10, "createdAt": "2026-01-02T03:04:00Z",
		"managed": true, "sandboxes": []string{"sb-1", "sb-2"}}
	f.mux.HandleFunc("GET /v1/volumes", func(w http.ResponseWriter, r *http.Request) {
		writeJSONResp(w, 200, map[string]any{"items": []any{vol}})
	})
	f.mux.HandleFunc("GET /v1/volumes/{name}", func(w http.ResponseWriter, r *http.Request) {
		if r.PathValue("name") != "work" {
			writeJSONResp(w, 404, map[string]string{"code": "VOLUME::NOT_FOUND", "message": "volume " + r.PathValue("name") + " not found"})
			return
		}
		writeJSONResp(w, 200, vol)
	})
	f.mux.HandleFunc("DELETE /v1/volumes/{name}", func(w http.ResponseWriter, r *http.Request) {
		writeJSONResp(w, 409, map[string]string{"code": "VOLUME::IN_USE", "message": "volume work is in use by sandbox sb-1, sb-2"})
	})
	out, _, code := f.run(nil, "volume", "ls")
	if code != 0 || !strings.Contains(out, "NAME") || !strings.Contains(out, "work") || !strings.Contains(out, "1GiB") || !strings.Contains(out, "1.5MiB") {
		t.Fatalf("volume ls: %d\n%s", code, out)
	}
	out, _, code = f.run(nil, "volume", "get", "work")
	if code != 0 || !strings.Contains(out, "sb-1, sb-2") {
		t.Fatalf("volume get: %d\n%s", code, out)
	}
	out, _, code = f.run(nil, "vol", "get", "work", "-o", "json")
	if code != 0 || !strings.Contains(out, `"capacityBytes": 1073741824`) {
		t.Fatalf("volume get -o json: %d\n%s", code, out)
	}
	_, errOut, code := f.run(nil, "volume", "get", "nope")
	if code == 0 || !strings.Contains(errOut, "VOLUME::NOT_FOUND") {
		t.Fatalf("volume get missing: %d %s", code, errOut)
	}
	_, errOut, code = f.run(nil, "volume", "rm", "work")
	if code == 0 || !strings.Contains(errOut, "VOLUME::IN_USE") {
		t.Fatalf("volume rm in use: %d %s", code, errOut)
	}
}

func TestVolumeFlag(t *testing.T) {
	got, err := parseVolumeFlags([]string{"work:/data", "work/a/b:/sub:ro", "/srv/x:/x:rw"})
	want := []client.Volume{
		{Name: "v0", MountPath: "/data", PVC: &client.PVCVolume{ClaimName: "work"}},
		{Name: "v1", MountPath: "/sub", ReadOnly: true, SubPath: "a/b", PVC: &client.PVCVolume{ClaimName: "work"}},
		{Name: "v2", MountPath: "/x", Host: &client.HostVolume{Path: "/srv/x"}},
	}
	if err != nil || !reflect.DeepEqual(got, want) {
		t.Fatalf("got %+v %v", got, err)
	}
	for _, bad := range []string{"work", "work:data", ":/d", "work:/d:rx", "a:/b:ro:x"} {
		if _, err := parseVolumeFlags([]string{bad}); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

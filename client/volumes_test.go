package client

import (
	"context"
	"testing"
)

func TestVolumes(t *testing.T) {
	const vol = `{"name":"work","capacityBytes":67108864,"usedBytes":4096,"createdAt":"2026-01-02T03:04:00Z","managed":true,"sandboxes":["a"]}`
	f := newFake(t)
	f.handle("GET /v1/volumes", raw(200, `{"items":[`+vol+`]}`))
	f.handle("GET /v1/volumes/{name}", raw(200, vol))
	f.handle("DELETE /v1/volumes/{name}", raw(409, `{"code":"VOLUME::IN_USE","message":"volume work is in use by sandbox a"}`))
	f.handle("POST /v1/sandboxes", raw(202, `{"id":"a","status":{"state":"Running"},"metadata":{},"entrypoint":["sh"],"createdAt":"2026-01-02T03:04:00Z"}`))
	c := mustClient(t, f.srv.URL)
	ctx := context.Background()
	vs, err := c.ListVolumes(ctx)
	if err != nil || len(vs) != 1 || vs[0].CapacityBytes != 64<<20 || !vs[0].Managed || vs[0].Sandboxes[0] != "a" {
		t.Fatalf("list %+v %v", vs, err)
	}
	if v, err := c.GetVolume(ctx, "work"); err != nil || v.Name != "work" || v.UsedBytes != 4096 {
		t.Fatalf("get %+v %v", v, err)
	}
	if err := c.DeleteVolume(ctx, "work"); !IsConflict(err) {
		t.Fatalf("delete in use: %v", err)
	}
	no := false
	_, err = c.CreateSandbox(ctx, CreateRequest{Image: &ImageSpec{URI: "busybox"}, Entrypoint: []string{"sh"}, Volumes: []Volume{
		{Name: "d", MountPath: "/data", SubPath: "s", ReadOnly: true, PVC: &PVCVolume{ClaimName: "work", CreateIfNotExists: &no, Storage: "1Gi"}},
	}})
	if err != nil {
		t.Fatal(err)
	}
	b := decodeBody(t, f.last("/v1/sandboxes").Body)
	v := b["volumes"].([]any)[0].(map[string]any)
	p := v["pvc"].(map[string]any)
	if v["mountPath"] != "/data" || v["subPath"] != "s" || v["readOnly"] != true || p["claimName"] != "work" || p["createIfNotExists"] != false || p["storage"] != "1Gi" {
		t.Fatalf("create body %v", b)
	}
	if _, ok := v["host"]; ok {
		t.Fatalf("unset host backend sent: %v", v)
	}
}

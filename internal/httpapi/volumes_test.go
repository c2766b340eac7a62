package httpapi_test

import (
	"strconv"
	"testing"
)

// TestVolumeRoutes drives the volume API over HTTP with the fake runtime:
// a pvc create makes the claim, /volumes shows it with its user, deleting
// it in use is 409, and bad pvc input gets its VOLUME::* code.
func TestVolumeRoutes(t *testing.T) {
	srv := newAPI(t)
	pvc := `{"image":{"uri":"busybox"},"entrypoint":["sh"],"timeout":120,"volumes":[{"name":"d","mountPath":"/data","pvc":{"claimName":"work","storage":"64Mi"}}]}`
	code, m, _ := call(t, srv, "POST", "/v1/sandboxes", pvc)
	if code != 202 {
		t.Fatalf("create: %d %v", code, m)
	}
	id := m["id"].(string)
	code, m, _ = call(t, srv, "GET", "/v1/volumes", "")
	items, _ := m["items"].([]any)
	if code != 200 || len(items) != 1 {
		t.Fatalf("list: %d %v", code, m)
	}
	code, m, _ = call(t, srv, "GET", "/volumes/work", "")
	users, _ := m["sandboxes"].([]any)
	if code != 200 || m["name"] != "work" || m["capacityBytes"] != float64(64<<20) || m["managed"] != true || len(users) != 1 || users[0] != id {
		t.Fatalf("get: %d %v", code, m)
	}
	if code, m, _ = call(t, srv, "DELETE", "/v1/volumes/work", ""); code != 409 || m["code"] != "VOLUME::IN_USE" {
		t.Fatalf("delete in use: %d %v", code, m)
	}
	if code, m, _ = call(t, srv, "GET", "/v1/volumes/nope", ""); code != 404 || m["code"] != "VOLUME::NOT_FOUND" {
		t.Fatalf("get missing: %d %v", code, m)
	}
	call(t, srv, "DELETE", "/v1/sandboxes/"+id, "")
	if code, m, _ = call(t, srv, "DELETE", "/v1/volumes/work", ""); code != 204 {
		t.Fatalf("delete: %d %v", code, m)
	}
	for _, tc := range []struct{ vol, status, code string }{
		{`{"name":"d","mountPath":"/d","pvc":{"claimName":"absent","createIfNotExists":false}}`, "404", "VOLUME::PVC_NOT_FOUND"},
		{`{"name":"d","mountPath":"/d","pvc":{"claimName":"Bad_Name"}}`, "400", "VOLUME::INVALID_PVC_NAME"},
		{`{"name":"d","mountPath":"/d","pvc":{"claimName":"x","storage":"ten gigs"}}`, "400", "VOLUME::INVALID_STORAGE"},
		{`{"name":"d","mountPath":"/d","subPath":"../..","pvc":{"claimName":"x"}}`, "400", "VOLUME::INVALID_SUB_PATH"},
		{`{"name":"d","mountPath":"/d","pvc":{"claimName":"x"},"host":{"path":"/tmp"}}`, "400", "VOLUME::INVALID_BACKEND"},
		{`{"name":"d","mountPath":"/d","ossfs":{"bucket":"b","endpoint":"e"}}`, "501", "VOLUME::UNSUPPORTED_BACKEND"},
		{`{"name":"d","mountPath":"/d","pvc":{"claimName":7}}`, "400", "VOLUME::INVALID_VOLUME"},
	} {
		body := `{"image":{"uri":"busybox"},"entrypoint":["sh"],"timeout":120,"volumes":[` + tc.vol + `]}`
		code, m, _ := call(t, srv, "POST", "/v1/sandboxes", body)
		if strconv.Itoa(code) != tc.status || m["code"] != tc.code || m["message"] == "" {
			t.Errorf("%s: %d %v, want %s %s", tc.vol, code, m, tc.status, tc.code)
		}
	}
	if _, m, _ = call(t, srv, "GET", "/v1/volumes", ""); len(m["items"].([]any)) != 0 {
		t.Fatalf("bad creates left volumes: %v", m)
	}
}

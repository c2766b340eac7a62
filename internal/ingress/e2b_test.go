package ingress

import (
	"encoding/json"
	"fmt"
	"net"
	"testing"

	"github.com/moat-sandbox/moat/internal/errdefs"
)

// TestE2BHeaders: E2B's routing headers route on a localhost, IP or
// sandbox.* host, and their failures are E2B's edge bodies; on a
// sandbox host they are not the route.
func TestE2BHeaders(t *testing.T) {
	e := newEnv(t)
	a, b := newBackend(t, "a"), newBackend(t, "b")
	e.res.add("sbxa0123", Target{Addr: addrOf(a)})
	e.res.add("sbxb0123", Target{Addr: addrOf(b)})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := ln.Addr().String()
	ln.Close()
	e.res.add("dead0123", Target{Addr: dead})
	e.res.errs["paused01"] = fmt.Errorf("sandbox paused01 is Paused: %w", errdefs.ErrFailedPrecondition)
	hdr := func(id, port string) map[string]string {
		return map[string]string{HeaderE2BSandboxID: id, HeaderE2BSandboxPort: port}
	}
	for _, u := range []string{e.ts.URL + "/files?path=x", "http://localhost/files?path=x", "http://sandbox." + testDomain + "/files?path=x"} {
		if got := e.echo(t, "POST", u, hdr("sbxa0123", "49983"), "body"); got.Backend != "a" || got.URI != "/files?path=x" || got.Body != "body" {
			t.Fatalf("%s: upstream saw %+v", u, got)
		}
	}
	// On a sandbox's own host the host is the route.
	if got := e.echo(t, "GET", "http://8080-sbxb0123."+testDomain+"/", hdr("sbxa0123", "49983"), ""); got.Backend != "b" {
		t.Fatalf("host route with E2B headers went to %s", got.Backend)
	}
	tests := []struct {
		name   string
		hdr    map[string]string
		status int
		want   map[string]any
	}{
		{"unknown", hdr("nope0123", "49983"), 502, map[string]any{"sandboxId": "nope0123", "message": "The sandbox was not found", "code": 502.0}},
		{"not running", hdr("paused01", "49983"), 502, map[string]any{"sandboxId": "paused01", "message": "The sandbox was not found", "code": 502.0}},
		{"closed port", hdr("dead0123", "8000"), 502, map[string]any{"sandboxId": "dead0123", "message": "The sandbox is running but port is not open", "port": 8000.0, "code": 502.0}},
	}
	for _, tc := range tests {
		resp, body := e.do("GET", e.ts.URL+"/", tc.hdr, "")
		var got map[string]any
		if resp.StatusCode != tc.status || json.Unmarshal(body, &got) != nil || fmt.Sprint(got) != fmt.Sprint(tc.want) {
			t.Fatalf("%s: %d %s, want %d %v", tc.name, resp.StatusCode, body, tc.status, tc.want)
		}
	}
	for name, h := range map[string]map[string]string{
		"id only":   {HeaderE2BSandboxID: "sbxa0123"},
		"port only": {HeaderE2BSandboxPort: "49983"},
		"bad port":  hdr("sbxa0123", "http"),
		"bad id":    hdr("SBX-A", "49983"),
	} {
		resp, body := e.do("GET", e.ts.URL+"/", h, "")
		var got struct {
			Code    int
			Message string
		}
		if resp.StatusCode != 400 || json.Unmarshal(body, &got) != nil || got.Code != 400 || got.Message == "" {
			t.Fatalf("%s: %d %s", name, resp.StatusCode, body)
		}
	}
}

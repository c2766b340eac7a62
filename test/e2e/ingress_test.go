package e2e

import (
	"fmt"
	"net/http"
	"testing"
)

func TestIngressSecureAccess(t *testing.T) {
	srv := newServer(t)
	ref := startRegistry(t)
	gw := freePort(t)
	srv.start("--ingress-listen", gw)
	var c sandboxResp
	srv.mustJSON(202, "POST", "/v1/sandboxes", map[string]any{"image": map[string]any{"uri": ref},
		"entrypoint": []string{"httpd", "-f", "-p", "8080", "-h", "/workspace"}, "secureAccess": true, "timeout": 600}, &c)
	if out, ok := shell(t, srv, c.ID, "echo served-by-sandbox > /workspace/index.html"); !ok {
		t.Fatalf("write index: %q", out)
	}
	var ep endpointResp
	srv.mustJSON(200, "GET", "/v1/sandboxes/"+c.ID+"/endpoints/8080", nil, &ep)
	tok := ep.Headers["OpenSandbox-Secure-Access"]
	if tok == "" {
		t.Fatalf("endpoint of a secureAccess sandbox has no access token: %+v", ep)
	}
	get := func(path string, hdr map[string]string) (int, string) {
		code, body, err := getServed(http.DefaultClient, "http://"+gw+path, hdr)
		if err != nil {
			t.Fatal(err)
		}
		return code, body
	}
	route := fmt.Sprintf("%s-8080", c.ID)
	if code, body := get("/index.html", map[string]string{"OpenSandbox-Ingress-To": route, "OpenSandbox-Secure-Access": tok}); code != 200 || body != "served-by-sandbox" {
		t.Fatalf("header route: %d %q", code, body)
	}
	if code, body := get("/"+c.ID+"/8080/index.html", map[string]string{"OpenSandbox-Secure-Access": tok}); code != 200 || body != "served-by-sandbox" {
		t.Fatalf("path route: %d %q", code, body)
	}
	if code, _ := get("/index.html", map[string]string{"OpenSandbox-Ingress-To": route}); code != 401 {
		t.Fatalf("no access token: %d", code)
	}
	if code, _ := get("/index.html", map[string]string{"OpenSandbox-Ingress-To": route, "OpenSandbox-Secure-Access": "guess"}); code != 401 {
		t.Fatalf("wrong access token: %d", code)
	}
	if code, _ := get("/index.html", map[string]string{"OpenSandbox-Ingress-To": "nope-8080"}); code != 404 {
		t.Fatalf("unknown sandbox: %d", code)
	}
}

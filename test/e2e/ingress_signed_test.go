package e2e

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"
)

// TestSignedEndpointsWithoutGateway: a server with no ingress options
// signs endpoints with a key of its own, kept across a restart, and
// serves them on its API listener under /ingress, without an API key;
// an unsigned or tampered route there opens nothing.
func TestSignedEndpointsWithoutGateway(t *testing.T) {
	srv := newServer(t)
	ref := startRegistry(t)
	srv.start()
	var c sandboxResp
	srv.mustJSON(202, "POST", "/v1/sandboxes", map[string]any{"image": map[string]any{"uri": ref},
		"entrypoint": []string{"httpd", "-f", "-p", "8080", "-h", "/workspace"}, "timeout": 600}, &c)
	id := c.ID
	if out, ok := shell(t, srv, id, "echo signed-ok > /workspace/index.html && echo written"); !ok || out != "written" {
		t.Fatalf("write index: %v %q", ok, out)
	}
	exp := time.Now().Add(10 * time.Minute).Unix()
	var ep endpointResp
	srv.mustJSON(200, "GET", fmt.Sprintf("/v1/sandboxes/%s/endpoints/8080?expires=%d", id, exp), nil, &ep)
	rest, ok := strings.CutPrefix(ep.Endpoint, srv.addr+"/ingress/"+id+"/8080/")
	if parts := strings.Split(rest, "/"); !ok || len(parts) != 2 || len(parts[1]) != 9 {
		t.Fatalf("signed endpoint %q, want %s/ingress/%s/8080/<exp>/<sig>", ep.Endpoint, srv.addr, id)
	}
	hc := &http.Client{Timeout: 10 * time.Second}
	get := func(url string) (int, string) {
		t.Helper()
		code, body, err := getServed(hc, url, nil)
		if err != nil {
			t.Fatal(err)
		}
		return code, body
	}
	if code, body := get("http://" + ep.Endpoint + "/index.html"); code != 200 || body != "signed-ok" {
		t.Fatalf("signed route on the API listener: %d %q", code, body)
	}
	sig := ep.Endpoint[len(ep.Endpoint)-9:]
	bad := "0"
	if sig[0] == '0' {
		bad = "1"
	}
	for name, url := range map[string]string{
		"unsigned": fmt.Sprintf("http://%s/ingress/%s/8080/index.html", srv.addr, id),
		"tampered": "http://" + ep.Endpoint[:len(ep.Endpoint)-9] + bad + sig[1:] + "/index.html",
	} {
		if code, body := get(url); code != 401 {
			t.Errorf("%s route: %d %q, want 401", name, code, body)
		}
	}
	// The key is the server's own, kept: the route outlives a restart.
	srv.stop()
	srv.start()
	if code, body := get("http://" + ep.Endpoint + "/index.html"); code != 200 || body != "signed-ok" {
		t.Fatalf("signed route after a restart: %d %q", code, body)
	}
}

// TestIngressEndpointsAndSignedRoutes runs a server whose endpoints API
// answers gateway addresses (--ingress-route-mode uri) and signs routes
// (OSEP-0011): the agent is driven through the returned endpoint as an
// SDK would, and signed routes open a secureAccess sandbox without its
// token until they expire, in the path, header and host forms.
func TestIngressEndpointsAndSignedRoutes(t *testing.T) {
	srv := newServer(t)
	ref := startRegistry(t)
	gw := freePort(t)
	_, gwPort, _ := net.SplitHostPort(gw)
	keys := "k=" + base64.StdEncoding.EncodeToString([]byte("e2e-route-secret"))
	srv.start("--ingress-listen", gw, "--ingress-route-mode", "uri", "--ingress-domain", "sbx.e2e.test",
		"--ingress-secure-access-keys", keys)
	var c sandboxResp
	srv.mustJSON(202, "POST", "/v1/sandboxes", map[string]any{"image": map[string]any{"uri": ref},
		"entrypoint": []string{"httpd", "-f", "-p", "8080", "-h", "/workspace"}, "secureAccess": true, "timeout": 600}, &c)
	id := c.ID

	// The agent endpoint is the gateway's; commands run through it.
	var ep endpointResp
	srv.mustJSON(200, "GET", "/v1/sandboxes/"+id+"/endpoints/44772", nil, &ep)
	if ep.Endpoint != gw+"/"+id+"/44772" || ep.Headers["X-EXECD-ACCESS-TOKEN"] == "" || ep.Headers["OpenSandbox-Secure-Access"] == "" {
		t.Fatalf("agent endpoint %+v, want %s/%s/44772 with agent and access tokens", ep, gw, id)
	}
	evs := runCommand(t, "http://"+ep.Endpoint, ep.Headers, "echo via-gateway > /workspace/index.html; cat /workspace/index.html")
	if got := stdoutOf(evs); got != "via-gateway" {
		t.Fatalf("command through the gateway: %q %+v", got, evs)
	}

	client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
		// Host routes: every name is the gateway (no DNS involved).
		DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "tcp", gw)
		},
	}}
	get := func(url string, hdr map[string]string) (int, string) {
		t.Helper()
		req, _ := http.NewRequest("GET", url, nil)
		for k, v := range hdr {
			req.Header.Set(k, v)
		}
		var resp *http.Response
		var err error
		// httpd may still be starting (502 until it listens): how long
		// that takes depends on the machine's load, so only a hang fails.
		for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
			if resp, err = client.Do(req); err == nil && resp.StatusCode != 502 {
				break
			}
			if resp != nil {
				resp.Body.Close()
			}
			if time.Now().After(deadline) {
				break
			}
		}
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, strings.TrimSpace(string(b))
	}

	ep = endpointResp{} // mustJSON merges into the maps of a used value
	srv.mustJSON(200, "GET", "/v1/sandboxes/"+id+"/endpoints/8080", nil, &ep)
	if ep.Endpoint != gw+"/"+id+"/8080" {
		t.Fatalf("endpoint %+v", ep)
	}
	if code, body := get("http://"+ep.Endpoint+"/index.html", ep.Headers); code != 200 || body != "via-gateway" {
		t.Fatalf("unsigned endpoint: %d %q", code, body)
	}
	if code, _ := get("http://"+ep.Endpoint+"/index.html", nil); code != 401 {
		t.Fatalf("unsigned endpoint without the token: %d", code)
	}

	// Signed endpoint: no token needed until it expires. Its expiry is
	// far enough for the checks below on a busy machine; a second one
	// that expires soon shows the expiry (at the end).
	exp := time.Now().Add(10 * time.Minute).Unix()
	ep = endpointResp{}
	srv.mustJSON(200, "GET", fmt.Sprintf("/v1/sandboxes/%s/endpoints/8080?expires=%d", id, exp), nil, &ep)
	if _, ok := ep.Headers["OpenSandbox-Secure-Access"]; ok {
		t.Fatalf("signed endpoint carries the access token: %+v", ep)
	}
	rest, ok := strings.CutPrefix(ep.Endpoint, gw+"/"+id+"/8080/")
	parts := strings.Split(rest, "/")
	if !ok || len(parts) != 2 || len(parts[1]) != 9 {
		t.Fatalf("signed endpoint %q, want %s/%s/8080/<exp>/<sig>", ep.Endpoint, gw, id)
	}
	b36, sig := parts[0], parts[1]
	token := id + "-8080-" + b36 + "-" + sig
	if code, body := get("http://"+ep.Endpoint+"/index.html", nil); code != 200 || body != "via-gateway" {
		t.Fatalf("signed path route: %d %q", code, body)
	}
	if code, body := get("http://"+gw+"/index.html", map[string]string{"OpenSandbox-Ingress-To": token}); code != 200 || body != "via-gateway" {
		t.Fatalf("signed header route: %d %q", code, body)
	}
	if code, body := get("http://"+token+".sbx.e2e.test:"+gwPort+"/index.html", nil); code != 200 || body != "via-gateway" {
		t.Fatalf("signed host route: %d %q", code, body)
	}
	bad := "0"
	if sig[0] == '0' {
		bad = "1"
	}
	for name, url := range map[string]string{
		"tampered":       fmt.Sprintf("http://%s/%s/8080/%s/%s/index.html", gw, id, b36, bad+sig[1:]),
		"other port":     fmt.Sprintf("http://%s/%s/44772/%s/%s/ping", gw, id, b36, sig),
		"other sandbox":  fmt.Sprintf("http://%s/%s/8080/%s/%s/index.html", gw, "00000000-0000-4000-8000-000000000000", b36, sig),
		"extended life":  fmt.Sprintf("http://%s/%s/8080/%s/%s/index.html", gw, id, "zzzzzzz", sig),
		"unknown key id": fmt.Sprintf("http://%s/%s/8080/%s/%s/index.html", gw, id, b36, sig[:8]+"q"),
	} {
		if code, body := get(url, nil); code != 401 {
			t.Errorf("%s: %d %q, want 401", name, code, body)
		}
	}
	// A route signed to expire in a few seconds opens the sandbox until
	// then, and no longer after. (A request slower than those seconds
	// finds the expiry already past: the API refuses it, and it is asked
	// again.)
	var short endpointResp
	var shortExp int64
	for {
		shortExp = time.Now().Add(4 * time.Second).Unix()
		code, body, _ := srv.do("GET", fmt.Sprintf("/v1/sandboxes/%s/endpoints/8080?expires=%d", id, shortExp), nil)
		if code == 200 {
			if err := json.Unmarshal(body, &short); err != nil {
				t.Fatal(err)
			}
			break
		}
		if code != 400 || time.Now().Unix() < shortExp {
			t.Fatalf("short-lived signed endpoint: %d %s", code, body)
		}
	}
	if time.Now().Unix() < shortExp {
		if code, body := get("http://"+short.Endpoint+"/index.html", nil); code != 200 && time.Now().Unix() < shortExp {
			t.Fatalf("short-lived signed route before its expiry: %d %q", code, body)
		}
	}
	time.Sleep(time.Until(time.Unix(shortExp+1, 0)) + 100*time.Millisecond)
	if code, _ := get("http://"+short.Endpoint+"/index.html", nil); code != 401 {
		t.Fatalf("expired signed route: %d, want 401", code)
	}
	// Expiry in the past is refused by the API.
	if code, body, _ := srv.do("GET", fmt.Sprintf("/v1/sandboxes/%s/endpoints/8080?expires=%d", id, time.Now().Unix()-5), nil); code != 400 {
		t.Fatalf("past expires: %d %s", code, body)
	}
}

package httpapi_test

import (
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"

	"github.com/moat-sandbox/moat/internal/httpapi"
)

// edgeCall sends an E2B edge request: host is the Host header, hdr pairs
// of headers; it returns the status and the body.
func edgeCall(t *testing.T, srv *httptest.Server, host, path string, hdr ...string) (int, string) {
	t.Helper()
	req, _ := http.NewRequest("GET", srv.URL+path, nil)
	req.Host = host
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// E2B's edge on the API listener: the E2b-Sandbox-Id/-Port headers (on a
// localhost or IP host) and <port>-<id>.<domain> hosts reach the sandbox
// port with the path, query and envd's Authorization intact; a missing
// sandbox or a closed port is E2B's exact 502 body, never a 404.
func TestE2BEdge(t *testing.T) {
	srv := newAPIWith(t, httpapi.Config{APIKey: key, EdgeDomain: "e2b.test"})
	// A service "in the sandbox": the fake runtime maps a sandbox's ports
	// other than the agent's to loopback.
	svc := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		json.NewEncoder(w).Encode(map[string]string{"path": r.URL.Path, "query": r.URL.RawQuery,
			"auth": r.Header.Get("Authorization"), "apikey": r.Header.Get("X-API-Key")})
	}))
	defer svc.Close()
	port := svc.Listener.Addr().(*net.TCPAddr).Port
	_, m, _ := call(t, srv, "POST", "/v1/sandboxes", createBody)
	id := m["id"].(string)
	hostOf := func() string { return strings.TrimPrefix(srv.URL, "http://") }

	want := `{"apikey":"","auth":"Basic dXNlcjo=","path":"/files","query":"path=a%2Fb"}`
	for name, c := range map[string]struct {
		host string
		hdr  []string
	}{
		"headers":  {hostOf(), []string{"E2b-Sandbox-Id", id, "E2b-Sandbox-Port", strconv.Itoa(port)}},
		"sandbox.": {"sandbox.e2b.test", []string{"E2b-Sandbox-Id", id, "E2b-Sandbox-Port", strconv.Itoa(port)}},
		"host":     {strconv.Itoa(port) + "-" + id + ".e2b.test:443", nil},
	} {
		hdr := append(c.hdr, "Authorization", "Basic dXNlcjo=", "X-API-Key", key)
		code, body := edgeCall(t, srv, c.host, "/files?path=a%2Fb", hdr...)
		if code != 200 || strings.TrimSpace(body) != want {
			t.Errorf("%s: %d %s, want 200 %s", name, code, body, want)
		}
	}

	// Gone sandbox, closed port, bad headers.
	code, body := edgeCall(t, srv, "49983-nosuchsandbox.e2b.test", "/health")
	if code != 502 || strings.TrimSpace(body) != `{"code":502,"message":"The sandbox was not found","sandboxId":"nosuchsandbox"}` {
		t.Errorf("unknown sandbox: %d %s", code, body)
	}
	l, _ := net.Listen("tcp", "127.0.0.1:0")
	closed := l.Addr().(*net.TCPAddr).Port
	l.Close()
	code, body = edgeCall(t, srv, hostOf(), "/health", "E2b-Sandbox-Id", id, "E2b-Sandbox-Port", strconv.Itoa(closed))
	wantClosed := `{"code":502,"message":"The sandbox is running but port is not open","port":` + strconv.Itoa(closed) + `,"sandboxId":"` + id + `"}`
	if code != 502 || strings.TrimSpace(body) != wantClosed {
		t.Errorf("closed port: %d %s, want %s", code, body, wantClosed)
	}
	for _, hdr := range [][]string{{"E2b-Sandbox-Id", id}, {"E2b-Sandbox-Id", "Bad-ID", "E2b-Sandbox-Port", "80"}, {"E2b-Sandbox-Id", id, "E2b-Sandbox-Port", "x"}} {
		if code, body := edgeCall(t, srv, hostOf(), "/health", hdr...); code != 400 || !strings.Contains(body, `"code":400`) {
			t.Errorf("%v: %d %s, want 400", hdr, code, body)
		}
	}
	if code, _, _ := call(t, srv, "DELETE", "/v1/sandboxes/"+id, ""); code != 204 {
		t.Fatalf("delete: %d", code)
	}
	if code, body := edgeCall(t, srv, strconv.Itoa(port)+"-"+id+".e2b.test", "/"); code != 502 || !strings.Contains(body, "The sandbox was not found") {
		t.Errorf("deleted sandbox: %d %s", code, body)
	}
	// Requests without the edge's headers or hosts are the API's.
	if code, m, _ := call(t, srv, "GET", "/v1/sandboxes", ""); code != 200 || m == nil {
		t.Errorf("API beside the edge: %d", code)
	}
	if code, _ := edgeCall(t, srv, "api.e2b.test", "/health"); code != 200 {
		t.Errorf("api.<domain> is the API: %d", code)
	}
}

package testutil

import (
	"io"
	"net/http"
	"strings"
	"testing"
)

// EgressPolicy sends method (GET, POST or PATCH) with JSON body to the
// /policy resource of the egress API at base (host:port and any path
// prefix, e.g. a server's /sandboxes/{id}/proxy/18080 endpoint), with
// headers (the endpoint's, e.g. the egress token; nil: none), and
// returns the status code and the response body.
func EgressPolicy(t testing.TB, method, base string, headers map[string]string, body string) (int, string) {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), method, "http://"+base+"/policy", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	for k, v := range headers {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	out, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(out)
}

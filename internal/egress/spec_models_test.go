package egress

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/moat-sandbox/moat/internal/egress/policy"
	"github.com/moat-sandbox/moat/internal/gen/egressapi"
	"github.com/moat-sandbox/moat/internal/gen/wirecheck"
)

// TestHandlerMatchesSpecModels holds the /policy bodies to the models
// generated from api/openapi/egress.yaml.
func TestHandlerMatchesSpecModels(t *testing.T) {
	wirecheck.Request[policy.NetworkPolicy, egressapi.NetworkPolicy](t, "NetworkPolicy")
	wirecheck.Request[policy.Rule, egressapi.NetworkRule](t, "NetworkRule")

	srv := httptest.NewServer(NewHandler(&fakeService{p: policy.AllowAll()}, "sb1", HandlerOptions{}))
	defer srv.Close()
	for _, tc := range []struct{ method, body string }{
		{"GET", ""},
		{"POST", ""},
		{"PUT", `{"defaultAction":"deny","egress":[{"action":"allow","target":"pypi.org"},{"target":"10.0.0.0/8"}]}`},
		{"PATCH", `[{"action":"allow","target":"*.example.com"}]`},
		{"DELETE", `["pypi.org"]`},
		{"POST", `{"defaultAction":"allow"}`},
		{"GET", ""},
	} {
		req, _ := http.NewRequest(tc.method, srv.URL+"/policy", strings.NewReader(tc.body))
		resp, err := srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		raw, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("%s /policy %s: %d %s", tc.method, tc.body, resp.StatusCode, raw)
		}
		wirecheck.Response[egressapi.PolicyStatusResponse](t, tc.method+" /policy "+tc.body, json.RawMessage(raw))
	}
}

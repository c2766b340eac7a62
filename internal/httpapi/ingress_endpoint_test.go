package httpapi_test

import (
	"context"
	"encoding/base64"
	"fmt"
	"io"
	"log/slog"
	"net/http/httptest"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/moat-sandbox/moat/internal/httpapi"
	"github.com/moat-sandbox/moat/internal/ingress"
	"github.com/moat-sandbox/moat/internal/lifecycle"
	"github.com/moat-sandbox/moat/internal/runtime/fake"
	"github.com/moat-sandbox/moat/internal/sandbox"
	"github.com/moat-sandbox/moat/internal/store"
)

// newIngressAPI is newAPI with the ingress gateway's endpoint shapes.
func newIngressAPI(t *testing.T, e *ingress.Endpoints) *httptest.Server {
	t.Helper()
	db, err := store.Open(context.Background(), filepath.Join(t.TempDir(), "s.db"), time.Second)
	if err != nil {
		t.Fatal(err)
	}
	rt := fake.New(fake.Hooks{})
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	svc, err := sandbox.New(sandbox.Config{Config: lifecycle.Config{SecureAccess: true}}, sandbox.Deps{Deps: lifecycle.Deps{Store: db, Runtime: rt, Images: images{}, Log: log}})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(httpapi.New(httpapi.Config{APIKey: key, Ingress: e}, svc, log).Handler())
	t.Cleanup(func() { srv.Close(); svc.Close(); rt.Close(); db.Close() })
	return srv
}

func createSecure(t *testing.T, srv *httptest.Server) string {
	t.Helper()
	code, m, _ := call(t, srv, "POST", "/v1/sandboxes", `{"image":{"uri":"busybox"},"entrypoint":["sh"],"secureAccess":true,"timeout":120}`)
	if code != 202 {
		t.Fatalf("create: %d %v", code, m)
	}
	return m["id"].(string)
}

func headersOf(m map[string]any) map[string]string {
	out := map[string]string{}
	h, _ := m["headers"].(map[string]any)
	for k, v := range h {
		out[k] = v.(string)
	}
	return out
}

func TestIngressEndpoints(t *testing.T) {
	signer, err := ingress.NewSigner("k="+base64.StdEncoding.EncodeToString([]byte("endpoint-test-secret")), "")
	if err != nil {
		t.Fatal(err)
	}
	for _, mode := range []string{ingress.RouteWildcard, ingress.RouteURI, ingress.RouteHeader} {
		t.Run(mode, func(t *testing.T) {
			addr := "gw.example.test:28888"
			if mode == ingress.RouteWildcard {
				addr = "*.sandbox.example.test:28888"
			}
			srv := newIngressAPI(t, &ingress.Endpoints{Mode: mode, Address: addr, Signer: signer})
			id := createSecure(t, srv)

			code, m, _ := call(t, srv, "GET", "/v1/sandboxes/"+id+"/endpoints/8080", "")
			if code != 200 {
				t.Fatalf("endpoint: %d %v", code, m)
			}
			hdr := headersOf(m)
			want := map[string]string{
				ingress.RouteWildcard: id + "-8080.sandbox.example.test:28888",
				ingress.RouteURI:      "gw.example.test:28888/" + id + "/8080",
				ingress.RouteHeader:   "gw.example.test:28888",
			}[mode]
			if m["endpoint"] != want {
				t.Fatalf("endpoint %q, want %q", m["endpoint"], want)
			}
			if hdr[ingress.HeaderSecureAccess] == "" {
				t.Fatalf("secureAccess sandbox endpoint without its token: %v", hdr)
			}
			if got := hdr[ingress.HeaderIngressTo]; (mode == ingress.RouteHeader) != (got == id+"-8080") {
				t.Fatalf("%s header = %q", ingress.HeaderIngressTo, got)
			}

			// The agent port keeps its token through the gateway.
			_, m, _ = call(t, srv, "GET", "/v1/sandboxes/"+id+"/endpoints/44772", "")
			if h := headersOf(m); h["X-EXECD-ACCESS-TOKEN"] == "" || !strings.Contains(m["endpoint"].(string), "gw.example.test") && mode != ingress.RouteWildcard {
				t.Fatalf("agent endpoint %v", m)
			}

			// Signed: the route carries a token that verifies; no access token.
			exp := time.Now().Add(10 * time.Minute).Unix()
			code, m, _ = call(t, srv, "GET", fmt.Sprintf("/v1/sandboxes/%s/endpoints/8080?expires=%d", id, exp), "")
			if code != 200 {
				t.Fatalf("signed endpoint: %d %v", code, m)
			}
			hdr = headersOf(m)
			if _, ok := hdr[ingress.HeaderSecureAccess]; ok {
				t.Fatalf("signed endpoint carries the access token: %v", hdr)
			}
			ep := m["endpoint"].(string)
			var token string
			switch mode {
			case ingress.RouteWildcard:
				token, _, _ = strings.Cut(ep, ".")
			case ingress.RouteURI:
				rest := strings.TrimPrefix(ep, "gw.example.test:28888/")
				token = strings.ReplaceAll(rest, "/", "-")
			case ingress.RouteHeader:
				token = hdr[ingress.HeaderIngressTo]
			}
			b36 := strconv.FormatInt(exp, 36)
			prefix := id + "-8080-" + b36 + "-"
			if !strings.HasPrefix(token, prefix) {
				t.Fatalf("signed route %q (endpoint %q), want prefix %q", token, ep, prefix)
			}
			if err := signer.Verify(id, 8080, b36, strings.TrimPrefix(token, prefix)); err != nil {
				t.Fatalf("signature does not verify: %v", err)
			}

			// Bad expiries, and the server proxy still wins over the gateway.
			for _, q := range []string{"expires=1", "expires=-5", "expires=soon", fmt.Sprintf("expires=%d&use_server_proxy=true", exp)} {
				if code, m, _ := call(t, srv, "GET", "/v1/sandboxes/"+id+"/endpoints/8080?"+q, ""); code != 400 || m["code"] != "SANDBOX::INVALID_PARAMETER" {
					t.Fatalf("%s: %d %v", q, code, m)
				}
			}
			_, m, _ = call(t, srv, "GET", "/v1/sandboxes/"+id+"/endpoints/8080?use_server_proxy=true", "")
			if m["endpoint"] != strings.TrimPrefix(srv.URL, "http://")+"/sandboxes/"+id+"/proxy/8080" {
				t.Fatalf("proxy endpoint %v", m)
			}
			if code, _, _ := call(t, srv, "GET", "/v1/sandboxes/nope/endpoints/8080?expires="+strconv.FormatInt(exp, 10), ""); code != 404 {
				t.Fatalf("signed endpoint of a missing sandbox: %d", code)
			}
		})
	}
}

func TestIngressEndpointsDefaultsAndUnsigned(t *testing.T) {
	// No Address: the API request's host with the gateway port. No signer:
	// signed endpoints are unsupported.
	srv := newIngressAPI(t, &ingress.Endpoints{Mode: ingress.RouteURI, Port: "28888"})
	id := createSecure(t, srv)
	host, _, _ := strings.Cut(strings.TrimPrefix(srv.URL, "http://"), ":")
	_, m, _ := call(t, srv, "GET", "/v1/sandboxes/"+id+"/endpoints/8080", "")
	if m["endpoint"] != host+":28888/"+id+"/8080" {
		t.Fatalf("endpoint %v", m)
	}
	exp := strconv.FormatInt(time.Now().Add(time.Hour).Unix(), 10)
	if code, m, _ := call(t, srv, "GET", "/v1/sandboxes/"+id+"/endpoints/8080?expires="+exp, ""); code != 501 || m["code"] != "SANDBOX::API_NOT_SUPPORTED" {
		t.Fatalf("signed without keys: %d %v", code, m)
	}
}

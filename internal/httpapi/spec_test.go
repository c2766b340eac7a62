package httpapi_test

import (
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"

	"github.com/moat-sandbox/moat/internal/httpapi"
)

// specDir is the spec-first contract directory, relative to this package.
const specDir = "../../api/openapi"

// openAPIDoc is the part of an OpenAPI document the tests read.
type openAPIDoc struct {
	Servers []struct {
		URL string `yaml:"url"`
	} `yaml:"servers"`
	Paths map[string]map[string]any `yaml:"paths"`
}

// specOp is one served operation of the spec.
type specOp struct {
	method string // upper case
	path   string // template, e.g. /sandboxes/{sandboxId}
}

func loadSpec(t *testing.T, name string) (openAPIDoc, map[string]any) {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(specDir, name))
	if err != nil {
		t.Fatalf("read spec: %v", err)
	}
	var doc openAPIDoc
	if err := yaml.Unmarshal(raw, &doc); err != nil {
		t.Fatalf("parse %s: %v", name, err)
	}
	var tree map[string]any
	if err := yaml.Unmarshal(raw, &tree); err != nil {
		t.Fatalf("parse %s: %v", name, err)
	}
	return doc, tree
}

// servedOps lists the operations of doc that are not marked x-moat-planned.
func servedOps(t *testing.T, doc openAPIDoc) (served []specOp, planned int) {
	t.Helper()
	// The OpenAPI path-item keys that name operations.
	methods := []string{"get", "put", "post", "delete", "options", "head", "patch", "trace"}
	for p, item := range doc.Paths {
		for _, m := range methods {
			op, ok := item[m]
			if !ok {
				continue
			}
			opMap, ok := op.(map[string]any)
			if !ok {
				t.Fatalf("%s %s: operation is not an object", m, p)
			}
			if v, _ := opMap["x-moat-planned"].(bool); v {
				planned++
				continue
			}
			served = append(served, specOp{method: strings.ToUpper(m), path: p})
		}
	}
	sort.Slice(served, func(i, j int) bool {
		if served[i].path != served[j].path {
			return served[i].path < served[j].path
		}
		return served[i].method < served[j].method
	})
	return served, planned
}

// mountPrefixes returns the URL path of every server entry ("" for root).
func mountPrefixes(t *testing.T, doc openAPIDoc) []string {
	t.Helper()
	var out []string
	for _, s := range doc.Servers {
		u, err := url.Parse(s.URL)
		if err != nil {
			t.Fatalf("server url %q: %v", s.URL, err)
		}
		out = append(out, strings.TrimSuffix(u.Path, "/"))
	}
	if len(out) == 0 {
		t.Fatal("spec has no servers")
	}
	return out
}

// concretePath fills the template's parameters with placeholders.
func concretePath(tmpl string) string {
	return regexp.MustCompile(`\{[^}]+\}`).ReplaceAllStringFunc(tmpl, func(m string) string {
		switch m {
		case "{port}":
			return "44772"
		case "{path}":
			return "a/b"
		default:
			return "spec-test-id"
		}
	})
}

// unrouted reports whether a response is the server's catch-all for a
// request that matched no route (404 "no route for ...", or 405).
func unrouted(rec *httptest.ResponseRecorder) (bool, string) {
	var body struct {
		Code    string `json:"code"`
		Message string `json:"message"`
	}
	_ = json.Unmarshal(rec.Body.Bytes(), &body)
	switch {
	case rec.Code == http.StatusNotFound && body.Code == "SANDBOX::NOT_FOUND" && strings.HasPrefix(body.Message, "no route for "):
		return true, body.Message
	case rec.Code == http.StatusMethodNotAllowed:
		return true, fmt.Sprintf("405 %s: %s", body.Code, body.Message)
	}
	return false, ""
}

func newHandler() http.Handler {
	// The lifecycle service is nil: handlers that reach it panic, and the
	// Recover middleware turns that into a 500, which still proves routing.
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	return httpapi.New(httpapi.Config{}, nil, log).Handler()
}

func serve(h http.Handler, method, target string) *httptest.ResponseRecorder {
	req := httptest.NewRequest(method, target, strings.NewReader("{}"))
	req.Header.Set("Content-Type", "application/json")
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	return rec
}

// TestSpecRoutesServed checks that every operation in lifecycle.yaml that is
// not marked x-moat-planned is routed by the server, under every mount
// prefix listed in the spec's servers.
func TestSpecRoutesServed(t *testing.T) {
	doc, _ := loadSpec(t, "lifecycle.yaml")
	ops, planned := servedOps(t, doc)
	if len(ops) < 10 {
		t.Fatalf("spec lists only %d served operations; parsing is broken", len(ops))
	}
	t.Logf("%d served operations, %d planned", len(ops), planned)
	h := newHandler()
	for _, prefix := range mountPrefixes(t, doc) {
		for _, op := range ops {
			target := prefix + concretePath(op.path)
			t.Run(op.method+" "+target, func(t *testing.T) {
				rec := serve(h, op.method, target)
				if miss, why := unrouted(rec); miss {
					t.Errorf("%s %s (spec %s) is not routed: %s", op.method, target, op.path, why)
				}
			})
		}
	}
}

// TestSpecRouteDetector proves the detector used above can fail: unknown
// paths and wrong methods are reported as unrouted.
func TestSpecRouteDetector(t *testing.T) {
	h := newHandler()
	for i, tc := range []struct {
		method, target string
		wantUnrouted   bool
	}{
		{"GET", "/v1/not-a-route", true},
		{"GET", "/sandboxes/x/pause", true},
		{"PUT", "/v1/sandboxes", true},
		{"GET", "/health", false},
		{"GET", "/v1/health", false},
	} {
		t.Run(strconv.Itoa(i), func(t *testing.T) {
			rec := serve(h, tc.method, tc.target)
			if got, _ := unrouted(rec); got != tc.wantUnrouted {
				t.Errorf("%s %s: unrouted = %v, want %v (status %d, body %s)", tc.method, tc.target, got, tc.wantUnrouted, rec.Code, rec.Body)
			}
		})
	}
}

// TestSpecRefsResolve checks that every local $ref in every spec points at
// an existing node.
func TestSpecRefsResolve(t *testing.T) {
	files, err := filepath.Glob(filepath.Join(specDir, "*.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no specs in %s (err %v)", specDir, err)
	}
	for _, f := range files {
		name := filepath.Base(f)
		t.Run(name, func(t *testing.T) {
			_, tree := loadSpec(t, name)
			if v, _ := tree["openapi"].(string); !strings.HasPrefix(v, "3.1") {
				t.Errorf("openapi = %q, want 3.1.x", v)
			}
			refs := 0
			walk(tree, func(ref string) {
				refs++
				if !strings.HasPrefix(ref, "#/") {
					t.Errorf("non-local $ref %q", ref)
					return
				}
				if !resolves(tree, ref) {
					t.Errorf("$ref %q does not resolve", ref)
				}
			})
			if refs == 0 {
				t.Error("spec has no $ref at all; schemas are expected in components")
			}
		})
	}
}

func walk(n any, visit func(ref string)) {
	switch v := n.(type) {
	case map[string]any:
		for k, c := range v {
			if s, ok := c.(string); ok && k == "$ref" {
				visit(s)
				continue
			}
			walk(c, visit)
		}
	case []any:
		for _, c := range v {
			walk(c, visit)
		}
	}
}

func resolves(root map[string]any, ref string) bool {
	var cur any = root
	for _, seg := range strings.Split(strings.TrimPrefix(ref, "#/"), "/") {
		seg = strings.ReplaceAll(strings.ReplaceAll(seg, "~1", "/"), "~0", "~")
		m, ok := cur.(map[string]any)
		if !ok {
			return false
		}
		if cur, ok = m[seg]; !ok {
			return false
		}
	}
	return true
}

package httpapi

import (
	"net/http/httptest"
	"testing"
)

func TestAuditedRoutes(t *testing.T) {
	for i, tc := range []struct {
		method, path string
		want         bool
	}{
		{"POST", "/v1/sandboxes", true},
		{"GET", "/v1/sandboxes", false},
		{"DELETE", "/sandboxes/sb1", true},
		{"PATCH", "/sandboxes/sb1/egress/policy", true},
		{"POST", "/v1/sandboxes/sb1/proxy/18080/credential-vault", true},
		{"PATCH", "/sandboxes/sb1/proxy/18080/credential-vault", true},
		{"GET", "/sandboxes/sb1/proxy/18080/credential-vault", false},
		{"POST", "/sandboxes/sb1/proxy/8080/upload", false},
		{"POST", "/sandboxes/sb1/proxy/180800/x", false},
		{"POST", "/sandboxes/sb1/proxy/44772/command", false},
	} {
		if got := audited(httptest.NewRequest(tc.method, tc.path, nil)); got != tc.want {
			t.Errorf("%d: %s %s audited=%v, want %v", i, tc.method, tc.path, got, tc.want)
		}
	}
}

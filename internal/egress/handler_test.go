package egress

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/moat-sandbox/moat/internal/egress/policy"
	"github.com/moat-sandbox/moat/internal/errdefs"
)

// fakeService is an in-memory PolicyService; applyErr simulates a failing
// installation.
type fakeService struct {
	p        policy.NetworkPolicy
	applyErr error
}

func (f *fakeService) Get(id string) (policy.NetworkPolicy, error) {
	if id != "sb1" {
		return policy.NetworkPolicy{}, errdefs.ErrNotFound
	}
	return f.p.Clone(), nil
}

func (f *fakeService) Modify(_ context.Context, id string, fn func(policy.NetworkPolicy) (policy.NetworkPolicy, error)) (policy.NetworkPolicy, error) {
	cur, err := f.Get(id)
	if err != nil {
		return cur, err
	}
	next, err := fn(cur)
	if err != nil {
		return policy.NetworkPolicy{}, err
	}
	if next, err = policy.Normalize(next); err != nil {
		return policy.NetworkPolicy{}, err
	}
	if f.applyErr != nil {
		return policy.NetworkPolicy{}, f.applyErr
	}
	f.p = next
	return next, nil
}

func TestHandler(t *testing.T) {
	svc := &fakeService{p: policy.AllowAll()}
	srv := httptest.NewServer(NewHandler(svc, "sb1", HandlerOptions{Token: "s3cret"}))
	defer srv.Close()

	do := func(method, path, token, body string) (int, string, string) {
		t.Helper()
		req, err := http.NewRequest(method, srv.URL+path, strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		if token != "" {
			req.Header.Set(AuthHeader, token)
		}
		resp, err := srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, resp.Header.Get("Content-Type"), string(b)
	}
	status := func(body string) PolicyStatusResponse {
		t.Helper()
		var s PolicyStatusResponse
		if err := json.Unmarshal([]byte(body), &s); err != nil {
			t.Fatalf("decode %q: %v", body, err)
		}
		return s
	}

	tests := []struct {
		name       string
		method     string
		path       string
		token      string
		body       string
		wantCode   int
		wantBody   string // substring
		wantMode   string
		wantTarget []string // resulting rule targets, in order
	}{
		{name: "1 no token", method: "GET", path: "/policy", wantCode: 401, wantBody: "unauthorized"},
		{name: "2 wrong token", method: "GET", path: "/policy", token: "s3cre", wantCode: 401, wantBody: "unauthorized"},
		{name: "3 get allow_all", method: "GET", path: "/policy", token: "s3cret", wantCode: 200, wantMode: policy.ModeAllowAll, wantTarget: []string{}},
		{name: "4 post", method: "POST", path: "/policy", token: "s3cret", wantCode: 200, wantMode: policy.ModeEnforcing,
			body:       `{"defaultAction":"deny","egress":[{"action":"allow","target":"PyPI.org"},{"action":"allow","target":"10.0.0.0/8"}]}`,
			wantTarget: []string{"pypi.org", "10.0.0.0/8"}},
		{name: "5 patch", method: "PATCH", path: "/policy", token: "s3cret", wantCode: 200, wantMode: policy.ModeEnforcing,
			body:       `[{"action":"deny","target":"10.0.0.0/8"},{"action":"allow","target":"*.github.com"}]`,
			wantTarget: []string{"10.0.0.0/8", "*.github.com", "pypi.org"}},
		{name: "6 delete", method: "DELETE", path: "/policy", token: "s3cret", wantCode: 200, body: `["pypi.org","nope.com"]`,
			wantMode: policy.ModeEnforcing, wantTarget: []string{"10.0.0.0/8", "*.github.com"}},
		{name: "7 invalid post keeps policy", method: "PUT", path: "/policy", token: "s3cret", wantCode: 400,
			body: `{"egress":[{"action":"allow","target":"a.*.com"}]}`, wantBody: "invalid policy: egress[0]: target \"a.*.com\""},
		{name: "8 empty patch", method: "PATCH", path: "/policy", token: "s3cret", body: `[]`, wantCode: 400, wantBody: "invalid policy"},
		{name: "9 empty delete", method: "DELETE", path: "/policy", token: "s3cret", body: ``, wantCode: 400, wantBody: "invalid policy"},
		{name: "10 get after failures", method: "GET", path: "/policy", token: "s3cret", wantCode: 200, wantMode: policy.ModeEnforcing,
			wantTarget: []string{"10.0.0.0/8", "*.github.com"}},
		{name: "11 empty post is deny-all", method: "POST", path: "/policy", token: "s3cret", wantCode: 200,
			wantMode: policy.ModeDenyAll, wantTarget: []string{}, wantBody: "policy reset to default deny-all"},
		{name: "12 healthz without token", method: "GET", path: "/healthz", wantCode: 200, wantBody: "ok"},
		{name: "13 method not allowed", method: "OPTIONS", path: "/policy", token: "s3cret", wantCode: 405},
		{name: "14 too large", method: "POST", path: "/policy", token: "s3cret", wantCode: 413,
			body: `{"egress":[` + strings.Repeat(`{"action":"allow","target":"a.com"},`, 40000) + `]}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, ctype, body := do(tt.method, tt.path, tt.token, tt.body)
			if code != tt.wantCode {
				t.Fatalf("status %d, want %d (body %q)", code, tt.wantCode, body)
			}
			if tt.wantBody != "" && !strings.Contains(body, tt.wantBody) {
				t.Errorf("body %q does not contain %q", body, tt.wantBody)
			}
			if code != 200 && code != 0 && !strings.HasPrefix(ctype, "text/plain") {
				t.Errorf("error content type %q, want text/plain", ctype)
			}
			if tt.wantMode == "" {
				return
			}
			s := status(body)
			if s.Status != "ok" || s.Mode != tt.wantMode || s.EnforcementMode != EnforcementMode || s.Policy == nil {
				t.Fatalf("status = %+v", s)
			}
			var targets []string
			for _, r := range s.Policy.Egress {
				targets = append(targets, r.Target)
			}
			if fmt.Sprint(targets) != fmt.Sprint(tt.wantTarget) || s.Policy.Egress == nil {
				t.Errorf("targets = %v, want %v", targets, tt.wantTarget)
			}
		})
	}

	// Installation failures are 500 without internal detail; unknown
	// sandboxes are 404.
	svc.applyErr = errors.New("netlink: secret internal detail")
	if code, _, body := do("POST", "/policy", "s3cret", `{"defaultAction":"allow"}`); code != 500 || strings.Contains(body, "secret") {
		t.Errorf("apply failure: %d %q", code, body)
	}
	other := httptest.NewServer(NewHandler(svc, "missing", HandlerOptions{}))
	defer other.Close()
	resp, err := other.Client().Get(other.URL + "/policy")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 404 {
		t.Errorf("unknown sandbox: %d", resp.StatusCode)
	}
}

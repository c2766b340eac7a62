package client

import (
	"context"
	"errors"
	"net"
	"net/http"
	"strconv"
	"sync/atomic"
	"testing"
	"time"
)

func TestTypedErrors(t *testing.T) {
	for i, tc := range []struct {
		status      int
		contentType string
		body        string
		code, msg   string
		is          error
		check       func(error) bool
	}{
		{404, "application/json", `{"code":"SANDBOX::NOT_FOUND","message":"sandbox \"x\" not found"}`, "SANDBOX::NOT_FOUND", `sandbox "x" not found`, ErrNotFound, IsNotFound},
		{409, "application/json", `{"code":"SANDBOX::INVALID_STATE","message":"not running"}`, "SANDBOX::INVALID_STATE", "not running", ErrConflict, IsConflict},
		{400, "application/json", `{"code":"SANDBOX::INVALID_PARAMETER","message":"bad"}`, "SANDBOX::INVALID_PARAMETER", "bad", ErrInvalid, IsInvalid},
		{401, "application/json", `{"code":"INVALID_API_KEY","message":"invalid API key"}`, "INVALID_API_KEY", "invalid API key", ErrUnauthorized, IsUnauthorized},
		// The agent's 401 shape.
		{401, "application/json", `{"error":"Unauthorized: invalid or missing header X-EXECD-ACCESS-TOKEN"}`, "", "Unauthorized: invalid or missing header X-EXECD-ACCESS-TOKEN", ErrUnauthorized, IsUnauthorized},
		// Egress errors are plain text.
		{400, "text/plain", "invalid policy: bad target\n", "", "invalid policy: bad target", ErrInvalid, IsInvalid},
		{501, "application/json", `{"code":"SANDBOX::API_NOT_SUPPORTED","message":"no"}`, "SANDBOX::API_NOT_SUPPORTED", "no", ErrNotImplemented, nil},
		{500, "", "", "", "Internal Server Error", nil, nil},
	} {
		f := newFake(t)
		f.handle("GET /v1/sandboxes/{id}", func(w http.ResponseWriter, r *http.Request) {
			if tc.contentType != "" {
				w.Header().Set("Content-Type", tc.contentType)
			}
			w.WriteHeader(tc.status)
			_, _ = w.Write([]byte(tc.body))
		})
		c := mustClient(t, f.srv.URL)
		_, err := c.GetSandbox(context.Background(), "x")
		var ae *APIError
		if !errors.As(err, &ae) {
			t.Fatalf("%d: %T %v is not an *APIError", i, err, err)
		}
		if ae.StatusCode != tc.status || ae.Code != tc.code || ae.Message != tc.msg || ae.RequestID != "req-1" {
			t.Errorf("%d: got %+v", i, ae)
		}
		for _, s := range []error{ErrNotFound, ErrConflict, ErrInvalid, ErrUnauthorized, ErrNotImplemented} {
			if got := errors.Is(err, s); got != (s == tc.is) {
				t.Errorf("%d: errors.Is(%v) = %v", i, s, got)
			}
		}
		if tc.check != nil && !tc.check(err) {
			t.Errorf("%d: helper returned false", i)
		}
	}
}

// counting serves a handler and counts the attempts.
func counting(n *atomic.Int32, fail int, status int, ok string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if int(n.Add(1)) <= fail {
			w.Header().Set("Retry-After", "0")
			writeJSON(w, status, map[string]string{"code": "X", "message": "busy"})
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(ok))
	}
}

func TestRetries(t *testing.T) {
	ctx := context.Background()
	for i, tc := range []struct {
		status, fail, max int
		wantAttempts      int32
		wantErr           bool
	}{
		{503, 2, 3, 3, false},
		{502, 1, 3, 2, false},
		{504, 1, 3, 2, false},
		{429, 1, 3, 2, false},
		{503, 5, 2, 3, true}, // exhausted: 1 + 2 retries
		{404, 5, 3, 1, true}, // not retryable
		{500, 5, 3, 1, true}, // not retryable
		{503, 5, 0, 1, true}, // retries off
	} {
		f := newFake(t)
		var n atomic.Int32
		f.handle("GET /v1/sandboxes/{id}", counting(&n, tc.fail, tc.status, sandboxJSON))
		c := mustClient(t, f.srv.URL, WithRetry(tc.max, time.Millisecond))
		_, err := c.GetSandbox(ctx, "sb1")
		if (err != nil) != tc.wantErr || n.Load() != tc.wantAttempts {
			t.Errorf("%d: err %v attempts %d, want err=%v attempts %d", i, err, n.Load(), tc.wantErr, tc.wantAttempts)
		}
		if tc.wantErr {
			var ae *APIError
			if !errors.As(err, &ae) || ae.StatusCode != tc.status {
				t.Errorf("%d: last error %v", i, err)
			}
		}
	}
}

func TestNoRetryOnCreate(t *testing.T) {
	f := newFake(t)
	var creates, pauses atomic.Int32
	f.handle("POST /v1/sandboxes", counting(&creates, 5, 503, "{}"))
	f.handle("POST /v1/sandboxes/{id}/pause", counting(&pauses, 5, 503, ""))
	c := mustClient(t, f.srv.URL, WithRetry(3, time.Millisecond))
	if _, err := c.CreateSandbox(context.Background(), CreateRequest{}); err == nil || creates.Load() != 1 {
		t.Fatalf("create: err %v attempts %d", err, creates.Load())
	}
	if err := c.Pause(context.Background(), "sb1"); err == nil || pauses.Load() != 1 {
		t.Fatalf("pause: err %v attempts %d", err, pauses.Load())
	}
}

func TestRetryIdempotentPost(t *testing.T) {
	// Renew sets an absolute time, so it is retried although it is a POST.
	f := newFake(t)
	var n atomic.Int32
	f.handle("POST /v1/sandboxes/{id}/renew-expiration", counting(&n, 1, 503, `{"expiresAt":"2026-05-01T00:00:00Z"}`))
	c := mustClient(t, f.srv.URL, WithRetry(2, time.Millisecond))
	if _, err := c.Renew(context.Background(), "sb1", time.Now().Add(time.Hour)); err != nil || n.Load() != 2 {
		t.Fatalf("renew: err %v attempts %d", err, n.Load())
	}
	if len(f.requests("/v1/sandboxes/sb1/renew-expiration")[1].Body) == 0 {
		t.Fatal("retried request had no body")
	}
}

// dropServer accepts loopback connections and closes the first drop of
// them without answering; later ones get a canned HTTP response.
func dropServer(t *testing.T, drop int32, resp string) (string, *atomic.Int32) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var n atomic.Int32
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			buf := make([]byte, 4096)
			_, _ = conn.Read(buf)
			if n.Add(1) <= drop {
				conn.Close()
				continue
			}
			_, _ = conn.Write([]byte(resp))
			conn.Close()
		}
	}()
	t.Cleanup(func() { ln.Close(); <-done })
	return "http://" + ln.Addr().String(), &n
}

func TestRetryConnectionErrors(t *testing.T) {
	resp := "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\nContent-Length: " +
		strconv.Itoa(len(sandboxJSON)) + "\r\n\r\n" + sandboxJSON
	u, n := dropServer(t, 2, resp)
	c := mustClient(t, u, WithRetry(3, time.Millisecond))
	sb, err := c.GetSandbox(context.Background(), "sb1")
	if err != nil || sb.ID != "sb1" || n.Load() != 3 {
		t.Fatalf("get: %+v %v attempts %d", sb, err, n.Load())
	}

	u, n = dropServer(t, 5, resp)
	c = mustClient(t, u, WithRetry(3, time.Millisecond))
	if _, err := c.CreateSandbox(context.Background(), CreateRequest{}); err == nil || n.Load() != 1 {
		t.Fatalf("create: err %v attempts %d", err, n.Load())
	}
}

func TestRetryStopsOnContextCancel(t *testing.T) {
	f := newFake(t)
	var n atomic.Int32
	f.handle("GET /v1/sandboxes/{id}", counting(&n, 100, 503, sandboxJSON))
	c := mustClient(t, f.srv.URL, WithRetry(100, time.Hour))
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	_, err := c.GetSandbox(ctx, "sb1")
	if !errors.Is(err, context.DeadlineExceeded) || n.Load() != 1 {
		t.Fatalf("err %v attempts %d", err, n.Load())
	}
}

func TestRetryWait(t *testing.T) {
	p := retryPolicy{max: 100, backoff: 10 * time.Second}
	for i, tc := range []struct {
		n    int
		want time.Duration
	}{{1, 10 * time.Second}, {2, 20 * time.Second}, {3, 40 * time.Second}, {4, 40 * time.Second}, {90, 40 * time.Second}} {
		if got := p.wait(tc.n); got != tc.want {
			t.Errorf("%d: wait(%d) = %v, want %v", i, tc.n, got, tc.want)
		}
	}
	if got := (retryPolicy{}).wait(5); got != 0 {
		t.Errorf("zero backoff waits %v", got)
	}
}

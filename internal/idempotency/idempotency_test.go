package idempotency_test

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/moat-sandbox/moat/internal/idempotency"
	"github.com/moat-sandbox/moat/internal/store"
	"github.com/moat-sandbox/moat/internal/web"
)

// server wraps a handler that makes a new id per call (and answers
// status) with keys kept in db.
type server struct {
	calls  atomic.Int32
	status int
	keys   *idempotency.Keys
	h      http.Handler
}

func newServer(db store.Store, now func() time.Time) *server {
	s := &server{status: http.StatusAccepted}
	s.keys = idempotency.New(db, now, time.Hour, nil)
	a := &web.Adapter{}
	inner := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.ReadAll(r.Body)
		n := s.calls.Add(1)
		w.Header().Set("Location", fmt.Sprintf("/v1/sandboxes/sb%d", n))
		web.WriteJSON(w, s.status, map[string]string{"id": fmt.Sprintf("sb%d", n)})
	})
	s.h = s.keys.Wrap(inner, func(r *http.Request) string { return r.Header.Get("Tenant") }, a.WriteError)
	return s
}

func (s *server) do(t *testing.T, key, tenant, path, body string) (int, http.Header, map[string]string) {
	t.Helper()
	r := httptest.NewRequest("POST", path, strings.NewReader(body))
	if key != "" {
		r.Header.Set(idempotency.Header, key)
	}
	r.Header.Set("Tenant", tenant)
	w := httptest.NewRecorder()
	s.h.ServeHTTP(w, r)
	var out map[string]string
	json.Unmarshal(w.Body.Bytes(), &out)
	return w.Code, w.Header(), out
}

func TestRetryReplaysTheFirstAnswer(t *testing.T) {
	db := store.NewMemory()
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	clock := func() time.Time { return now }
	s := newServer(db, clock)
	code, _, first := s.do(t, "k1", "acme", "/v1/sandboxes", `{"a":1}`)
	if code != 202 || first["id"] != "sb1" {
		t.Fatalf("first: %d %v", code, first)
	}
	code, h, again := s.do(t, "k1", "acme", "/sandboxes", `{"a":1}`)
	if code != 202 || again["id"] != "sb1" || h.Get("Location") != "/v1/sandboxes/sb1" || h.Get(idempotency.ReplayedHeader) != "true" {
		t.Fatalf("retry (other mount): %d %v %v", code, again, h)
	}
	if n := s.calls.Load(); n != 1 {
		t.Fatalf("handler ran %d times", n)
	}
	// Another tenant's same key is another key.
	if _, _, other := s.do(t, "k1", "beta", "/v1/sandboxes", `{"a":1}`); other["id"] != "sb2" {
		t.Fatalf("beta's k1: %v", other)
	}
	// No key: no idempotency.
	if _, _, plain := s.do(t, "", "acme", "/v1/sandboxes", `{"a":1}`); plain["id"] != "sb3" {
		t.Fatalf("no key: %v", plain)
	}
	// A restarted server (new Keys, same store) replays it too.
	s2 := newServer(db, clock)
	if code, _, re := s2.do(t, "k1", "acme", "/v1/sandboxes", `{"a":1}`); code != 202 || re["id"] != "sb1" || s2.calls.Load() != 0 {
		t.Fatalf("after restart: %d %v (calls %d)", code, re, s2.calls.Load())
	}
	// Past the TTL the key is free again.
	now = now.Add(2 * time.Hour)
	if _, _, late := s2.do(t, "k1", "acme", "/v1/sandboxes", `{"a":1}`); late["id"] != "sb1" || s2.calls.Load() != 1 {
		t.Fatalf("after the TTL: %v (calls %d)", late, s2.calls.Load())
	}
}

func TestKeyReusedForAnotherRequest(t *testing.T) {
	s := newServer(store.NewMemory(), nil)
	s.do(t, "k", "acme", "/v1/sandboxes", `{"a":1}`)
	for _, tc := range []struct{ path, body string }{
		{"/v1/sandboxes", `{"a":2}`},
		{"/v1/sandboxes/batch", `{"a":1}`},
	} {
		code, _, body := s.do(t, "k", "acme", tc.path, tc.body)
		if code != 409 || body["code"] != idempotency.CodeReused || body["message"] == "" {
			t.Errorf("%s %s: %d %v", tc.path, tc.body, code, body)
		}
	}
	if n := s.calls.Load(); n != 1 {
		t.Fatalf("handler ran %d times", n)
	}
}

func TestFailedAnswersAreNotKept(t *testing.T) {
	s := newServer(store.NewMemory(), nil)
	s.status = http.StatusConflict
	s.do(t, "k", "acme", "/v1/sandboxes", `{}`)
	s.status = http.StatusAccepted
	if code, _, body := s.do(t, "k", "acme", "/v1/sandboxes", `{}`); code != 202 || body["id"] != "sb2" {
		t.Fatalf("retry after a 409: %d %v", code, body)
	}
}

func TestBadKey(t *testing.T) {
	s := newServer(store.NewMemory(), nil)
	for _, k := range []string{strings.Repeat("x", 256), "tab\there", "é"} {
		if code, _, body := s.do(t, k, "acme", "/v1/sandboxes", `{}`); code != 400 || body["code"] != idempotency.CodeInvalid {
			t.Errorf("key %q: %d %v", k, code, body)
		}
	}
	if s.calls.Load() != 0 {
		t.Fatal("a bad key ran the handler")
	}
}

// A request the server was running when it stopped is never run again
// under its key.
func TestInterruptedRequest(t *testing.T) {
	db := store.NewMemory()
	s := newServer(db, nil)
	block := make(chan struct{})
	started := make(chan struct{})
	s.h = s.keys.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		close(started)
		<-block
		w.WriteHeader(202)
	}), func(*http.Request) string { return "acme" }, (&web.Adapter{}).WriteError)
	done := make(chan struct{})
	go func() {
		defer close(done)
		s.do(t, "k", "acme", "/v1/sandboxes", `{}`)
	}()
	<-started
	// Meanwhile, the same key is busy.
	if code, _, body := s.do(t, "k", "acme", "/v1/sandboxes", `{}`); code != 409 || body["code"] != idempotency.CodeInProgress {
		t.Errorf("concurrent retry: %d %v", code, body)
	}
	// A new server on the same store while the first still holds the
	// claim (as after a crash: the claim stays pending).
	s2 := newServer(db, nil)
	if code, _, body := s2.do(t, "k", "acme", "/v1/sandboxes", `{}`); code != 409 || body["code"] != idempotency.CodeInterrupted || s2.calls.Load() != 0 {
		t.Errorf("retry after a restart: %d %v", code, body)
	}
	close(block)
	<-done
}

package httpapi_test

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/moat-sandbox/moat/internal/httpapi"
	"github.com/moat-sandbox/moat/internal/lifecycle"
	"github.com/moat-sandbox/moat/internal/lifecycle/idle"
	"github.com/moat-sandbox/moat/internal/runtime/fake"
	"github.com/moat-sandbox/moat/internal/sandbox"
	"github.com/moat-sandbox/moat/internal/store"
)

// heldResume is the fake runtime with a Resume that can be held.
type heldResume struct {
	*fake.Runtime
	resumes atomic.Int32
	entered chan struct{}
	mu      sync.Mutex
	gate    chan struct{}
}

func (r *heldResume) Resume(ctx context.Context, id string) error {
	r.resumes.Add(1)
	select {
	case r.entered <- struct{}{}:
	default:
	}
	r.mu.Lock()
	gate := r.gate
	r.mu.Unlock()
	if gate != nil {
		<-gate
	}
	return r.Runtime.Resume(ctx, id)
}

func (r *heldResume) hold() func() {
	gate := make(chan struct{})
	r.mu.Lock()
	r.gate = gate
	r.mu.Unlock()
	var once sync.Once
	return func() { once.Do(func() { close(gate) }) }
}

type idleAPI struct {
	srv *httptest.Server
	svc *sandbox.Service
	rt  *heldResume
	mu  sync.Mutex
	now time.Time
}

func (a *idleAPI) clock() time.Time { a.mu.Lock(); defer a.mu.Unlock(); return a.now }

func (a *idleAPI) advance(d time.Duration) {
	a.mu.Lock()
	a.now = a.now.Add(d)
	a.mu.Unlock()
}

func newIdleAPI(t *testing.T, cfg idle.Config) *idleAPI {
	t.Helper()
	db, err := store.Open(context.Background(), filepath.Join(t.TempDir(), "s.db"), time.Second)
	if err != nil {
		t.Fatal(err)
	}
	a := &idleAPI{rt: &heldResume{Runtime: fake.New(fake.Hooks{}), entered: make(chan struct{}, 1)}, now: time.Now().UTC()}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	a.svc, err = sandbox.New(sandbox.Config{Idle: cfg},
		sandbox.Deps{Deps: lifecycle.Deps{Store: db, Runtime: a.rt, Images: images{}, Log: log, Now: a.clock}})
	if err != nil {
		t.Fatal(err)
	}
	a.srv = httptest.NewServer(httpapi.New(httpapi.Config{APIKey: key}, a.svc, log).Handler())
	t.Cleanup(func() { a.srv.Close(); a.svc.Close(); a.rt.Close(); db.Close() })
	return a
}

// idlePaused creates a sandbox with a 60 s idle timeout through the API
// and lets it run out.
func (a *idleAPI) idlePaused(t *testing.T) string {
	t.Helper()
	code, m, _ := call(t, a.srv, "POST", "/v1/sandboxes",
		`{"image":{"uri":"busybox"},"entrypoint":["tail","-f","/dev/null"],"timeout":3600,"extensions":{"moat.idle.timeout":"60"}}`)
	if code != 202 && code != 200 {
		t.Fatalf("create: %d %v", code, m)
	}
	id := m["id"].(string)
	a.svc.Sweep(context.Background())
	a.advance(61 * time.Second)
	a.svc.Sweep(context.Background())
	if st := a.state(t, id); st != "Paused" {
		t.Fatalf("after the idle timeout: %s", st)
	}
	return id
}

func (a *idleAPI) state(t *testing.T, id string) string {
	t.Helper()
	_, m, _ := call(t, a.srv, "GET", "/v1/sandboxes/"+id, "")
	st, _ := m["status"].(map[string]any)
	s, _ := st["state"].(string)
	return s
}

// A request through the server proxy to an idle-paused sandbox is held
// while it resumes, then answered.
func TestProxyWakesIdleSandbox(t *testing.T) {
	a := newIdleAPI(t, idle.Config{})
	id := a.idlePaused(t)
	release := a.rt.hold()
	defer release()
	codes := make(chan int, 1)
	go func() {
		req, _ := http.NewRequest("GET", a.srv.URL+"/sandboxes/"+id+"/proxy/44772/ping", nil)
		req.Header.Set("OPEN-SANDBOX-API-KEY", key)
		resp, err := a.srv.Client().Do(req)
		if err != nil {
			codes <- -1
			return
		}
		resp.Body.Close()
		codes <- resp.StatusCode
	}()
	select {
	case <-a.rt.entered:
	case <-time.After(30 * time.Second):
		t.Fatal("the proxied request did not resume the sandbox")
	}
	select {
	case c := <-codes:
		t.Fatalf("answered %d before the resume finished", c)
	case <-time.After(50 * time.Millisecond):
	}
	release()
	select {
	case c := <-codes:
		if c != 200 {
			t.Fatalf("proxied ping after the wake: %d", c)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the proxied request was not answered after the wake")
	}
	if st := a.state(t, id); st != "Running" {
		t.Fatalf("after the wake: %s", st)
	}
}

// A wake over the budget answers 503 in the API's error shape, with
// Retry-After.
func TestProxyWakeBudget(t *testing.T) {
	a := newIdleAPI(t, idle.Config{WakeBudget: 50 * time.Millisecond, RetryAfter: 2 * time.Second})
	id := a.idlePaused(t)
	release := a.rt.hold()
	defer release()
	code, m, hdr := call(t, a.srv, "GET", "/sandboxes/"+id+"/proxy/44772/ping", "")
	if code != 503 || m["code"] != "SANDBOX::WAKING" || m["message"] == "" || hdr.Get("Retry-After") != "2" {
		t.Fatalf("over the wake budget: %d %v Retry-After=%q", code, m, hdr.Get("Retry-After"))
	}
	release()
	deadline := time.Now().Add(30 * time.Second)
	for a.state(t, id) != "Running" {
		if time.Now().After(deadline) {
			t.Fatal("the wake did not finish")
		}
		time.Sleep(5 * time.Millisecond)
	}
	if code, _, _ := call(t, a.srv, "GET", "/sandboxes/"+id+"/proxy/44772/ping", ""); code != 200 {
		t.Fatalf("proxied ping after the wake: %d", code)
	}
}

// An endpoint lookup (what an SDK's connect does) wakes the sandbox; a
// GET of the sandbox does not.
func TestEndpointWakesIdleSandbox(t *testing.T) {
	a := newIdleAPI(t, idle.Config{})
	id := a.idlePaused(t)
	if st := a.state(t, id); st != "Paused" {
		t.Fatalf("a GET woke the sandbox: %s", st)
	}
	if code, m, _ := call(t, a.srv, "GET", "/v1/sandboxes/"+id+"/endpoints/44772", ""); code != 200 {
		t.Fatalf("endpoint: %d %v", code, m)
	}
	if st := a.state(t, id); st != "Running" {
		t.Fatalf("after the endpoint lookup: %s", st)
	}
}

// A bad idle policy is refused at create in the API's error shape.
func TestCreateBadIdlePolicy(t *testing.T) {
	a := newIdleAPI(t, idle.Config{})
	code, m, _ := call(t, a.srv, "POST", "/v1/sandboxes",
		`{"image":{"uri":"busybox"},"entrypoint":["tail","-f","/dev/null"],"extensions":{"moat.idle.timeout":"-1"}}`)
	if code != 400 || m["code"] != "SANDBOX::INVALID_PARAMETER" {
		t.Fatalf("bad idle timeout: %d %v", code, m)
	}
	code, m, _ = call(t, a.srv, "POST", "/v1/sandboxes",
		`{"image":{"uri":"busybox"},"entrypoint":["tail","-f","/dev/null"],"extensions":{"moat.idle.timeout":"60","moat.idle.action":"hibernate"}}`)
	if code != 501 || m["code"] != "SANDBOX::API_NOT_SUPPORTED" {
		t.Fatalf("hibernate: %d %v", code, m)
	}
}

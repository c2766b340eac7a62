package idle_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/moat-sandbox/moat/internal/errdefs"
	"github.com/moat-sandbox/moat/internal/image"
	"github.com/moat-sandbox/moat/internal/lifecycle"
	"github.com/moat-sandbox/moat/internal/lifecycle/idle"
	"github.com/moat-sandbox/moat/internal/lifecycle/pool"
	"github.com/moat-sandbox/moat/internal/runtime"
	"github.com/moat-sandbox/moat/internal/runtime/fake"
	"github.com/moat-sandbox/moat/internal/sandbox"
	"github.com/moat-sandbox/moat/internal/store"
	"github.com/moat-sandbox/moat/internal/tenant"
)

type images struct{}

func (images) Ensure(ctx context.Context, ref string, auth *image.Auth) (image.Image, error) {
	return image.Image{Name: ref, ID: "sha256:00"}, nil
}

type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *clock) Add(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// gated is the fake runtime whose Resume is counted and can be held
// (hold) or made to fail (fail).
type gated struct {
	*fake.Runtime
	resumes atomic.Int32
	entered chan struct{}

	mu   sync.Mutex
	gate chan struct{} // non-nil: Resume waits until it is closed
	fail error
}

func (r *gated) Resume(ctx context.Context, id string) error {
	r.resumes.Add(1)
	select {
	case r.entered <- struct{}{}:
	default:
	}
	r.mu.Lock()
	gate, fail := r.gate, r.fail
	r.mu.Unlock()
	if gate != nil {
		<-gate
	}
	if fail != nil {
		return fail
	}
	return r.Runtime.Resume(ctx, id)
}

// hold makes Resume wait until the returned function is called.
func (r *gated) hold() (release func()) {
	gate := make(chan struct{})
	r.mu.Lock()
	r.gate = gate
	r.mu.Unlock()
	var once sync.Once
	return func() {
		once.Do(func() {
			r.mu.Lock()
			r.gate = nil
			r.mu.Unlock()
			close(gate)
		})
	}
}

// metrics records the feature's observations.
type metrics struct {
	mu     sync.Mutex
	pauses []string
	wakes  []string
}

func (m *metrics) ObserveIdlePause(action string) {
	m.mu.Lock()
	m.pauses = append(m.pauses, action)
	m.mu.Unlock()
}

func (m *metrics) ObserveWake(outcome string, d time.Duration) {
	m.mu.Lock()
	m.wakes = append(m.wakes, outcome)
	m.mu.Unlock()
}

func (m *metrics) ObserveCreate(time.Duration)       {}
func (m *metrics) ObservePoolClaim(hits, misses int) {}

func (m *metrics) get() (pauses, wakes []string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return append([]string(nil), m.pauses...), append([]string(nil), m.wakes...)
}

type harness struct {
	svc *sandbox.Service
	rt  *gated
	clk *clock
	m   *metrics
	db  *store.DB
	cfg idle.Config
}

func newHarness(t *testing.T, cfg idle.Config) *harness {
	t.Helper()
	db, err := store.Open(context.Background(), filepath.Join(t.TempDir(), "state.db"), time.Second)
	if err != nil {
		t.Fatal(err)
	}
	h := &harness{rt: &gated{Runtime: fake.New(fake.Hooks{}), entered: make(chan struct{}, 1)},
		clk: &clock{t: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}, m: &metrics{}, db: db, cfg: cfg}
	t.Cleanup(func() { h.rt.Close(); db.Close() })
	h.svc = h.newService(t)
	return h
}

func (h *harness) newService(t *testing.T) *sandbox.Service {
	t.Helper()
	return h.newServiceOn(t, h.rt)
}

// newServiceOn is newService with runtime rt (h.rt or a wrapper of it).
func (h *harness) newServiceOn(t *testing.T, rt runtime.Runtime) *sandbox.Service {
	t.Helper()
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	svc, err := sandbox.New(sandbox.Config{Config: lifecycle.Config{MaxTimeout: 24 * time.Hour}, Idle: h.cfg},
		sandbox.Deps{Deps: lifecycle.Deps{Store: h.db, Runtime: rt, Images: images{}, Now: h.clk.Now, Log: log, Metrics: h.m}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(svc.Close)
	return svc
}

func createReq(ext map[string]string) lifecycle.CreateRequest {
	return lifecycle.CreateRequest{Image: "busybox", Entrypoint: []string{"sleep", "1000"}, Timeout: time.Hour, Extensions: ext}
}

func (h *harness) create(t *testing.T, ext map[string]string) string {
	t.Helper()
	sb, err := h.svc.Create(context.Background(), createReq(ext))
	if err != nil {
		t.Fatal(err)
	}
	return sb.ID
}

func (h *harness) status(t *testing.T, id string) lifecycle.Status {
	t.Helper()
	sb, err := h.svc.Get(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	return sb.Status
}

// idlePause creates a sandbox with a 60 s idle timeout and lets it run out.
func (h *harness) idlePause(t *testing.T) string {
	t.Helper()
	id := h.create(t, map[string]string{idle.ExtTimeout: "60"})
	h.clk.Add(61 * time.Second)
	h.svc.Sweep(context.Background())
	if st := h.status(t, id); st.State != lifecycle.StatePaused || st.Reason != lifecycle.ReasonIdlePaused {
		t.Fatalf("after the idle timeout: %+v, want Paused %s", st, lifecycle.ReasonIdlePaused)
	}
	return id
}

// access is one complete request to sandbox id.
func (h *harness) access(t *testing.T, id, via string) {
	t.Helper()
	done, err := h.svc.Access(context.Background(), id, via)
	if err != nil {
		t.Fatal(err)
	}
	done()
}

func (h *harness) event(t *testing.T, id, typ string) (lifecycle.Event, bool) {
	t.Helper()
	evs, _, err := h.svc.Events(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range evs {
		if e.Type == typ {
			return e, true
		}
	}
	return lifecycle.Event{}, false
}

func TestPolicyOf(t *testing.T) {
	for i, c := range []struct {
		ext  map[string]string
		want idle.Policy
		err  string
	}{
		{nil, idle.Policy{}, ""},
		{map[string]string{"other": "x"}, idle.Policy{}, ""},
		{map[string]string{idle.ExtTimeout: "2"}, idle.Policy{Timeout: 2 * time.Second, Action: idle.ActionPause}, ""},
		{map[string]string{idle.ExtTimeout: "300", idle.ExtAction: "hibernate"}, idle.Policy{Timeout: 300 * time.Second, Action: idle.ActionHibernate}, ""},
		{map[string]string{idle.ExtTimeout: "0"}, idle.Policy{}, "between 1 and 604800"},
		{map[string]string{idle.ExtTimeout: "1.5"}, idle.Policy{}, "between 1 and 604800"},
		{map[string]string{idle.ExtTimeout: "604801"}, idle.Policy{}, "between 1 and 604800"},
		{map[string]string{idle.ExtTimeout: "10", idle.ExtAction: "sleep"}, idle.Policy{}, `"sleep" is not pause or hibernate`},
		{map[string]string{idle.ExtAction: "pause"}, idle.Policy{}, "needs extensions[moat.idle.timeout]"},
	} {
		got, err := idle.PolicyOf(c.ext)
		if c.err != "" {
			if err == nil || !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), c.err) {
				t.Errorf("%d: err %v, want invalid %q", i, err, c.err)
			}
			continue
		}
		if err != nil || got != c.want {
			t.Errorf("%d: %+v %v, want %+v", i, got, err, c.want)
		}
	}
}

// A create with a bad or unsupported idle policy is refused in the
// API's terms, before anything is made.
func TestCreateChecksPolicy(t *testing.T) {
	h := newHarness(t, idle.Config{})
	ctx := context.Background()
	_, err := h.svc.Create(ctx, createReq(map[string]string{idle.ExtTimeout: "soon"}))
	if p, ok := errdefs.PublicOf(err); !ok || !errdefs.IsInvalidArgument(err) || p.Code != "SANDBOX::INVALID_PARAMETER" {
		t.Fatalf("bad timeout: %v", err)
	}
	_, err = h.svc.Create(ctx, createReq(map[string]string{idle.ExtTimeout: "60", idle.ExtAction: idle.ActionHibernate}))
	if p, ok := errdefs.PublicOf(err); !ok || !errdefs.IsNotImplemented(err) || !strings.Contains(p.Message, "cannot hibernate") {
		t.Fatalf("hibernate: %v", err)
	}
	if sbs, _ := h.svc.List(ctx, lifecycle.ListFilter{}, 1, 100); len(sbs) != 0 {
		t.Fatalf("refused creates left %d sandboxes", len(sbs))
	}
}

// noPause is a runtime that cannot freeze sandboxes.
type noPause struct{ runtime.Runtime }

func TestCheckPolicyNeedsPauser(t *testing.T) {
	db, err := store.Open(context.Background(), filepath.Join(t.TempDir(), "state.db"), time.Second)
	if err != nil {
		t.Fatal(err)
	}
	rt := fake.New(fake.Hooks{})
	t.Cleanup(func() { rt.Close(); db.Close() })
	svc, err := sandbox.New(sandbox.Config{}, sandbox.Deps{Deps: lifecycle.Deps{Store: db, Runtime: noPause{rt}, Images: images{},
		Log: slog.New(slog.NewTextHandler(io.Discard, nil))}})
	if err != nil {
		t.Fatal(err)
	}
	defer svc.Close()
	_, err = svc.Create(context.Background(), createReq(map[string]string{idle.ExtTimeout: "60"}))
	if p, ok := errdefs.PublicOf(err); !ok || !errdefs.IsNotImplemented(err) || !strings.Contains(p.Message, "cannot pause") {
		t.Fatalf("idle policy on a runtime without pause: %v", err)
	}
}

// The idle timeout counts from the last activity: a sandbox that keeps
// being reached stays Running, one left alone is paused, with an event
// and a metric that say why; a sandbox without a policy is never paused.
func TestSweepPausesAfterTimeout(t *testing.T) {
	h := newHarness(t, idle.Config{})
	ctx := context.Background()
	id := h.create(t, map[string]string{idle.ExtTimeout: "60"})
	plain := h.create(t, nil)
	for range 5 {
		h.clk.Add(40 * time.Second)
		h.access(t, id, idle.ViaProxy)
		h.svc.Sweep(ctx)
		if st := h.status(t, id); st.State != lifecycle.StateRunning {
			t.Fatalf("active sandbox: %+v", st)
		}
	}
	h.clk.Add(59 * time.Second)
	h.svc.Sweep(ctx)
	if st := h.status(t, id); st.State != lifecycle.StateRunning {
		t.Fatalf("59 s after the last access: %+v", st)
	}
	h.clk.Add(2 * time.Second)
	h.svc.Sweep(ctx)
	st := h.status(t, id)
	if st.State != lifecycle.StatePaused || st.Reason != lifecycle.ReasonIdlePaused || !strings.Contains(st.Message, "idle timeout 60s") {
		t.Fatalf("61 s after the last access: %+v", st)
	}
	if ev, ok := h.event(t, id, lifecycle.EventIdlePaused); !ok || ev.Reason != lifecycle.ReasonIdlePaused || !strings.Contains(ev.Message, "no activity for 61s") {
		t.Fatalf("IdlePaused event: %+v %v", ev, ok)
	}
	if _, ok := h.event(t, id, lifecycle.EventPaused); ok {
		t.Fatal("an idle pause also recorded a plain Paused event")
	}
	if st := h.status(t, plain); st.State != lifecycle.StateRunning {
		t.Fatalf("sandbox without a policy: %+v", st)
	}
	if pauses, _ := h.m.get(); len(pauses) != 1 || pauses[0] != idle.ActionPause {
		t.Fatalf("pause metrics: %v", pauses)
	}
	// Expiry still applies to a paused sandbox (paused time counts).
	h.clk.Add(time.Hour)
	h.svc.ReapOnce(ctx)
	if _, err := h.svc.Get(ctx, id); !errdefs.IsNotFound(err) {
		t.Fatalf("expired idle-paused sandbox: %v", err)
	}
}

// Access to an idle-paused sandbox resumes it before it returns, and the
// wake is recorded; a sandbox paused through the API is left paused.
func TestAccessWakes(t *testing.T) {
	h := newHarness(t, idle.Config{})
	ctx := context.Background()
	id := h.idlePause(t)
	h.access(t, id, idle.ViaIngress)
	if st := h.status(t, id); st.State != lifecycle.StateRunning || st.Reason != lifecycle.ReasonRunning {
		t.Fatalf("after the wake: %+v", st)
	}
	if ev, ok := h.event(t, id, lifecycle.EventWoken); !ok || ev.Reason != lifecycle.ReasonWaking || ev.Message != "woken by "+idle.ViaIngress {
		t.Fatalf("Woken event: %+v %v", ev, ok)
	}
	if _, ok := h.event(t, id, lifecycle.EventResumed); ok {
		t.Fatal("a wake also recorded a plain Resumed event")
	}
	if _, wakes := h.m.get(); len(wakes) != 1 || wakes[0] != idle.WakeOK {
		t.Fatalf("wake metrics: %v", wakes)
	}
	// The wake counts as activity: the next sweep leaves it running.
	h.svc.Sweep(ctx)
	if st := h.status(t, id); st.State != lifecycle.StateRunning {
		t.Fatalf("swept right after the wake: %+v", st)
	}

	if err := h.svc.Pause(ctx, id); err != nil {
		t.Fatal(err)
	}
	h.access(t, id, idle.ViaProxy)
	if st := h.status(t, id); st.State != lifecycle.StatePaused || st.Reason != lifecycle.ReasonPaused {
		t.Fatalf("a sandbox paused through the API after an access: %+v", st)
	}
	if n := h.rt.resumes.Load(); n != 1 {
		t.Fatalf("%d resumes, want 1", n)
	}
	// A sandbox that does not exist is no error here (the caller's own
	// lookup answers) and leaves no trace.
	h.access(t, "nope", idle.ViaProxy)
}

// Many requests reaching an idle-paused sandbox at once cause one resume,
// and all of them proceed once it is done.
func TestConcurrentAccessResumesOnce(t *testing.T) {
	h := newHarness(t, idle.Config{})
	id := h.idlePause(t)
	release := h.rt.hold()
	defer release()
	const n = 100
	errs := make(chan error, n)
	for range n {
		go func() {
			done, err := h.svc.Access(context.Background(), id, idle.ViaProxy)
			done()
			errs <- err
		}()
	}
	select {
	case <-h.rt.entered:
	case <-time.After(30 * time.Second):
		t.Fatal("no resume started")
	}
	select {
	case err := <-errs:
		t.Fatalf("a request proceeded before the resume finished: %v", err)
	case <-time.After(50 * time.Millisecond):
	}
	release()
	for range n {
		select {
		case err := <-errs:
			if err != nil {
				t.Fatal(err)
			}
		case <-time.After(30 * time.Second):
			t.Fatal("a request still waits after the wake")
		}
	}
	if got := h.rt.resumes.Load(); got != 1 {
		t.Fatalf("%d resumes for %d requests, want 1", got, n)
	}
	if st := h.status(t, id); st.State != lifecycle.StateRunning {
		t.Fatalf("after the wake: %+v", st)
	}
}

// A wake that does not finish within the budget answers 503 with a
// Retry-After; the wake goes on, and a later request finds it Running.
func TestWakeBudget(t *testing.T) {
	h := newHarness(t, idle.Config{WakeBudget: 50 * time.Millisecond, RetryAfter: 3 * time.Second})
	id := h.idlePause(t)
	release := h.rt.hold()
	defer release()
	_, err := h.svc.Access(context.Background(), id, idle.ViaProxy)
	p, ok := errdefs.PublicOf(err)
	if !ok || !errors.Is(err, errdefs.ErrUnavailable) || p.Code != "SANDBOX::WAKING" || !strings.Contains(p.Message, "retry") {
		t.Fatalf("over the budget: %v", err)
	}
	if d, ok := errdefs.RetryAfterOf(err); !ok || d != 3*time.Second {
		t.Fatalf("Retry-After: %v %v", d, ok)
	}
	release()
	waitState(t, h, id, lifecycle.StateRunning)
	h.access(t, id, idle.ViaProxy)
	if got := h.rt.resumes.Load(); got != 1 {
		t.Fatalf("%d resumes, want 1", got)
	}
	if _, wakes := h.m.get(); fmt.Sprint(wakes) != "[timeout ok]" {
		t.Fatalf("wake metrics: %v", wakes)
	}
}

// A resume the runtime refuses leaves the sandbox idle-paused and answers
// 503; the next request tries again.
func TestWakeFailure(t *testing.T) {
	h := newHarness(t, idle.Config{})
	id := h.idlePause(t)
	h.rt.mu.Lock()
	h.rt.fail = fmt.Errorf("thaw: %w", errdefs.ErrInternal)
	h.rt.mu.Unlock()
	_, err := h.svc.Access(context.Background(), id, idle.ViaProxy)
	if p, ok := errdefs.PublicOf(err); !ok || !errors.Is(err, errdefs.ErrUnavailable) || p.Code != "SANDBOX::WAKE_FAILED" {
		t.Fatalf("failed wake: %v", err)
	}
	if _, ok := errdefs.RetryAfterOf(err); !ok {
		t.Fatal("failed wake without Retry-After")
	}
	if st := h.status(t, id); st.State != lifecycle.StatePaused || st.Reason != lifecycle.ReasonIdlePaused {
		t.Fatalf("after a failed wake: %+v", st)
	}
	h.rt.mu.Lock()
	h.rt.fail = nil
	h.rt.mu.Unlock()
	h.access(t, id, idle.ViaProxy)
	if st := h.status(t, id); st.State != lifecycle.StateRunning {
		t.Fatalf("after the retry: %+v", st)
	}
}

// A request under way keeps its sandbox from being idle however long it
// lasts; the idle time counts from its end.
func TestInflightRequestIsActivity(t *testing.T) {
	h := newHarness(t, idle.Config{})
	ctx := context.Background()
	id := h.create(t, map[string]string{idle.ExtTimeout: "60"})
	h.svc.Sweep(ctx)
	done, err := h.svc.Access(ctx, id, idle.ViaProxy)
	if err != nil {
		t.Fatal(err)
	}
	h.clk.Add(10 * time.Minute)
	h.svc.Sweep(ctx)
	if st := h.status(t, id); st.State != lifecycle.StateRunning {
		t.Fatalf("with a request under way: %+v", st)
	}
	done()
	done() // twice is once
	h.clk.Add(59 * time.Second)
	h.svc.Sweep(ctx)
	if st := h.status(t, id); st.State != lifecycle.StateRunning {
		t.Fatalf("59 s after the request ended: %+v", st)
	}
	h.clk.Add(2 * time.Second)
	h.svc.Sweep(ctx)
	if st := h.status(t, id); st.State != lifecycle.StatePaused {
		t.Fatalf("61 s after the request ended: %+v", st)
	}
}

// A request scoped to another tenant neither wakes a sandbox nor counts
// as its activity.
func TestAccessOfAnotherTenant(t *testing.T) {
	h := newHarness(t, idle.Config{})
	id := h.idlePause(t)
	other := tenant.WithPrincipal(context.Background(), tenant.Principal{KeyID: "k", Tenant: "other"})
	done, err := h.svc.Access(other, id, idle.ViaProxy)
	if err != nil {
		t.Fatal(err)
	}
	done()
	if st := h.status(t, id); st.State != lifecycle.StatePaused || h.rt.resumes.Load() != 0 {
		t.Fatalf("after another tenant's request: %+v, %d resumes", st, h.rt.resumes.Load())
	}
}

// Every request waiting for a slow wake is answered within the budget,
// with one resume between them.
func TestWakeBudgetManyWaiters(t *testing.T) {
	h := newHarness(t, idle.Config{WakeBudget: 100 * time.Millisecond})
	id := h.idlePause(t)
	release := h.rt.hold()
	defer release()
	const n = 20
	errs := make(chan error, n)
	for range n {
		go func() {
			_, err := h.svc.Access(context.Background(), id, idle.ViaProxy)
			errs <- err
		}()
	}
	for range n {
		select {
		case err := <-errs:
			if p, ok := errdefs.PublicOf(err); !ok || p.Code != "SANDBOX::WAKING" {
				t.Fatalf("waiter: %v", err)
			}
		case <-time.After(30 * time.Second):
			t.Fatal("a waiter was not answered within its budget")
		}
	}
	if got := h.rt.resumes.Load(); got != 1 {
		t.Fatalf("%d resumes, want 1", got)
	}
}

// A pool's template carries the default idle policy of the sandboxes
// claimed from it; a claim may override it. Idle pool sandboxes (not yet
// claimed) are never paused.
func TestPoolDefaultPolicy(t *testing.T) {
	h := newHarness(t, idle.Config{})
	ctx := context.Background()
	_, err := h.svc.CreatePool(ctx, pool.Pool{Name: "warm", Capacity: pool.Capacity{BufferMin: 1, BufferMax: 1, PoolMax: 5},
		Template: pool.PoolTemplate{Image: "busybox", Entrypoint: []string{"sleep", "1000"}, Extensions: map[string]string{idle.ExtTimeout: "60"}}})
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		if _, st, err := h.svc.GetPool(ctx, "warm"); err == nil && st.Available == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the pool was not filled")
		}
		time.Sleep(5 * time.Millisecond)
	}
	byPool, err := h.svc.Create(ctx, lifecycle.CreateRequest{Timeout: time.Hour, Extensions: map[string]string{lifecycle.ExtPoolRef: "warm"}})
	if err != nil {
		t.Fatal(err)
	}
	longer, err := h.svc.Create(ctx, lifecycle.CreateRequest{Timeout: time.Hour,
		Extensions: map[string]string{lifecycle.ExtPoolRef: "warm", idle.ExtTimeout: "600"}})
	if err != nil {
		t.Fatal(err)
	}
	h.clk.Add(61 * time.Second)
	h.svc.Sweep(ctx)
	if st := h.status(t, byPool.ID); st.State != lifecycle.StatePaused || st.Reason != lifecycle.ReasonIdlePaused {
		t.Fatalf("claimed with the pool's policy: %+v", st)
	}
	if st := h.status(t, longer.ID); st.State != lifecycle.StateRunning {
		t.Fatalf("claimed with a longer policy: %+v", st)
	}
	n := 0
	h.svc.Each(func(e *lifecycle.Entry) {
		if sb := e.Sandbox(); sb.Warm && sb.Status.State != lifecycle.StateRunning {
			t.Errorf("idle pool sandbox %s is %s", sb.ID, sb.Status.State)
		}
		n++
	})
	if n < 2 {
		t.Fatalf("%d sandboxes in the table", n)
	}
}

// A sandbox that was idle-paused when the server stopped is re-adopted
// paused and woken by the first request to the new server; the others
// count their idle time from the new server's start.
func TestRecoveredIdlePausedSandboxWakes(t *testing.T) {
	h := newHarness(t, idle.Config{})
	ctx := context.Background()
	id := h.idlePause(t)
	running := h.create(t, map[string]string{idle.ExtTimeout: "60"})
	h.svc.Close()
	h.clk.Add(2 * time.Minute) // the server was down for longer than the timeout
	h.svc = h.newService(t)
	if err := h.svc.Recover(ctx); err != nil {
		t.Fatal(err)
	}
	if st := h.status(t, id); st.State != lifecycle.StatePaused || st.Reason != lifecycle.ReasonIdlePaused {
		t.Fatalf("recovered: %+v", st)
	}
	h.svc.Sweep(ctx)
	if st := h.status(t, running); st.State != lifecycle.StateRunning {
		t.Fatalf("right after the restart, a sandbox not reached for 2 minutes: %+v", st)
	}
	h.access(t, id, idle.ViaProxy)
	if st := h.status(t, id); st.State != lifecycle.StateRunning {
		t.Fatalf("after a request to the new server: %+v", st)
	}
	h.clk.Add(61 * time.Second)
	h.svc.Sweep(ctx)
	if st := h.status(t, running); st.State != lifecycle.StatePaused {
		t.Fatalf("61 s after the restart: %+v", st)
	}
}

// Run sweeps on its own, every Interval.
func TestRunSweeps(t *testing.T) {
	h := newHarness(t, idle.Config{Interval: 10 * time.Millisecond})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); h.svc.Idle.Run(ctx) }()
	defer func() { cancel(); <-done }()
	id := h.create(t, map[string]string{idle.ExtTimeout: "5"})
	h.clk.Add(6 * time.Second)
	waitState(t, h, id, lifecycle.StatePaused)
}

func waitState(t *testing.T, h *harness, id string, want lifecycle.State) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		st := h.status(t, id)
		if st.State == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("sandbox %s is %+v, want %s", id, st, want)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

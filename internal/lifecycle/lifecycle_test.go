package lifecycle

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/moat-sandbox/moat/internal/agentproto"
	"github.com/moat-sandbox/moat/internal/errdefs"
	"github.com/moat-sandbox/moat/internal/image"
	"github.com/moat-sandbox/moat/internal/runtime"
	"github.com/moat-sandbox/moat/internal/runtime/fake"
	"github.com/moat-sandbox/moat/internal/store"
)

type fakeImages struct{ err error }

func (f fakeImages) Ensure(ctx context.Context, ref string, auth *image.Auth) (image.Image, error) {
	if f.err != nil {
		return image.Image{}, f.err
	}
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

type harness struct {
	svc   *Service
	rt    *fake.Runtime
	db    *store.DB
	clk   *clock
	path  string
	hooks *fake.Hooks
}

func newHarness(t *testing.T) *harness {
	t.Helper()
	path := filepath.Join(t.TempDir(), "state.db")
	db, err := store.Open(context.Background(), path, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	h := &harness{db: db, clk: &clock{t: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}, path: path, hooks: &fake.Hooks{}}
	h.rt = fake.New(fake.Hooks{Create: func(s runtime.Spec) error {
		if h.hooks.Create != nil {
			return h.hooks.Create(s)
		}
		return nil
	}})
	t.Cleanup(func() { h.rt.Close(); h.db.Close() })
	h.svc = h.newService(t)
	return h
}

func (h *harness) newService(t *testing.T) *Service {
	svc, err := New(Config{MaxTimeout: 24 * time.Hour}, Deps{Store: h.db, Runtime: h.rt, Images: fakeImages{}, Now: h.clk.Now})
	if err != nil {
		t.Fatal(err)
	}
	return svc
}

func req(timeout time.Duration) CreateRequest {
	return CreateRequest{Image: "busybox", Entrypoint: []string{"sleep", "1000"}, Timeout: timeout,
		Metadata: map[string]string{"team": "a"}}
}

func TestCreateGetDelete(t *testing.T) {
	h := newHarness(t)
	ctx := context.Background()
	sb, err := h.svc.Create(ctx, req(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	if sb.Status.State != StateRunning || sb.ExpiresAt == nil || !sb.ExpiresAt.Equal(h.clk.Now().Add(time.Hour)) {
		t.Fatalf("created %+v", sb)
	}
	if len(sb.ID) != IDLen || strings.Trim(sb.ID, "abcdefghijklmnopqrstuvwxyz0123456789") != "" {
		t.Fatalf("id %q is not %d characters of [a-z0-9]", sb.ID, IDLen)
	}
	// Persisted once Running.
	var rec Sandbox
	if err := h.db.Get(Bucket, sb.ID, &rec); err != nil || rec.Status.State != StateRunning {
		t.Fatalf("record %+v, %v", rec, err)
	}
	got, err := h.svc.Get(ctx, sb.ID)
	if err != nil || got.ID != sb.ID || got.Metadata["team"] != "a" {
		t.Fatalf("get %+v %v", got, err)
	}
	// Mutating a returned copy must not change the service's state.
	got.Metadata["team"] = "mutated"
	if again, _ := h.svc.Get(ctx, sb.ID); again.Metadata["team"] != "a" {
		t.Fatal("Get returned shared state")
	}
	if err := h.svc.Delete(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := h.svc.Get(ctx, sb.ID); !errdefs.IsNotFound(err) {
		t.Fatalf("get after delete: %v", err)
	}
	if err := h.svc.Delete(ctx, sb.ID); !errdefs.IsNotFound(err) {
		t.Fatalf("second delete: %v", err)
	}
	if _, err := h.rt.Status(ctx, sb.ID); !errdefs.IsNotFound(err) {
		t.Fatalf("runtime still has the sandbox: %v", err)
	}
	if err := h.db.Get(Bucket, sb.ID, &rec); !errdefs.IsNotFound(err) {
		t.Fatalf("record left behind: %v", err)
	}
}

func TestValidation(t *testing.T) {
	h := newHarness(t)
	ctx := context.Background()
	cases := []struct {
		name string
		mod  func(*CreateRequest)
		code string
	}{
		{"no image", func(r *CreateRequest) { r.Image = "" }, "SANDBOX::INVALID_PARAMETER"},
		{"image and snapshot", func(r *CreateRequest) { r.SnapshotID = "s" }, "SANDBOX::INVALID_PARAMETER"},
		{"no entrypoint", func(r *CreateRequest) { r.Entrypoint = nil }, "SANDBOX::INVALID_ENTRYPOINT"},
		{"timeout too short", func(r *CreateRequest) { r.Timeout = 59 * time.Second }, "SANDBOX::INVALID_PARAMETER"},
		{"timeout over cap", func(r *CreateRequest) { r.Timeout = 25 * time.Hour }, "SANDBOX::INVALID_PARAMETER"},
		{"bad cpu", func(r *CreateRequest) { r.ResourceLimits = map[string]string{"cpu": "-1"} }, "SANDBOX::INVALID_PARAMETER"},
		{"bad memory", func(r *CreateRequest) { r.ResourceLimits = map[string]string{"memory": "12XB"} }, "SANDBOX::INVALID_PARAMETER"},
		{"tiny memory", func(r *CreateRequest) { r.ResourceLimits = map[string]string{"memory": "1Ki"} }, "SANDBOX::INVALID_PARAMETER"},
		{"gpu", func(r *CreateRequest) { r.ResourceLimits = map[string]string{"gpu": "1"} }, "SANDBOX::INVALID_PARAMETER"},
		{"unknown resource", func(r *CreateRequest) { r.ResourceLimits = map[string]string{"tpu": "1"} }, "SANDBOX::INVALID_PARAMETER"},
		{"reserved label", func(r *CreateRequest) { r.Metadata = map[string]string{"opensandbox.io/id": "x"} }, "SANDBOX::INVALID_METADATA_LABEL"},
		{"bad label value", func(r *CreateRequest) { r.Metadata = map[string]string{"k": "has space"} }, "SANDBOX::INVALID_METADATA_LABEL"},
		{"bad label key", func(r *CreateRequest) { r.Metadata = map[string]string{"-k": "v"} }, "SANDBOX::INVALID_METADATA_LABEL"},
		{"bad env", func(r *CreateRequest) { r.Env = map[string]string{"A=B": "v"} }, "SANDBOX::INVALID_PARAMETER"},
		{"platform", func(r *CreateRequest) { r.Platform = &Platform{OS: "windows", Arch: "amd64"} }, "SANDBOX::INVALID_PARAMETER"},
		{"unknown runtime class", func(r *CreateRequest) { r.Extensions = map[string]string{ExtRuntimeClass: "kata"} }, "SANDBOX::INVALID_PARAMETER"},
		{"renew ext range", func(r *CreateRequest) { r.Extensions = map[string]string{ExtRenewOnAccess: "10"} }, "SANDBOX::INVALID_PARAMETER"},
		{"unknown pool ref", func(r *CreateRequest) { r.Extensions = map[string]string{ExtPoolRef: "p"} }, "SANDBOX::INVALID_POOL_REF"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r := req(time.Hour)
			c.mod(&r)
			_, err := h.svc.Create(ctx, r)
			p, ok := errdefs.PublicOf(err)
			if !ok || p.Code != c.code || !errdefs.IsInvalidArgument(err) {
				t.Fatalf("got %v, want %s", err, c.code)
			}
		})
	}
	if list, total := h.svc.List(ctx, ListFilter{}, 1, 10); total != 0 {
		t.Fatalf("invalid creates left sandboxes: %+v", list)
	}
}

func TestParseResources(t *testing.T) {
	r, err := ParseResources(map[string]string{"cpu": "500m", "memory": "512Mi", "pids": "100", "disk": "1G"})
	if err != nil || r.CPUMillis != 500 || r.MemoryBytes != 512<<20 || r.PidsLimit != 100 || r.DiskBytes != 1e9 {
		t.Fatalf("%+v %v", r, err)
	}
	r, err = ParseResources(map[string]string{"cpu": "1.5", "memory": "2Gi"})
	if err != nil || r.CPUMillis != 1500 || r.MemoryBytes != 2<<30 {
		t.Fatalf("%+v %v", r, err)
	}
}

func TestFailedCreateCleansUp(t *testing.T) {
	h := newHarness(t)
	ctx := context.Background()
	h.hooks.Create = func(runtime.Spec) error { return fmt.Errorf("boom: %w", errdefs.ErrUnavailable) }
	sb, err := h.svc.Create(ctx, req(time.Hour))
	if err == nil || sb.Status.State != StateFailed {
		t.Fatalf("create: %+v %v", sb, err)
	}
	if p, ok := errdefs.PublicOf(err); !ok || p.Code != "SANDBOX::START_FAILED" {
		t.Fatalf("error %v", err)
	}
	// Visible as Failed, not persisted, nothing in the runtime.
	got, err := h.svc.Get(ctx, sb.ID)
	if err != nil || got.Status.State != StateFailed || got.Status.Reason != ReasonProvisionFailed {
		t.Fatalf("get failed sandbox: %+v %v", got, err)
	}
	if l, _ := h.rt.List(ctx); len(l) != 0 {
		t.Fatalf("runtime leftovers: %+v", l)
	}
	// Forgotten after the retention period.
	h.clk.Add(2 * time.Hour)
	h.svc.ReapOnce(ctx)
	if _, err := h.svc.Get(ctx, sb.ID); !errdefs.IsNotFound(err) {
		t.Fatalf("failed sandbox not forgotten: %v", err)
	}

	// Image pull failure is the caller's error.
	h.hooks.Create = nil
	h.svc.deps.Images = fakeImages{err: fmt.Errorf("no such repo: %w", errdefs.ErrNotFound)}
	_, err = h.svc.Create(ctx, req(time.Hour))
	if p, ok := errdefs.PublicOf(err); !ok || p.Code != "SANDBOX::IMAGE_PULL_FAILED" || !errdefs.IsInvalidArgument(err) || errdefs.IsNotFound(err) {
		t.Fatalf("pull error %v", err)
	}
}

func TestPauseResumeStateMachine(t *testing.T) {
	h := newHarness(t)
	ctx := context.Background()
	sb, _ := h.svc.Create(ctx, req(0))
	if sb.ExpiresAt != nil {
		t.Fatal("manual-cleanup sandbox has an expiry")
	}
	if err := h.svc.Resume(ctx, sb.ID); !errdefs.IsFailedPrecondition(err) {
		t.Fatalf("resume running: %v", err)
	}
	if err := h.svc.Pause(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	if got, _ := h.svc.Get(ctx, sb.ID); got.Status.State != StatePaused {
		t.Fatalf("state %s", got.Status.State)
	}
	if st, _ := h.rt.Status(ctx, sb.ID); st.State != runtime.StatePaused {
		t.Fatalf("runtime state %s", st.State)
	}
	if err := h.svc.Pause(ctx, sb.ID); !errdefs.IsFailedPrecondition(err) {
		t.Fatalf("pause paused: %v", err)
	}
	if err := h.svc.Resume(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	if got, _ := h.svc.Get(ctx, sb.ID); got.Status.State != StateRunning {
		t.Fatalf("state %s", got.Status.State)
	}
	if err := h.svc.Pause(ctx, "nope"); !errdefs.IsNotFound(err) {
		t.Fatalf("pause unknown: %v", err)
	}

	// A runtime that fails the call leaves the sandbox in its previous
	// state (here the runtime moved on its own, behind the service's back).
	failed := func(verb string, err error, want State) {
		t.Helper()
		if err == nil || !strings.Contains(err.Error(), verb+" "+sb.ID) {
			t.Fatalf("%s refused by the runtime: %v", verb, err)
		}
		if got, _ := h.svc.Get(ctx, sb.ID); got.Status.State != want {
			t.Fatalf("after a failed %s: state %s, want %s", verb, got.Status.State, want)
		}
	}
	if err := h.rt.Pause(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	failed("pause", h.svc.Pause(ctx, sb.ID), StateRunning)
	if err := h.rt.Resume(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	if err := h.svc.Pause(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	if err := h.rt.Resume(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	failed("resume", h.svc.Resume(ctx, sb.ID), StatePaused)

	// A runtime that cannot pause says so in the API's terms.
	h.svc.deps.Runtime = struct{ runtime.Runtime }{h.rt}
	for verb, call := range map[string]func(context.Context, string) error{"pause": h.svc.Pause, "resume": h.svc.Resume} {
		err := call(ctx, sb.ID)
		if p, ok := errdefs.PublicOf(err); !ok || p.Code != "SANDBOX::API_NOT_SUPPORTED" || !strings.Contains(p.Message, "cannot "+verb) {
			t.Fatalf("%s without a Pauser: %v", verb, err)
		}
	}
}

func TestTransitionsTable(t *testing.T) {
	for _, c := range []struct {
		from, to State
		ok       bool
	}{
		{StatePending, StateRunning, true},
		{StateRunning, StatePausing, true},
		{StatePaused, StateRunning, false},
		{StatePaused, StateResuming, true},
		{StateTerminated, StateRunning, false},
		{StateFailed, StateStopping, true},
		{StateStopping, StateRunning, false},
		{StateRunning, StatePaused, false},
		{StateRunning, StateRunning, true}, // a claim restarts a warm sandbox's status
	} {
		if got := canTransition(c.from, c.to); got != c.ok {
			t.Errorf("%s -> %s: %v, want %v", c.from, c.to, got, c.ok)
		}
	}
	if _, err := ParseState("pAuSeD"); err != nil {
		t.Fatal(err)
	}
	if _, err := ParseState("sleepy"); !errdefs.IsInvalidArgument(err) {
		t.Fatal(err)
	}
}

func TestRenewAndExpiry(t *testing.T) {
	h := newHarness(t)
	ctx := context.Background()
	sb, _ := h.svc.Create(ctx, req(2*time.Minute))
	manual, _ := h.svc.Create(ctx, req(0))
	now := h.clk.Now()
	if _, err := h.svc.Renew(ctx, sb.ID, now.Add(-time.Second)); !errdefs.IsInvalidArgument(err) {
		t.Fatalf("renew to the past: %v", err)
	}
	// Earlier than the current expiry is allowed (a client-side pool shortens
	// a borrowed sandbox's long idle timeout to the borrower's).
	if at, err := h.svc.Renew(ctx, sb.ID, now.Add(time.Minute)); err != nil || !at.Equal(now.Add(time.Minute)) {
		t.Fatalf("renew earlier than current: %v %v", at, err)
	}
	if got, _ := h.svc.Get(ctx, sb.ID); got.ExpiresAt == nil || !got.ExpiresAt.Equal(now.Add(time.Minute)) {
		t.Fatalf("expiry after shortening: %v", got.ExpiresAt)
	}
	if _, err := h.svc.Renew(ctx, sb.ID, now.Add(48*time.Hour)); !errdefs.IsInvalidArgument(err) {
		t.Fatalf("renew beyond max: %v", err)
	}
	if _, err := h.svc.Renew(ctx, manual.ID, now.Add(time.Hour)); !errdefs.IsFailedPrecondition(err) {
		t.Fatalf("renew manual-cleanup: %v", err)
	}
	at, err := h.svc.Renew(ctx, sb.ID, now.Add(10*time.Minute))
	if err != nil || !at.Equal(now.Add(10*time.Minute)) {
		t.Fatalf("renew: %v %v", at, err)
	}
	h.clk.Add(9 * time.Minute)
	h.svc.ReapOnce(ctx)
	if _, err := h.svc.Get(ctx, sb.ID); err != nil {
		t.Fatalf("reaped before expiry: %v", err)
	}
	h.clk.Add(2 * time.Minute)
	h.svc.ReapOnce(ctx)
	if _, err := h.svc.Get(ctx, sb.ID); !errdefs.IsNotFound(err) {
		t.Fatalf("not reaped after expiry: %v", err)
	}
	if _, err := h.rt.Status(ctx, sb.ID); !errdefs.IsNotFound(err) {
		t.Fatal("expired sandbox still in the runtime")
	}
	if _, err := h.svc.Get(ctx, manual.ID); err != nil {
		t.Fatalf("manual-cleanup sandbox reaped: %v", err)
	}
}

// A sandbox renewed to an earlier time than its expiry is reaped at that
// time, and renew-on-access never shortens an expiry.
func TestRenewShortensExpiry(t *testing.T) {
	h := newHarness(t)
	ctx := context.Background()
	r := req(time.Hour)
	r.Extensions = map[string]string{ExtRenewOnAccess: "300"}
	sb, err := h.svc.Create(ctx, r)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := h.svc.Renew(ctx, sb.ID, h.clk.Now().Add(2*time.Minute)); err != nil {
		t.Fatal(err)
	}
	h.svc.Touch(ctx, sb.ID) // +300 s beats +2 min: extends again
	got, _ := h.svc.Get(ctx, sb.ID)
	if !got.ExpiresAt.Equal(h.clk.Now().Add(5 * time.Minute)) {
		t.Fatalf("expiry after access %v", got.ExpiresAt)
	}
	if _, err := h.svc.Renew(ctx, sb.ID, h.clk.Now().Add(time.Minute)); err != nil {
		t.Fatal(err)
	}
	h.clk.Add(2 * time.Minute)
	h.svc.ReapOnce(ctx)
	if _, err := h.svc.Get(ctx, sb.ID); !errdefs.IsNotFound(err) {
		t.Fatalf("not reaped at the shortened expiry: %v", err)
	}
}

func TestTouchRenewsOnAccess(t *testing.T) {
	h := newHarness(t)
	ctx := context.Background()
	r := req(5 * time.Minute)
	r.Extensions = map[string]string{ExtRenewOnAccess: "3600"}
	sb, err := h.svc.Create(ctx, r)
	if err != nil {
		t.Fatal(err)
	}
	h.svc.Touch(ctx, sb.ID)
	got, _ := h.svc.Get(ctx, sb.ID)
	if !got.ExpiresAt.Equal(h.clk.Now().Add(time.Hour)) {
		t.Fatalf("expiry after access %v", got.ExpiresAt)
	}
}

func TestListFilterAndPagination(t *testing.T) {
	h := newHarness(t)
	ctx := context.Background()
	var ids []string
	for i := 0; i < 5; i++ {
		r := req(time.Hour)
		r.Metadata = map[string]string{"n": fmt.Sprint(i), "parity": []string{"even", "odd"}[i%2]}
		sb, err := h.svc.Create(ctx, r)
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, sb.ID)
		h.clk.Add(time.Second)
	}
	h.svc.Pause(ctx, ids[1])
	items, total := h.svc.List(ctx, ListFilter{}, 1, 2)
	if total != 5 || len(items) != 2 || items[0].ID != ids[4] || items[1].ID != ids[3] {
		t.Fatalf("page 1: total %d %+v", total, items)
	}
	items, _ = h.svc.List(ctx, ListFilter{}, 3, 2)
	if len(items) != 1 || items[0].ID != ids[0] {
		t.Fatalf("page 3: %+v", items)
	}
	if items, _ = h.svc.List(ctx, ListFilter{}, 4, 2); len(items) != 0 {
		t.Fatalf("page past end: %+v", items)
	}
	_, total = h.svc.List(ctx, ListFilter{Metadata: map[string]string{"parity": "odd"}}, 1, 10)
	if total != 2 {
		t.Fatalf("metadata filter: %d", total)
	}
	_, total = h.svc.List(ctx, ListFilter{Metadata: map[string]string{"parity": "odd", "n": "3"}}, 1, 10)
	if total != 1 {
		t.Fatalf("metadata AND filter: %d", total)
	}
	items, total = h.svc.List(ctx, ListFilter{States: []State{StatePaused}}, 1, 10)
	if total != 1 || items[0].ID != ids[1] {
		t.Fatalf("state filter: %+v", items)
	}
	_, total = h.svc.List(ctx, ListFilter{States: []State{StatePaused, StateRunning}}, 1, 10)
	if total != 5 {
		t.Fatalf("state OR filter: %d", total)
	}
}

func TestPatchMetadata(t *testing.T) {
	h := newHarness(t)
	ctx := context.Background()
	sb, _ := h.svc.Create(ctx, req(time.Hour))
	v := "b"
	got, err := h.svc.PatchMetadata(ctx, sb.ID, map[string]*string{"team": nil, "new": &v})
	if err != nil || got.Metadata["new"] != "b" || len(got.Metadata) != 1 {
		t.Fatalf("patch %+v %v", got.Metadata, err)
	}
	bad := "no spaces"
	if _, err := h.svc.PatchMetadata(ctx, sb.ID, map[string]*string{"k": &bad}); !errdefs.IsInvalidArgument(err) {
		t.Fatalf("bad value: %v", err)
	}
	var rec Sandbox
	h.db.Get(Bucket, sb.ID, &rec)
	if rec.Metadata["new"] != "b" || rec.Metadata["team"] != "" {
		t.Fatalf("persisted %+v", rec.Metadata)
	}
}

func TestEndpoint(t *testing.T) {
	h := newHarness(t)
	ctx := context.Background()
	sb, _ := h.svc.Create(ctx, req(time.Hour))
	ep, err := h.svc.Endpoint(ctx, sb.ID, agentproto.Port)
	if err != nil || ep.Address == "" || ep.Headers["X-EXECD-ACCESS-TOKEN"] != sb.AgentToken || sb.AgentToken == "" {
		t.Fatalf("agent endpoint %+v %v", ep, err)
	}
	ep, err = h.svc.Endpoint(ctx, sb.ID, 8080)
	if err != nil || ep.Headers != nil {
		t.Fatalf("app endpoint %+v %v", ep, err)
	}
	for _, p := range []int{0, 70000} {
		if _, err := h.svc.Endpoint(ctx, sb.ID, p); !errdefs.IsInvalidArgument(err) {
			t.Fatalf("port %d: %v", p, err)
		}
	}
}

func TestRecover(t *testing.T) {
	h := newHarness(t)
	ctx := context.Background()
	keep, _ := h.svc.Create(ctx, req(time.Hour))
	paused, _ := h.svc.Create(ctx, req(time.Hour))
	h.svc.Pause(ctx, paused.ID)
	expiring, _ := h.svc.Create(ctx, req(2*time.Minute))
	died, _ := h.svc.Create(ctx, req(time.Hour))
	lost, _ := h.svc.Create(ctx, req(time.Hour))
	// A create cut short by a crash: in the runtime, never recorded.
	orphan := runtime.Spec{ID: "orphan-1", Image: "busybox"}
	if _, err := h.rt.Create(ctx, orphan); err != nil {
		t.Fatal(err)
	}
	// The agent of one sandbox exits; another vanishes entirely.
	if err := h.rt.Stop(ctx, died.ID, 0); err != nil {
		t.Fatal(err)
	}
	if err := h.rt.Delete(ctx, lost.ID); err != nil {
		t.Fatal(err)
	}
	h.clk.Add(3 * time.Minute)

	// "Restart": a new service over the same store and runtime state.
	h.rt = h.rt.Reopen(fake.Hooks{})
	svc, err := New(Config{}, Deps{Store: h.db, Runtime: h.rt, Images: fakeImages{}, Now: h.clk.Now})
	if err != nil {
		t.Fatal(err)
	}
	if err := svc.Recover(ctx); err != nil {
		t.Fatal(err)
	}
	check := func(id string, want State) {
		t.Helper()
		got, err := svc.Get(ctx, id)
		if want == "" {
			if !errdefs.IsNotFound(err) {
				t.Fatalf("%s: %+v %v, want gone", id, got.Status, err)
			}
			return
		}
		if err != nil || got.Status.State != want {
			t.Fatalf("%s: %+v %v, want %s", id, got.Status, err, want)
		}
	}
	check(keep.ID, StateRunning)
	check(paused.ID, StatePaused)
	check(expiring.ID, "")
	check(died.ID, StateFailed)
	check(lost.ID, StateFailed)
	for _, id := range []string{orphan.ID, expiring.ID, died.ID} {
		if _, err := h.rt.Status(ctx, id); !errdefs.IsNotFound(err) {
			t.Errorf("runtime still holds %s: %v", id, err)
		}
	}
	// The recovered service keeps working.
	if err := svc.Resume(ctx, paused.ID); err != nil {
		t.Fatal(err)
	}
	if err := svc.Delete(ctx, died.ID); err != nil {
		t.Fatalf("delete failed sandbox: %v", err)
	}
}

func TestConcurrentCreatesAndDeletes(t *testing.T) {
	h := newHarness(t)
	ctx := context.Background()
	var wg sync.WaitGroup
	errs := make(chan error, 40)
	for i := 0; i < 20; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sb, err := h.svc.Create(ctx, req(time.Hour))
			if err != nil {
				errs <- err
				return
			}
			if err := h.svc.Delete(ctx, sb.ID); err != nil {
				errs <- err
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if _, total := h.svc.List(ctx, ListFilter{}, 1, 10); total != 0 {
		t.Fatalf("%d left", total)
	}
	if l, _ := h.rt.List(ctx); len(l) != 0 {
		t.Fatalf("runtime holds %d", len(l))
	}
}

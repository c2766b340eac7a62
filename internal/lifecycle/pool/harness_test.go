package pool

import (
	"context"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/moat-sandbox/moat/internal/image"
	"github.com/moat-sandbox/moat/internal/lifecycle"
	"github.com/moat-sandbox/moat/internal/runtime"
	"github.com/moat-sandbox/moat/internal/runtime/fake"
	"github.com/moat-sandbox/moat/internal/store"
)

// testService is the core with the pools feature plugged in.
type testService struct {
	*lifecycle.Service
	*Pools
}

func (s *testService) Recover(ctx context.Context) error { return s.Service.Recover(ctx) }

func (s *testService) Close() { s.Pools.Close(); s.Service.Close() }

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
	svc   *testService
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

func req(timeout time.Duration) lifecycle.CreateRequest {
	return lifecycle.CreateRequest{Image: "busybox", Entrypoint: []string{"sleep", "1000"}, Timeout: timeout,
		Metadata: map[string]string{"team": "a"}}
}

func (h *harness) newService(t *testing.T) *testService {
	core, err := lifecycle.New(lifecycle.Config{MaxTimeout: 24 * time.Hour}, lifecycle.Deps{Store: h.db, Runtime: h.rt, Images: fakeImages{}, Now: h.clk.Now})
	if err != nil {
		t.Fatal(err)
	}
	pools := New(core)
	core.Use(lifecycle.Features{Pools: pools})
	return &testService{Service: core, Pools: pools}
}

package snapshot_test

import (
	"context"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/moat-sandbox/moat/internal/image"
	"github.com/moat-sandbox/moat/internal/lifecycle"
	"github.com/moat-sandbox/moat/internal/lifecycle/pool"
	"github.com/moat-sandbox/moat/internal/runtime"
	"github.com/moat-sandbox/moat/internal/runtime/fake"
	"github.com/moat-sandbox/moat/internal/sandbox"
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
	svc   *sandbox.Service
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

func (h *harness) newService(t *testing.T) *sandbox.Service {
	svc, err := sandbox.New(sandbox.Config{Config: lifecycle.Config{MaxTimeout: 24 * time.Hour}},
		sandbox.Deps{Deps: lifecycle.Deps{Store: h.db, Runtime: h.rt, Images: fakeImages{}, Now: h.clk.Now}})
	if err != nil {
		t.Fatal(err)
	}
	return svc
}

// waitIdle waits until the pool has want idle sandboxes and nothing in
// flight (Total counts the creates in flight).
func waitIdle(t *testing.T, svc interface {
	GetPool(ctx context.Context, name string) (pool.Pool, pool.PoolStatus, error)
}, name string, want int) pool.PoolStatus {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		_, st, err := svc.GetPool(context.Background(), name)
		if err != nil {
			t.Fatal(err)
		}
		creating := st.Total - st.Allocated - st.Available
		if st.Available == want && creating == 0 {
			return st
		}
		if time.Now().After(deadline) {
			t.Fatalf("pool %s: %+v (creating %d), want %d idle", name, st, creating, want)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

package compatgo

import (
	"context"
	"errors"
	"net/url"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	opensandbox "github.com/alibaba/OpenSandbox/sdks/sandbox/go"
	"github.com/alibaba/OpenSandbox/sdks/sandbox/go/poolredis"
	"github.com/redis/go-redis/v9"
)

// conn returns the SDK's connection to the server under test.
func conn(t *testing.T) (opensandbox.ConnectionConfig, string) {
	t.Helper()
	raw, key, img := os.Getenv("MOAT_URL"), os.Getenv("MOAT_API_KEY"), os.Getenv("MOAT_IMAGE")
	if raw == "" || img == "" {
		t.Skip("MOAT_URL and MOAT_IMAGE are not set (test/e2e TestCompatGoSDK sets them)")
	}
	u, err := url.Parse(raw)
	if err != nil {
		t.Fatal(err)
	}
	return opensandbox.ConnectionConfig{Domain: u.Host, Protocol: u.Scheme, APIKey: key, RequestTimeout: time.Minute}, img
}

// TestPoolAcquire runs the SDK's client-side pool (OSEP-0005) end to end
// with its in-memory state store: warm-up creates idle sandboxes with a
// long timeout, acquire renews the borrowed one to the caller's shorter
// timeout, then it runs a command.
func TestPoolAcquire(t *testing.T) {
	testPoolAcquire(t, "compat-go-memory", opensandbox.NewInMemoryPoolStateStore())
}

// TestPoolAcquireRedis is TestPoolAcquire with the SDK's Redis state store
// against the redis-server at MOAT_REDIS_ADDR (test/e2e starts one on
// loopback).
func TestPoolAcquireRedis(t *testing.T) {
	addr := os.Getenv("MOAT_REDIS_ADDR")
	if addr == "" {
		t.Skip("MOAT_REDIS_ADDR is not set (test/e2e TestCompatGoSDK starts a redis-server)")
	}
	rc := redis.NewClient(&redis.Options{Addr: addr})
	defer rc.Close()
	store, err := poolredis.NewRedisPoolStateStore(poolredis.RedisPoolStateStoreConfig{Client: rc, KeyPrefix: "compat-go"})
	if err != nil {
		t.Fatal(err)
	}
	testPoolAcquire(t, "compat-go-redis", store)
}

func testPoolAcquire(t *testing.T, name string, store opensandbox.PoolStateStore) {
	cfg, img := conn(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	pool, err := opensandbox.NewSandboxPoolBuilder().
		PoolName(name).OwnerID("t").MaxIdle(1).
		StateStore(store).
		ConnectionConfig(cfg).
		CreationSpec(opensandbox.PoolCreationSpec{Image: img, Entrypoint: []string{"tail", "-f", "/dev/null"}}).
		IdleTimeout(time.Hour).ReconcileInterval(500 * time.Millisecond).
		Build()
	if err != nil {
		t.Fatal(err)
	}
	if err := pool.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer pool.Shutdown(context.Background(), false)
	for deadline := time.Now().Add(2 * time.Minute); ; {
		snap, err := pool.Snapshot(ctx)
		if err == nil && snap.IdleCount >= 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("pool never warmed: %+v %v", snap, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
	fail := opensandbox.AcquirePolicyFailFast
	sb, err := pool.Acquire(ctx, opensandbox.AcquireOptions{SandboxTimeout: 5 * time.Minute, Policy: &fail})
	if err != nil {
		t.Fatalf("acquire from idle: %v", err)
	}
	defer sb.Kill(context.Background())
	info, err := sb.GetInfo(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.ExpiresAt == nil {
		t.Fatal("acquired sandbox has no expiry")
	}
	if left := time.Until(*info.ExpiresAt); left > 6*time.Minute || left < 3*time.Minute {
		t.Fatalf("acquired sandbox expires in %v, want about 5m (shortened from the idle hour)", left)
	}
	ex, err := sb.RunCommand(ctx, "echo pooled", nil)
	if err != nil || !strings.Contains(ex.Text(), "pooled") {
		t.Fatalf("run: %+v %v", ex, err)
	}
}

// TestRenewRace is the pool's acquire race without a state store: two
// clients take the same idle sandbox (created with a long timeout) and
// both renew it to a shorter one at once; both renewals succeed and the
// sandbox keeps running.
func TestRenewRace(t *testing.T) {
	cfg, img := conn(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	hour := 3600
	idle, err := opensandbox.CreateSandbox(ctx, cfg, opensandbox.SandboxCreateOptions{Image: img, Entrypoint: []string{"tail", "-f", "/dev/null"}, TimeoutSeconds: &hour})
	if err != nil {
		t.Fatal(err)
	}
	defer idle.Kill(context.Background())
	var wg sync.WaitGroup
	errs := make([]error, 2)
	for i := range errs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sb, err := opensandbox.ConnectSandbox(ctx, cfg, idle.ID())
			if err == nil {
				_, err = sb.Renew(ctx, time.Duration(4+i)*time.Minute)
			}
			errs[i] = err
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatalf("concurrent renew to a shorter timeout: %v", err)
	}
	info, err := idle.GetInfo(ctx)
	if err != nil || info.ExpiresAt == nil || time.Until(*info.ExpiresAt) > 6*time.Minute {
		t.Fatalf("expiry after renewals: %+v %v", info, err)
	}
	if ex, err := idle.RunCommand(ctx, "echo alive", nil); err != nil || !strings.Contains(ex.Text(), "alive") {
		t.Fatalf("run after renew: %+v %v", ex, err)
	}
}

// TestListUnknownStates filters on states moat never reports next to
// ones it does, as the Python SDK's pool does.
func TestListUnknownStates(t *testing.T) {
	cfg, img := conn(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	sb, err := opensandbox.CreateSandbox(ctx, cfg, opensandbox.SandboxCreateOptions{Image: img, Entrypoint: []string{"tail", "-f", "/dev/null"}, Metadata: map[string]string{"compat": "states"}})
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Kill(context.Background())
	m := opensandbox.NewSandboxManager(cfg)
	defer m.Close()
	got, err := m.ListSandboxInfos(ctx, opensandbox.ListOptions{States: []opensandbox.SandboxState{"Pending", "Allocated", "Running"}, Metadata: map[string]string{"compat": "states"}})
	if err != nil || len(got.Items) != 1 || got.Items[0].ID != sb.ID() {
		t.Fatalf("list Pending|Allocated|Running: %+v %v", got, err)
	}
	got, err = m.ListSandboxInfos(ctx, opensandbox.ListOptions{States: []opensandbox.SandboxState{"Allocated"}, Metadata: map[string]string{"compat": "states"}})
	if err != nil || len(got.Items) != 0 {
		t.Fatalf("list Allocated: %+v %v", got, err)
	}
}

package metrics_test

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/moat-sandbox/moat/internal/httpapi"
	"github.com/moat-sandbox/moat/internal/image"
	"github.com/moat-sandbox/moat/internal/lifecycle"
	"github.com/moat-sandbox/moat/internal/lifecycle/idle"
	"github.com/moat-sandbox/moat/internal/metrics"
	"github.com/moat-sandbox/moat/internal/runtime/fake"
	"github.com/moat-sandbox/moat/internal/sandbox"
	"github.com/moat-sandbox/moat/internal/store"
)

type images struct{}

func (images) Ensure(ctx context.Context, ref string, auth *image.Auth) (image.Image, error) {
	return image.Image{Name: ref}, nil
}

const key = "k"

func do(t *testing.T, h http.Handler, method, path, body string, auth bool) (int, string) {
	t.Helper()
	req := httptest.NewRequest(method, path, strings.NewReader(body))
	if auth {
		req.Header.Set("OPEN-SANDBOX-API-KEY", key)
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	return rec.Code, rec.Body.String()
}

// TestScrapeAfterCreates drives the real API over a fake runtime and checks
// every moat series in the scrape.
func TestScrapeAfterCreates(t *testing.T) {
	db, err := store.Open(context.Background(), filepath.Join(t.TempDir(), "s.db"), time.Second)
	if err != nil {
		t.Fatal(err)
	}
	rt := fake.New(fake.Hooks{})
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	var svc *sandbox.Service
	reg := metrics.New(metrics.Options{
		KnownStates: []string{"Running", "Paused", "Failed"},
		States: func() map[string]int {
			items, _ := svc.List(context.Background(), lifecycle.ListFilter{}, 1, 1000)
			out := map[string]int{}
			for _, sb := range items {
				out[string(sb.Status.State)]++
			}
			return out
		},
	})
	svc, err = sandbox.New(sandbox.Config{Config: lifecycle.Config{}}, sandbox.Deps{Deps: lifecycle.Deps{Store: db, Runtime: rt, Images: images{}, Log: log, Metrics: reg}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { svc.Close(); rt.Close(); db.Close() })
	h := httpapi.New(httpapi.Config{APIKey: key, Metrics: reg}, svc, log).Handler()

	const body = `{"image":{"uri":"busybox"},"entrypoint":["sh"]}`
	var ids []string
	for range 3 {
		code, out := do(t, h, "POST", "/v1/sandboxes", body, true)
		if code != http.StatusAccepted {
			t.Fatalf("create: %d %s", code, out)
		}
		var sb struct{ ID string }
		if err := json.Unmarshal([]byte(out), &sb); err != nil || sb.ID == "" {
			t.Fatalf("create: %s (%v)", out, err)
		}
		ids = append(ids, sb.ID)
	}
	if code, out := do(t, h, "POST", "/v1/sandboxes/"+ids[0]+"/pause", "", true); code != http.StatusAccepted {
		t.Fatalf("pause: %d %s", code, out)
	}
	if code, _ := do(t, h, "POST", "/v1/sandboxes", `{}`, true); code != http.StatusBadRequest {
		t.Fatalf("bad create: %d", code)
	}
	// A pool with no idle sandbox yet: a claim is a miss, created cold.
	pool := `{"name":"p","template":{"image":{"uri":"busybox"},"entrypoint":["sh"]},"capacitySpec":{"bufferMin":0,"bufferMax":0,"poolMin":0,"poolMax":5}}`
	if code, out := do(t, h, "POST", "/v1/pools", pool, true); code != http.StatusCreated {
		t.Fatalf("pool: %d %s", code, out)
	}
	if code, out := do(t, h, "POST", "/v1/sandboxes/batch", `{"count":2,"extensions":{"poolRef":"p"}}`, true); code != http.StatusAccepted {
		t.Fatalf("batch claim: %d %s", code, out)
	}

	// /metrics is behind the API key.
	if code, _ := do(t, h, "GET", "/metrics", "", false); code != http.StatusUnauthorized {
		t.Fatalf("unauthenticated scrape: %d", code)
	}
	code, text := do(t, h, "GET", "/metrics", "", true)
	if code != http.StatusOK {
		t.Fatalf("scrape: %d %s", code, text)
	}
	for _, want := range []string{
		`moat_sandboxes{state="Running"} 4`,
		`moat_sandboxes{state="Paused"} 1`,
		`moat_sandboxes{state="Failed"} 0`,
		`moat_sandbox_create_seconds_count 3`,
		`moat_sandbox_create_seconds_bucket{le="0.005"}`,
		`moat_sandbox_create_seconds_bucket{le="30"} 3`,
		`moat_pool_claims_total{result="hit"} 0`,
		`moat_pool_claims_total{result="miss"} 2`,
		`moat_http_requests_total{code="202",route="POST /v1/sandboxes"} 3`,
		`moat_http_requests_total{code="400",route="POST /v1/sandboxes"} 1`,
		`moat_http_requests_total{code="202",route="POST /v1/sandboxes/{id}/pause"} 1`,
		`moat_http_requests_total{code="401",route="GET /metrics"} 1`,
	} {
		if !strings.Contains(text, want+"\n") && !strings.Contains(text, want+" ") {
			t.Errorf("scrape lacks %q", want)
		}
	}
	if t.Failed() {
		t.Log(text)
	}
}

// TestObservePoolClaimAndUnmatched checks the counters without the API.
func TestObservePoolClaimAndUnmatched(t *testing.T) {
	reg := metrics.New(metrics.Options{})
	reg.ObservePoolClaim(3, 1)
	reg.ObservePoolClaim(0, 2)
	reg.ObserveCreate(40 * time.Millisecond)
	h := reg.Instrument(func(*http.Request) string { return "" }, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "no", http.StatusTeapot)
	}))
	do(t, h, "GET", "/x", "", false)
	_, text := do(t, reg.Handler(), "GET", "/metrics", "", false)
	for _, want := range []string{
		`moat_pool_claims_total{result="hit"} 3`, `moat_pool_claims_total{result="miss"} 3`,
		`moat_sandbox_create_seconds_bucket{le="0.025"} 0`, `moat_sandbox_create_seconds_bucket{le="0.05"} 1`,
		`moat_http_requests_total{code="418",route="unmatched"} 1`,
	} {
		if !strings.Contains(text, want+"\n") {
			t.Errorf("scrape lacks %q:\n%s", want, text)
		}
	}
	if strings.Contains(text, "moat_sandboxes") {
		t.Error("moat_sandboxes exported without a States callback")
	}
}

// The idle policies' counters: the registry is the idle feature's sink.
func TestObserveIdle(t *testing.T) {
	reg := metrics.New(metrics.Options{})
	var m idle.Metrics = reg
	m.ObserveIdlePause(idle.ActionPause)
	m.ObserveIdlePause(idle.ActionPause)
	m.ObserveWake(idle.WakeOK, 20*time.Millisecond)
	m.ObserveWake(idle.WakeTimeout, 0)
	_, text := do(t, reg.Handler(), "GET", "/metrics", "", false)
	for _, want := range []string{
		`moat_idle_pauses_total{action="pause"} 2`,
		`moat_idle_wakes_total{result="ok"} 1`, `moat_idle_wakes_total{result="timeout"} 1`, `moat_idle_wakes_total{result="failed"} 0`,
		`moat_idle_wake_seconds_count 1`, `moat_idle_wake_seconds_bucket{le="0.025"} 1`,
	} {
		if !strings.Contains(text, want+"\n") {
			t.Errorf("scrape lacks %q:\n%s", want, text)
		}
	}
}

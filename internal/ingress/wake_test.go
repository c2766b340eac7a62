package ingress

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/moat-sandbox/moat/internal/errdefs"
)

// wakingResolver is a fakeResolver whose sandboxes may be asleep: Wake
// fails for those in asleep, and counts the requests it let through and
// those that ended.
type wakingResolver struct {
	*fakeResolver
	mu     sync.Mutex
	asleep map[string]bool
	wakes  map[string]int
	ended  map[string]int
}

func (w *wakingResolver) Wake(ctx context.Context, id string) (func(), error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.wakes[id]++
	if w.asleep[id] {
		return nil, errdefs.WithRetryAfter(errdefs.WithPublic(fmt.Errorf("sandbox %s: %w", id, errdefs.ErrUnavailable),
			"SANDBOX::WAKING", "waking up"), 2*time.Second)
	}
	return func() {
		w.mu.Lock()
		w.ended[id]++
		w.mu.Unlock()
	}, nil
}

func (w *wakingResolver) counts(id string) (wakes, ended int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.wakes[id], w.ended[id]
}

// The gateway wakes a sandbox (Waker) once a request is authorised and
// before proxying, answers a wake's error with its Retry-After, and says
// when the request is over.
func TestGatewayWakes(t *testing.T) {
	res := &wakingResolver{fakeResolver: newFakeResolver(), asleep: map[string]bool{"sleepy": true},
		wakes: map[string]int{}, ended: map[string]int{}}
	be := newBackend(t, "a")
	res.add("awake", Target{Addr: addrOf(be)})
	res.add("sleepy", Target{Addr: addrOf(be)})
	res.add("sec", Target{Addr: addrOf(be), AccessToken: "tok"})
	gw := New(Config{DialTimeout: 2 * time.Second}, res, slog.New(slog.NewTextHandler(io.Discard, nil)))
	ts := httptest.NewServer(gw)
	defer func() { ts.Close(); gw.CloseIdleConnections() }()
	e := &env{t: t, res: res.fakeResolver, gw: gw, ts: ts, cl: ts.Client()}

	if got := e.echo(t, "GET", ts.URL+"/awake/8080/x", nil, ""); got.Backend != "a" {
		t.Fatalf("awake: %+v", got)
	}
	// The handler says the request is over after the client has its
	// answer: wait for it.
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		w, n := res.counts("awake")
		if w == 1 && n == 1 {
			break
		}
		if w > 1 || n > 1 || time.Now().After(deadline) {
			t.Fatalf("awake: %d wakes, %d ended; want 1, 1", w, n)
		}
	}
	resp, body := e.do("GET", ts.URL+"/sleepy/8080/x", nil, "")
	wantError(t, resp, body, 503, "SANDBOX::WAKING")
	if got := resp.Header.Get("Retry-After"); got != "2" {
		t.Fatalf("Retry-After = %q", got)
	}
	// A request that fails the secure-access check wakes nothing.
	resp, body = e.do("GET", ts.URL+"/sec/8080/x", nil, "")
	wantError(t, resp, body, 401, codeUnauthorized)
	if w, _ := res.counts("sec"); w != 0 {
		t.Fatalf("an unauthorised request woke the sandbox %d times", w)
	}
}

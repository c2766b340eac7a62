package ingress

import (
	"context"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
)

var wsConns = flag.Int("ingress.wsconns", 200, "WebSocket connections TestHoldWebSockets keeps open through the gateway")

// BenchmarkProxyHTTP compares a small GET sent straight to a backend with
// the same GET through the gateway (path routing); the difference is the
// gateway's per-request overhead on loopback.
func BenchmarkProxyHTTP(b *testing.B) {
	be := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Write([]byte("ok"))
	}))
	defer be.Close()
	e := newEnv(b)
	e.res.add("sb", Target{Addr: addrOf(be)})
	for _, bc := range []struct{ name, url string }{
		{"direct", be.URL + "/x?y=1"},
		{"ingress", e.ts.URL + "/sb/80/x?y=1"},
		{"ingress-host", "http://80-sb." + testDomain + "/x?y=1"},
	} {
		b.Run(bc.name, func(b *testing.B) {
			cl := e.cl
			if bc.name == "direct" {
				cl = &http.Client{Transport: &http.Transport{}}
				defer cl.CloseIdleConnections()
			}
			get := func() {
				resp, err := cl.Get(bc.url)
				if err != nil {
					b.Fatal(err)
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode != 200 {
					b.Fatalf("status %d", resp.StatusCode)
				}
			}
			get() // warm the connection pools
			b.ReportAllocs()
			b.ResetTimer()
			for b.Loop() {
				get()
			}
		})
	}
}

// TestHoldWebSockets opens -ingress.wsconns WebSocket connections at once,
// first straight to the backend and then through the gateway, checks every
// one echoes, and logs what they cost. Client, gateway and backend share
// this process, so the gateway's share is the difference between the two
// runs.
func TestHoldWebSockets(t *testing.T) {
	n := *wsConns
	e := newEnv(t)
	be := newBackend(t, "a")
	e.res.add("sb", Target{Addr: addrOf(be)})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	plain := &http.Client{Transport: &http.Transport{}}
	direct := holdWebSockets(ctx, t, plain, n, strings.Replace(be.URL, "http", "ws", 1)+"/ws")
	via := holdWebSockets(ctx, t, e.cl, n, strings.Replace(e.ts.URL, "http", "ws", 1)+"/sb/80/ws")
	perConn := float64(via.bytes-direct.bytes) / float64(n) / 1024
	t.Logf("%d concurrent WebSockets: direct %.1f MiB, %.1f goroutines/conn, open %v; "+
		"via gateway %.1f MiB, %.1f goroutines/conn, open %v; gateway share %.1f KiB and %.1f goroutines per connection",
		n, float64(direct.bytes)/(1<<20), float64(direct.goroutines)/float64(n), direct.open,
		float64(via.bytes)/(1<<20), float64(via.goroutines)/float64(n), via.open,
		perConn, float64(via.goroutines-direct.goroutines)/float64(n))
}

type holdResult struct {
	bytes      int64 // heap+stack in use while all connections are open
	goroutines int
	open       time.Duration // time to open them all, one after another
}

// holdWebSockets opens n connections to url, echoes once on each, samples
// memory, and closes them all.
func holdWebSockets(ctx context.Context, t *testing.T, cl *http.Client, n int, url string) holdResult {
	t.Helper()
	before := memNow()
	start := time.Now()
	conns := make([]*websocket.Conn, 0, n)
	defer func() {
		for _, c := range conns {
			c.CloseNow()
		}
	}()
	for i := range n {
		c, _, err := websocket.Dial(ctx, url, &websocket.DialOptions{HTTPClient: cl})
		if err != nil {
			t.Fatalf("connection %d: %v", i, err)
		}
		conns = append(conns, c)
	}
	open := time.Since(start)
	for i, c := range conns {
		msg := fmt.Sprint(i)
		if got, err := wsEcho(ctx, c, msg); err != nil || got != "a:"+msg {
			t.Fatalf("connection %d echo = %q, %v", i, got, err)
		}
	}
	after := memNow()
	for _, c := range conns {
		if err := c.Close(websocket.StatusNormalClosure, ""); err != nil {
			t.Fatalf("close: %v", err)
		}
	}
	conns = nil
	// Let the server sides wind down before the next sample.
	for deadline := time.Now().Add(10 * time.Second); runtime.NumGoroutine() > before.goroutines+10 && time.Now().Before(deadline); {
		time.Sleep(20 * time.Millisecond)
	}
	return holdResult{bytes: after.bytes - before.bytes, goroutines: after.goroutines - before.goroutines, open: open.Round(time.Millisecond)}
}

type memSample struct {
	bytes      int64
	goroutines int
}

func memNow() memSample {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return memSample{bytes: int64(ms.HeapInuse + ms.StackInuse), goroutines: runtime.NumGoroutine()}
}

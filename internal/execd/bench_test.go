package execd

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"net/http/httptest"
	"os"
	"testing"
	"time"
)

func benchServer(b *testing.B) *httptest.Server {
	b.Helper()
	srv, err := NewServer(Options{BaseEnv: childEnv(os.Environ()), StateDir: b.TempDir(), Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		b.Fatal(err)
	}
	ts := httptest.NewServer(srv)
	b.Cleanup(func() {
		ts.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		srv.Close(ctx)
	})
	return ts
}

func benchRun(b *testing.B, ts *httptest.Server, body string) int64 {
	resp, err := ts.Client().Post(ts.URL+"/command", "application/json", bytes.NewReader([]byte(body)))
	if err != nil {
		b.Fatal(err)
	}
	n, _ := io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return n
}

// BenchmarkExecRoundTrip measures one foreground `true` over HTTP + SSE,
// from request to the end of the stream.
func BenchmarkExecRoundTrip(b *testing.B) {
	ts := benchServer(b)
	for b.Loop() {
		benchRun(b, ts, `{"command":"true"}`)
	}
}

// BenchmarkStreamThroughput streams 32 MiB of 64-byte lines through one
// command; b.SetBytes reports the process output rate.
func BenchmarkStreamThroughput(b *testing.B) {
	ts := benchServer(b)
	const size = 32 << 20
	b.SetBytes(size)
	for b.Loop() {
		benchRun(b, ts, `{"command":"head -c 33554432 /dev/zero | tr '\\0' a | fold -w 63"}`)
	}
}

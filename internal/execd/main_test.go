package execd

import (
	"context"
	"io"
	"log/slog"
	"net/http/httptest"
	"os"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/moat-sandbox/moat/internal/execd/exectest"
	"github.com/moat-sandbox/moat/internal/execd/proc"
	"github.com/moat-sandbox/moat/internal/execd/wire"
)

func TestMain(m *testing.M) {
	if os.Getenv(helperEnv) != "" {
		os.Exit(runHelper())
	}
	goleak.VerifyTestMain(m)
}

// testEnv is a whole agent (every service behind the route table and the
// token check) on an httptest server.
type testEnv struct {
	*exectest.Env
	t   *testing.T
	srv *Server
	ts  *httptest.Server
	dir string
}

func newTestEnv(t *testing.T, mod ...func(*Options)) *testEnv {
	t.Helper()
	dir := t.TempDir()
	opts := Options{
		BaseEnv:   proc.ChildEnv(os.Environ()),
		StateDir:  dir,
		Log:       slog.New(slog.NewTextHandler(io.Discard, nil)),
		KillGrace: 500 * time.Millisecond,
	}
	for _, f := range mod {
		f(&opts)
	}
	srv, err := NewServer(opts)
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(srv)
	t.Cleanup(func() {
		ts.CloseClientConnections()
		ts.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := srv.Close(ctx); err != nil {
			t.Errorf("server close: %v", err)
		}
	})
	return &testEnv{Env: &exectest.Env{T: t, URL: ts.URL, Client: ts.Client()}, t: t, srv: srv, ts: ts, dir: dir}
}

// runStream posts a command and returns its events (pings dropped).
func (e *testEnv) runStream(req map[string]any) []wire.Event {
	e.t.Helper()
	return e.Events("/command", req)
}

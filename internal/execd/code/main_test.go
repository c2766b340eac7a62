package code

import (
	"context"
	"io"
	"log/slog"
	"os"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/moat-sandbox/moat/internal/execd/command"
	"github.com/moat-sandbox/moat/internal/execd/exectest"
	"github.com/moat-sandbox/moat/internal/execd/proc"
)

func TestMain(m *testing.M) {
	if mode := os.Getenv(fakeKernelEnv); mode != "" && len(os.Args) == 2 {
		os.Exit(runFakeKernel(mode, os.Args[1])) // see fakekernel_test.go
	}
	goleak.VerifyTestMain(m)
}

// testEnv serves a code Service (and the commands service that runs code
// without a language) on an httptest server.
type testEnv struct {
	*exectest.Env
	t   *testing.T
	svc *Service
	run *proc.Runner
}

func newTestEnv(t *testing.T, mod ...func(*Options)) *testEnv {
	t.Helper()
	run, err := proc.NewRunner(proc.Options{
		BaseEnv: proc.ChildEnv(os.Environ()), StateDir: t.TempDir(),
		Log: slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	var opts Options
	for _, f := range mod {
		f(&opts)
	}
	t.Cleanup(func() { // runs after the server's cleanup
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := run.Close(ctx); err != nil {
			t.Errorf("runner close: %v", err)
		}
	})
	cmds := command.New(run, command.Options{KillGrace: 500 * time.Millisecond})
	svc := New(run, cmds, opts)
	env := exectest.Serve(t, svc.Routes(), cmds.Routes())
	return &testEnv{Env: env, t: t, svc: svc, run: run}
}

// with is e for a subtest: failures go to t.
func (e *testEnv) with(t *testing.T) *testEnv {
	return &testEnv{Env: &exectest.Env{T: t, URL: e.URL, Client: e.Client}, t: t, svc: e.svc, run: e.run}
}

package fake

import (
	"context"
	"errors"
	"testing"

	"go.uber.org/goleak"

	"github.com/moat-sandbox/moat/internal/runtime"
	"github.com/moat-sandbox/moat/internal/runtime/runtimetest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestConformance(t *testing.T) {
	runtimetest.Run(t, func(t *testing.T) runtime.Runtime {
		r := New(Hooks{})
		t.Cleanup(func() { r.Close() })
		return r
	}, runtimetest.Options{
		Image: "busybox",
		Reopen: func(t *testing.T, rt runtime.Runtime) runtime.Runtime {
			return rt.(*Runtime).Reopen(Hooks{})
		},
		NoCommands: true,
	})
}

func TestHooks(t *testing.T) {
	boom := errors.New("boom")
	r := New(Hooks{Create: func(runtime.Spec) error { return boom }})
	defer r.Close()
	ctx := context.Background()
	if _, err := r.Create(ctx, runtime.Spec{ID: "a", Image: "x"}); !errors.Is(err, boom) {
		t.Fatalf("Create = %v, want injected error", err)
	}
	if l, _ := r.List(ctx); len(l) != 0 {
		t.Fatalf("failed Create left %v", l)
	}
}

package image

import (
	"context"
	"sync"
)

// flightGroup collapses concurrent calls with the same key into one
// execution, like x/sync/singleflight, but with context semantics fit for
// downloads: the shared work runs on a context detached from any single
// caller (it keeps the first caller's values) and is cancelled only when
// every caller waiting for it has given up. A caller whose context ends
// returns ctx.Err() immediately.
type flightGroup[T any] struct {
	mu sync.Mutex
	m  map[string]*flight[T] // guarded by mu
}

type flight[T any] struct {
	done    chan struct{} // closed when val and err are set
	val     T
	err     error
	waiters int // guarded by flightGroup.mu
	cancel  context.CancelFunc
}

// Do runs fn once for all concurrent callers with key. shared reports
// whether this caller joined an execution started by another caller.
func (g *flightGroup[T]) Do(ctx context.Context, key string, fn func(ctx context.Context) (T, error)) (v T, shared bool, err error) {
	g.mu.Lock()
	if g.m == nil {
		g.m = make(map[string]*flight[T])
	}
	f, ok := g.m[key]
	if ok {
		f.waiters++
	} else {
		fctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
		f = &flight[T]{done: make(chan struct{}), waiters: 1, cancel: cancel}
		g.m[key] = f
		go func() {
			defer cancel()
			val, err := fn(fctx)
			g.mu.Lock()
			if g.m[key] == f {
				delete(g.m, key)
			}
			g.mu.Unlock()
			f.val, f.err = val, err
			close(f.done)
		}()
	}
	g.mu.Unlock()

	select {
	case <-f.done:
		return f.val, ok, f.err
	case <-ctx.Done():
		g.mu.Lock()
		f.waiters--
		if f.waiters == 0 {
			// Nobody wants the result any more: stop the work and let the
			// next caller start afresh rather than join a dying flight.
			f.cancel()
			if g.m[key] == f {
				delete(g.m, key)
			}
		}
		g.mu.Unlock()
		var zero T
		return zero, ok, ctx.Err()
	}
}

package proc

import (
	"cmp"
	"slices"
	"sync"

	"github.com/moat-sandbox/moat/internal/execd/wire"
)

// Registry is a service's table of live things by id (commands, sessions,
// PTYs, code contexts), each owning processes started through the Runner.
// Add refuses once the Runner is closing, so nothing is registered after
// Close has collected the process groups it kills; List keeps creation
// order. It is safe for concurrent use.
type Registry[T any] struct {
	run  *Runner
	kind string // in the not-found error: "command", "pty session", ...

	mu    sync.Mutex
	seq   uint64                   // guarded by mu
	items map[string]registered[T] // guarded by mu
}

type registered[T any] struct {
	v   T
	seq uint64 // creation order
}

// NewRegistry returns an empty Registry whose lookups name kind.
func NewRegistry[T any](run *Runner, kind string) *Registry[T] {
	return &Registry[T]{run: run, kind: kind, items: make(map[string]registered[T])}
}

// Add registers v under id; it fails with 503 once the Runner is closing.
func (r *Registry[T]) Add(id string, v T) error {
	if r.run.Closed() {
		return wire.Unavailable()
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.seq++
	r.items[id] = registered[T]{v: v, seq: r.seq}
	return nil
}

// Get returns the value under id, or a 404 CONTEXT_NOT_FOUND error.
func (r *Registry[T]) Get(id string) (T, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	e, ok := r.items[id]
	if !ok {
		var zero T
		return zero, wire.ContextNotFound(r.kind, id)
	}
	return e.v, nil
}

// Remove unregisters and returns the value under id, or a 404 error: of
// concurrent removals of one id only one gets the value to release.
func (r *Registry[T]) Remove(id string) (T, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	e, ok := r.items[id]
	if !ok {
		var zero T
		return zero, wire.ContextNotFound(r.kind, id)
	}
	delete(r.items, id)
	return e.v, nil
}

// Replace swaps the value under id for v, keeping its place in the
// creation order, and returns the old value; a 404 error when id is not
// registered.
func (r *Registry[T]) Replace(id string, v T) (T, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	e, ok := r.items[id]
	if !ok {
		var zero T
		return zero, wire.ContextNotFound(r.kind, id)
	}
	r.items[id] = registered[T]{v: v, seq: e.seq}
	return e.v, nil
}

// List returns the values for which keep reports true (nil keeps all), in
// creation order. keep runs under the registry's lock.
func (r *Registry[T]) List(keep func(T) bool) []T {
	r.mu.Lock()
	var es []registered[T]
	for _, e := range r.items {
		if keep == nil || keep(e.v) {
			es = append(es, e)
		}
	}
	r.mu.Unlock()
	slices.SortFunc(es, func(a, b registered[T]) int { return cmp.Compare(a.seq, b.seq) })
	out := make([]T, len(es))
	for i, e := range es {
		out[i] = e.v
	}
	return out
}

package kubernetes_test

import (
	"context"
	"log/slog"
	"sync"
	"testing"

	"github.com/moat-sandbox/moat/internal/k8s/node"
)

// memTasks is the container runtime of kwok's nodes, which run no
// containers: the frozen ones by ID.
type memTasks struct {
	mu     sync.Mutex
	frozen map[string]bool
}

func (m *memTasks) Frozen(_ context.Context, id string) (bool, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.frozen[id], nil
}

func (m *memTasks) Pause(_ context.Context, id string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.frozen[id] = true
	return nil
}

func (m *memTasks) Resume(_ context.Context, id string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.frozen, id)
	return nil
}

// startNodes runs `moat node` (package node) for each of kwok's nodes
// until t ends, so that pause and resume are answered.
func startNodes(t *testing.T) {
	t.Helper()
	tasks := &memTasks{frozen: map[string]bool{}}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for _, name := range env.Nodes {
		mgr, err := node.New(env.Config, node.Options{NodeName: name, Tasks: tasks, Log: slog.New(slog.DiscardHandler)})
		if err != nil {
			cancel()
			t.Fatal(err)
		}
		wg.Add(1)
		go func() { defer wg.Done(); mgr.Start(ctx) }()
	}
	t.Cleanup(func() { cancel(); wg.Wait() })
}

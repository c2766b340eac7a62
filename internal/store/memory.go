package store

import (
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"sync"

	"github.com/moat-sandbox/moat/internal/errdefs"
)

// Memory is a Store that keeps its records in this process only: for
// state that need not outlive the process (a stateless server's sandbox
// events) and for tests. It is safe for concurrent use.
type Memory struct {
	mu      sync.Mutex
	buckets map[string]map[string][]byte
}

var _ Store = (*Memory)(nil)

// NewMemory returns an empty Memory store.
func NewMemory() *Memory { return &Memory{buckets: map[string]map[string][]byte{}} }

func (m *Memory) putLocked(bucket, key string, raw []byte) {
	if m.buckets[bucket] == nil {
		m.buckets[bucket] = map[string][]byte{}
	}
	m.buckets[bucket][key] = raw
}

// Put implements Store.
func (m *Memory) Put(bucket, key string, v any) error {
	raw, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("encode %s/%s: %w", bucket, key, err)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.putLocked(bucket, key, raw)
	return nil
}

// Update implements Store.
func (m *Memory) Update(bucket, key string, v any) error {
	raw, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("encode %s/%s: %w", bucket, key, err)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, ok := m.buckets[bucket][key]; !ok {
		return fmt.Errorf("%s/%s: %w", bucket, key, errdefs.ErrNotFound)
	}
	m.putLocked(bucket, key, raw)
	return nil
}

// PutMany implements Store.
func (m *Memory) PutMany(bucket string, kv map[string]any) error {
	enc := make(map[string][]byte, len(kv))
	for k, v := range kv {
		raw, err := json.Marshal(v)
		if err != nil {
			return fmt.Errorf("encode %s/%s: %w", bucket, k, err)
		}
		enc[k] = raw
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	for k, raw := range enc {
		m.putLocked(bucket, k, raw)
	}
	return nil
}

// Get implements Store.
func (m *Memory) Get(bucket, key string, v any) error {
	m.mu.Lock()
	raw, ok := m.buckets[bucket][key]
	m.mu.Unlock()
	if !ok {
		return fmt.Errorf("%s/%s: %w", bucket, key, errdefs.ErrNotFound)
	}
	return json.Unmarshal(raw, v)
}

// Delete implements Store.
func (m *Memory) Delete(bucket, key string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.buckets[bucket], key)
	return nil
}

// ForEach implements Store.
func (m *Memory) ForEach(bucket string, fn func(key string, raw []byte) error) error {
	m.mu.Lock()
	b := maps.Clone(m.buckets[bucket])
	m.mu.Unlock()
	for _, k := range slices.Sorted(maps.Keys(b)) {
		if err := fn(k, b[k]); err != nil {
			return err
		}
	}
	return nil
}

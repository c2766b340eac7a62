package audit

import "sync"

// Memory is an audit sink that keeps records in memory, for tests and
// embedders that read the log back in process. It is safe for concurrent
// use.
type Memory struct {
	mu   sync.Mutex
	recs []Record
}

// Write appends r.
func (m *Memory) Write(r Record) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.recs = append(m.recs, r)
	return nil
}

// Records returns a copy of the records written so far, oldest first.
func (m *Memory) Records() []Record {
	m.mu.Lock()
	defer m.mu.Unlock()
	return append([]Record(nil), m.recs...)
}

// Last returns the newest record, or the zero Record if there is none.
func (m *Memory) Last() Record {
	m.mu.Lock()
	defer m.mu.Unlock()
	if len(m.recs) == 0 {
		return Record{}
	}
	return m.recs[len(m.recs)-1]
}

package store

import (
	"sync"

	bolt "go.etcd.io/bbolt"
)

// Group commit: bbolt runs one read-write transaction at a time and
// fsyncs it (twice: data, then meta) before the next may start, so
// concurrent writers (a batch of creates: each sandbox's record) queued
// on that lock and each paid for its own fsync. A write now joins a
// queue; whoever finds no commit running commits everything queued in
// one transaction, and the writes that arrive meanwhile go together into
// the next one. A lone write commits at once (no delay as with
// bolt.DB.Batch, whose batches wait for a timer). Each write is durable
// when it returns, as before.

// pendingWrite is one queued write and the channel its result goes to.
type pendingWrite struct {
	fn   func(*bolt.Tx) error
	done chan error
}

// writes is the group commit state of a DB.
type writes struct {
	mu      sync.Mutex
	queue   []*pendingWrite
	running bool           // a committer is at work
	wg      sync.WaitGroup // committer goroutines started by handOff
	commits int            // read-write transactions run (tests)
}

// write runs fn in a read-write transaction, committed together with the
// writes queued at the same time, and returns fn's error or the commit's.
// fn must not keep anything of tx and may be run twice (once with others,
// once alone, if one of the group failed).
func (d *DB) write(fn func(*bolt.Tx) error) error {
	w := &pendingWrite{fn: fn, done: make(chan error, 1)}
	g := &d.writes
	g.mu.Lock()
	g.queue = append(g.queue, w)
	lead := !g.running
	g.running = true
	g.mu.Unlock()
	if lead {
		d.commitQueued()
	}
	return <-w.done
}

// commitQueued commits the queue in one transaction; a caller whose own
// write was in it hands what queued up meanwhile to a new goroutine
// instead of staying to commit other callers' writes.
func (d *DB) commitQueued() {
	g := &d.writes
	g.mu.Lock()
	batch := g.queue
	g.queue = nil
	g.mu.Unlock()
	d.commit(batch)
	g.mu.Lock()
	defer g.mu.Unlock()
	if len(g.queue) == 0 {
		g.running = false
		return
	}
	g.wg.Add(1)
	go func() {
		defer g.wg.Done()
		d.commitQueued()
	}()
}

// commit runs batch in one transaction. If one write fails, the
// transaction is rolled back and each write runs again alone, so that
// only the failing one reports its error.
func (d *DB) commit(batch []*pendingWrite) {
	if len(batch) == 1 {
		batch[0].done <- d.update(batch[0].fn)
		return
	}
	failed := false
	err := d.update(func(tx *bolt.Tx) error {
		for _, w := range batch {
			if err := w.fn(tx); err != nil {
				failed = true
				return err
			}
		}
		return nil
	})
	for _, w := range batch {
		switch {
		case failed:
			w.done <- d.update(w.fn)
		default:
			w.done <- err // nil, or the commit's own error for all
		}
	}
}

// update is one bbolt read-write transaction, counted.
func (d *DB) update(fn func(*bolt.Tx) error) error {
	d.writes.mu.Lock()
	d.writes.commits++
	d.writes.mu.Unlock()
	return d.db.Update(fn)
}

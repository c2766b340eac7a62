package store

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"sync"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/moat-sandbox/moat/internal/errdefs"
)

// TestGroupCommit: writes that queue while a commit is running go
// together into the next transaction (one commit for all of them, not
// one each), every one of them is durable (there after a reopen), and
// one failing write of a group (Update of a missing record) fails alone.
func TestGroupCommit(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "state.db")
	db, err := Open(ctx, path, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { db.Close() }()

	// A first write holds the transaction until the others are queued.
	inTx, release := make(chan struct{}), make(chan struct{})
	first := make(chan error, 1)
	go func() {
		first <- db.write(func(tx *bolt.Tx) error {
			close(inTx)
			<-release
			b, err := tx.CreateBucketIfNotExists([]byte("b"))
			if err != nil {
				return err
			}
			return b.Put([]byte("first"), []byte(`1`))
		})
	}()
	<-inTx
	before := db.commitCount()
	const n = 20
	errs := make([]error, n+1)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = db.Put("b", fmt.Sprintf("k%02d", i), i)
		}()
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		errs[n] = db.Update("b", "missing", 1)
	}()
	for db.queued() < n+1 {
		time.Sleep(time.Millisecond)
	}
	close(release)
	if err := <-first; err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	for i, err := range errs[:n] {
		if err != nil {
			t.Errorf("Put k%02d: %v", i, err)
		}
	}
	if !errdefs.IsNotFound(errs[n]) {
		t.Errorf("Update of a missing record in a group = %v, want NotFound", errs[n])
	}
	// The group (all n+1 queued writes) is one commit; the failed Update
	// made each write run again alone: 1 + n+1 commits after the first.
	if got := db.commitCount() - before; got != 1+n+1 {
		t.Errorf("%d commits for a group of %d with one failing write, want %d", got, n+1, 1+n+1)
	}

	// Without a failure, a group is one commit.
	inTx2, release2 := make(chan struct{}), make(chan struct{})
	go func() {
		first <- db.write(func(tx *bolt.Tx) error { close(inTx2); <-release2; return nil })
	}()
	<-inTx2
	before = db.commitCount()
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = db.Delete("b", fmt.Sprintf("k%02d", i))
		}()
	}
	for db.queued() < n {
		time.Sleep(time.Millisecond)
	}
	close(release2)
	<-first
	wg.Wait()
	if err := errors.Join(errs[:n]...); err != nil {
		t.Fatal(err)
	}
	if got := db.commitCount() - before; got != 1 {
		t.Errorf("%d commits for a group of %d deletes, want 1", got, n)
	}

	db.Close()
	db, err = Open(ctx, path, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	var keys []string
	db.ForEach("b", func(k string, _ []byte) error { keys = append(keys, k); return nil })
	if len(keys) != 1 || keys[0] != "first" {
		t.Errorf("after reopen: keys %v, want [first]", keys)
	}
}

func (d *DB) commitCount() int {
	d.writes.mu.Lock()
	defer d.writes.mu.Unlock()
	return d.writes.commits
}

func (d *DB) queued() int {
	d.writes.mu.Lock()
	defer d.writes.mu.Unlock()
	return len(d.writes.queue)
}

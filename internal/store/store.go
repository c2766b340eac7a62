// Package store is moat's embedded state store: a bbolt database holding
// JSON records in named buckets (sandboxes, pools, snapshots, ...). Every
// write is in one fsynced transaction (concurrent writes share one:
// group.go), so a record either exists whole or not at all after a
// crash. Callers keep their own in-memory view and write through; the
// store is read in full only at start-up. The state carries a schema
// version; Open upgrades older states and refuses newer ones (schema.go).
package store

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/moat-sandbox/moat/internal/errdefs"
)

// Store is what moat's services persist their records through: JSON
// records under a bucket and a key. Writes are durable when they return;
// PutMany is atomic (all or none). Get returns an errdefs.ErrNotFound class
// for a missing record; Delete of a missing record is not an error.
// ForEach visits the records of a bucket in key order. Implementations are
// safe for concurrent use.
//
// *DB (bbolt, one file, one process) is the store of a single server. A
// server on Kubernetes keeps its records in the API server instead
// (internal/k8s/kstore), so that several replicas share them; such a store
// may also implement Watcher.
type Store interface {
	Put(bucket, key string, v any) error
	// Update is Put for a record that must exist: ErrNotFound if it does
	// not (e.g. another replica deleted it), and it is not created.
	Update(bucket, key string, v any) error
	PutMany(bucket string, kv map[string]any) error
	Get(bucket, key string, v any) error
	Delete(bucket, key string) error
	ForEach(bucket string, fn func(key string, raw []byte) error) error
}

// Watcher is implemented by stores that other processes write too (the
// replicas of a server on Kubernetes). Watch calls fn for every change of
// a record of bucket made by another process (raw is nil when the record
// was deleted), after the store has applied it, until ctx ends. Changes
// made through this process's own store are not reported. fn must not
// block for long.
type Watcher interface {
	Watch(ctx context.Context, bucket string, fn func(key string, raw []byte))
}

var _ Store = (*DB)(nil)

// DB is an open state store. It is safe for concurrent use.
type DB struct {
	db     *bolt.DB
	writes writes // group commit (group.go)
}

// Open opens (creating if needed) the database at path. Only one process
// may hold it; a second Open fails after timeout with ErrUnavailable.
func Open(ctx context.Context, path string, timeout time.Duration) (*DB, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, fmt.Errorf("store dir: %w", err)
	}
	if timeout <= 0 {
		timeout = 5 * time.Second
	}
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: timeout})
	if err != nil {
		return nil, fmt.Errorf("open store %s (is another moat server running?): %v: %w", path, err, errdefs.ErrUnavailable)
	}
	d := &DB{db: db}
	if err := d.upgrade(path); err != nil {
		db.Close()
		return nil, err
	}
	return d, nil
}

// Close closes the database.
func (d *DB) Close() error {
	d.writes.wg.Wait()
	return d.db.Close()
}

// Put stores v as JSON under bucket/key.
func (d *DB) Put(bucket, key string, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("encode %s/%s: %w", bucket, key, err)
	}
	return d.write(func(tx *bolt.Tx) error {
		bk, err := tx.CreateBucketIfNotExists([]byte(bucket))
		if err != nil {
			return err
		}
		return bk.Put([]byte(key), b)
	})
}

// Update stores v under bucket/key if a record is there already
// (ErrNotFound otherwise), in one transaction.
func (d *DB) Update(bucket, key string, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("encode %s/%s: %w", bucket, key, err)
	}
	return d.write(func(tx *bolt.Tx) error {
		bk := tx.Bucket([]byte(bucket))
		if bk == nil || bk.Get([]byte(key)) == nil {
			return fmt.Errorf("%s/%s: %w", bucket, key, errdefs.ErrNotFound)
		}
		return bk.Put([]byte(key), b)
	})
}

// PutMany stores every value of kv as JSON under bucket, in one
// transaction (one fsync): all or none are written.
func (d *DB) PutMany(bucket string, kv map[string]any) error {
	enc := make(map[string][]byte, len(kv))
	for k, v := range kv {
		b, err := json.Marshal(v)
		if err != nil {
			return fmt.Errorf("encode %s/%s: %w", bucket, k, err)
		}
		enc[k] = b
	}
	return d.write(func(tx *bolt.Tx) error {
		bk, err := tx.CreateBucketIfNotExists([]byte(bucket))
		if err != nil {
			return err
		}
		for k, b := range enc {
			if err := bk.Put([]byte(k), b); err != nil {
				return err
			}
		}
		return nil
	})
}

// Get decodes bucket/key into v, ErrNotFound if absent.
func (d *DB) Get(bucket, key string, v any) error {
	return d.db.View(func(tx *bolt.Tx) error {
		bk := tx.Bucket([]byte(bucket))
		if bk == nil {
			return fmt.Errorf("%s/%s: %w", bucket, key, errdefs.ErrNotFound)
		}
		b := bk.Get([]byte(key))
		if b == nil {
			return fmt.Errorf("%s/%s: %w", bucket, key, errdefs.ErrNotFound)
		}
		return json.Unmarshal(b, v)
	})
}

// Delete removes bucket/key; deleting a missing key is not an error.
func (d *DB) Delete(bucket, key string) error {
	return d.write(func(tx *bolt.Tx) error {
		bk := tx.Bucket([]byte(bucket))
		if bk == nil {
			return nil
		}
		return bk.Delete([]byte(key))
	})
}

// ForEach calls fn for every record in bucket, in key order.
func (d *DB) ForEach(bucket string, fn func(key string, raw []byte) error) error {
	return d.db.View(func(tx *bolt.Tx) error {
		bk := tx.Bucket([]byte(bucket))
		if bk == nil {
			return nil
		}
		return bk.ForEach(func(k, v []byte) error {
			if isGuard(k) {
				return nil
			}
			return fn(string(k), v)
		})
	})
}

// List decodes every record of bucket as T.
func List[T any](d Store, bucket string) ([]T, error) {
	var out []T
	err := d.ForEach(bucket, func(key string, raw []byte) error {
		var v T
		if err := json.Unmarshal(raw, &v); err != nil {
			return fmt.Errorf("decode %s/%s: %w", bucket, key, err)
		}
		out = append(out, v)
		return nil
	})
	return out, err
}

package store

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/moat-sandbox/moat/internal/errdefs"
)

// sandboxV1 is the shape a pre-versioning server decodes the sandboxes
// bucket into (strictly, with encoding/json).
type sandboxV1 struct {
	ID     string `json:"id"`
	Status struct {
		State string `json:"state"`
	} `json:"status"`
}

// writeRaw makes a bbolt file the way an older server left it.
func writeRaw(t *testing.T, path string, fn func(tx *bolt.Tx) error) {
	t.Helper()
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if err := db.Update(fn); err != nil {
		t.Fatal(err)
	}
	db.Close()
}

func TestNewStateHasCurrentVersion(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.db")
	db, err := Open(context.Background(), path, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if v, err := db.Version(); err != nil || v != SchemaVersion {
		t.Fatalf("version %d %v, want %d", v, err, SchemaVersion)
	}
	if got, err := List[sandboxV1](db, "sandboxes"); err != nil || len(got) != 0 {
		t.Fatalf("the guard shows in List: %+v %v", got, err)
	}
	if _, err := os.Stat(path + ".schema1.bak"); err == nil {
		t.Error("a new state was backed up as if upgraded")
	}
}

// TestUpgradeFromUnversioned: a state of a server that predates versions
// (git f29dccf) is upgraded in place, its records intact, the old file
// kept; afterwards a strict decoder of that era fails on the guard record
// with a message that says to upgrade, instead of running on it.
func TestUpgradeFromUnversioned(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.db")
	writeRaw(t, path, func(tx *bolt.Tx) error {
		bk, err := tx.CreateBucketIfNotExists([]byte("sandboxes"))
		if err != nil {
			return err
		}
		return bk.Put([]byte("sb-1"), []byte(`{"id":"sb-1","status":{"state":"Running"}}`))
	})
	db, err := Open(context.Background(), path, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if v, _ := db.Version(); v != SchemaVersion {
		t.Fatalf("version after upgrade %d, want %d", v, SchemaVersion)
	}
	got, err := List[sandboxV1](db, "sandboxes")
	if err != nil || len(got) != 1 || got[0].ID != "sb-1" || got[0].Status.State != "Running" {
		t.Fatalf("records after upgrade: %+v %v", got, err)
	}
	// What a pre-versioning server's recovery does first: decode every
	// record of the bucket, strictly.
	var refusal error
	db.db.View(func(tx *bolt.Tx) error {
		return tx.Bucket([]byte("sandboxes")).ForEach(func(k, v []byte) error {
			var sb sandboxV1
			if err := json.Unmarshal(v, &sb); err != nil && refusal == nil {
				refusal = &decodeErr{key: string(k), err: err}
			}
			return nil
		})
	})
	db.Close()
	if refusal == nil || !strings.Contains(refusal.Error(), "newer moat server") || !strings.Contains(refusal.Error(), "run the newer moat") {
		t.Fatalf("an old server's decode of the upgraded state: %v, want a refusal naming the upgrade", refusal)
	}
	// The pre-upgrade state is kept, still unversioned.
	old, err := bolt.Open(path+".schema1.bak", 0o600, &bolt.Options{Timeout: time.Second, ReadOnly: true})
	if err != nil {
		t.Fatalf("backup: %v", err)
	}
	defer old.Close()
	old.View(func(tx *bolt.Tx) error {
		if tx.Bucket([]byte(MetaBucket)) != nil || tx.Bucket([]byte("sandboxes")).Get([]byte("sb-1")) == nil {
			t.Error("the backup is not the pre-upgrade state")
		}
		return nil
	})
	// Reopening is a no-op.
	db, err = Open(context.Background(), path, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	db.Close()
}

// decodeErr is how a pre-versioning store reported a bad record.
type decodeErr struct {
	key string
	err error
}

func (e *decodeErr) Error() string { return "decode sandboxes/" + e.key + ": " + e.err.Error() }

// TestRefusesNewerState: a state written by a newer moat is refused with
// a message naming both versions, and left untouched.
func TestRefusesNewerState(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.db")
	future := strconv.Itoa(SchemaVersion + 1)
	writeRaw(t, path, func(tx *bolt.Tx) error {
		bk, err := tx.CreateBucketIfNotExists([]byte(MetaBucket))
		if err != nil {
			return err
		}
		return bk.Put([]byte(schemaKey), []byte(future))
	})
	before, _ := os.ReadFile(path)
	_, err := Open(context.Background(), path, time.Second)
	if !errdefs.IsFailedPrecondition(err) || !strings.Contains(err.Error(), "schema version "+future) ||
		!strings.Contains(err.Error(), "up to "+strconv.Itoa(SchemaVersion)) || !strings.Contains(err.Error(), "newer moat") {
		t.Fatalf("Open of a newer state: %v", err)
	}
	if after, _ := os.ReadFile(path); string(after) != string(before) {
		t.Fatal("the refused state was modified")
	}
	// The lock is released: the refusing process does not hold the file.
	writeRaw(t, path, func(tx *bolt.Tx) error { return nil })
}

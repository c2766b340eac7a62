package store

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/moat-sandbox/moat/internal/errdefs"
)

type rec struct {
	ID string `json:"id"`
	N  int    `json:"n"`
}

func TestPutGetListDeleteReopen(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "state.db")
	db, err := Open(ctx, path, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	var r rec
	if err := db.Get("sb", "a", &r); !errdefs.IsNotFound(err) {
		t.Fatalf("get on empty bucket: %v, want not found", err)
	}
	for i, id := range []string{"b", "a", "c"} {
		if err := db.Put("sb", id, rec{ID: id, N: i}); err != nil {
			t.Fatal(err)
		}
	}
	if err := db.Delete("sb", "c"); err != nil {
		t.Fatal(err)
	}
	if err := db.Delete("sb", "missing"); err != nil {
		t.Fatalf("delete missing: %v", err)
	}
	// A second opener must fail while the first holds the lock.
	if _, err := Open(ctx, path, 50*time.Millisecond); !errdefs.IsNotFound(err) && err == nil {
		t.Fatal("second Open succeeded while locked")
	}
	db.Close()
	db, err = Open(ctx, path, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	got, err := List[rec](db, "sb")
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got[0].ID != "a" || got[1].ID != "b" || got[1].N != 0 {
		t.Fatalf("after reopen got %+v", got)
	}
}

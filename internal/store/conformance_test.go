package store_test

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/moat-sandbox/moat/internal/store"
	"github.com/moat-sandbox/moat/internal/store/storetest"
)

func TestConformance(t *testing.T) {
	t.Run("bbolt", func(t *testing.T) {
		db, err := store.Open(context.Background(), filepath.Join(t.TempDir(), "state.db"), time.Second)
		if err != nil {
			t.Fatal(err)
		}
		defer db.Close()
		storetest.Run(t, db)
	})
	t.Run("memory", func(t *testing.T) { storetest.Run(t, store.NewMemory()) })
}

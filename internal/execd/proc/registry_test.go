package proc

import (
	"context"
	"errors"
	"slices"
	"testing"

	"github.com/moat-sandbox/moat/internal/errdefs"
)

// TestRegistry: lookups by id, one winner among removals of an id,
// creation order in List, and no registration once the Runner closes.
func TestRegistry(t *testing.T) {
	run, err := NewRunner(Options{StateDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	reg := NewRegistry[int](run, "thing")
	for i, id := range []string{"c", "a", "b"} {
		if err := reg.Add(id, i); err != nil {
			t.Fatal(err)
		}
	}
	if v, err := reg.Get("a"); err != nil || v != 1 {
		t.Fatalf("Get(a) = %d, %v; want 1", v, err)
	}
	if _, err := reg.Get("x"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("Get(x) error = %v; want not found", err)
	}
	if got := reg.List(nil); !slices.Equal(got, []int{0, 1, 2}) {
		t.Fatalf("List = %v; want creation order [0 1 2]", got)
	}
	if got := reg.List(func(v int) bool { return v != 1 }); !slices.Equal(got, []int{0, 2}) {
		t.Fatalf("filtered List = %v; want [0 2]", got)
	}
	// Replace keeps the place in the order.
	if old, err := reg.Replace("c", 10); err != nil || old != 0 {
		t.Fatalf("Replace(c) = %d, %v; want 0", old, err)
	}
	if got := reg.List(nil); !slices.Equal(got, []int{10, 1, 2}) {
		t.Fatalf("List after Replace = %v; want [10 1 2]", got)
	}
	if _, err := reg.Replace("x", 1); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("Replace(x) error = %v; want not found", err)
	}
	if v, err := reg.Remove("c"); err != nil || v != 10 {
		t.Fatalf("Remove(c) = %d, %v; want 10", v, err)
	}
	if _, err := reg.Remove("c"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("second Remove(c) error = %v; want not found", err)
	}
	if err := run.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := reg.Add("d", 3); !errors.Is(err, errdefs.ErrUnavailable) {
		t.Fatalf("Add after Close error = %v; want unavailable", err)
	}
	if got := reg.List(nil); !slices.Equal(got, []int{1, 2}) {
		t.Fatalf("List after Close = %v; want [1 2]", got)
	}
}

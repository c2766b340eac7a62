// Package storetest is the conformance suite of store.Store: every
// implementation (bbolt, memory, the Kubernetes API server) runs it.
package storetest

import (
	"errors"
	"fmt"
	"slices"
	"testing"

	"github.com/moat-sandbox/moat/internal/errdefs"
	"github.com/moat-sandbox/moat/internal/store"
)

type rec struct {
	ID    string `json:"id"`
	Value int    `json:"value"`
}

// Run checks s, an empty store. The steps run in order on one store,
// each starting from what the one before left.
func Run(t *testing.T, s store.Store) {
	t.Helper()
	checkMissing(t, s)
	checkPut(t, s)
	checkPutMany(t, s)
	checkDelete(t, s)
}

// checkMissing checks Get and Update of a record that does not exist.
func checkMissing(t *testing.T, s store.Store) {
	t.Helper()
	var got rec
	if err := s.Get("b", "missing", &got); !errdefs.IsNotFound(err) {
		t.Errorf("Get of a missing record = %v, want ErrNotFound", err)
	}
	if err := s.Update("b", "missing", rec{ID: "missing"}); !errdefs.IsNotFound(err) {
		t.Errorf("Update of a missing record = %v, want ErrNotFound", err)
	}
	if err := s.Get("b", "missing", &got); !errdefs.IsNotFound(err) {
		t.Errorf("Update created a record: %v %+v", err, got)
	}
}

// checkPut checks that Put replaces a record and Update changes it.
func checkPut(t *testing.T, s store.Store) {
	t.Helper()
	var got rec
	if err := s.Put("b", "one", rec{ID: "one", Value: 1}); err != nil {
		t.Fatal(err)
	}
	if err := s.Put("b", "one", rec{ID: "one", Value: 2}); err != nil {
		t.Fatal(err)
	}
	if err := s.Get("b", "one", &got); err != nil || got.Value != 2 {
		t.Errorf("Get = %+v, %v; want value 2", got, err)
	}
	if err := s.Update("b", "one", rec{ID: "one", Value: 3}); err != nil {
		t.Fatal(err)
	}
}

// checkPutMany checks PutMany over new and existing records, the listing
// in key order, and that buckets are apart.
func checkPutMany(t *testing.T, s store.Store) {
	t.Helper()
	var got rec
	many := map[string]any{}
	for i := range 5 {
		k := fmt.Sprintf("m%d", i)
		many[k] = rec{ID: k, Value: i}
	}
	many["one"] = rec{ID: "one", Value: 4} // an existing record among new ones
	if err := s.PutMany("b", many); err != nil {
		t.Fatal(err)
	}
	if err := s.Put("other", "one", rec{ID: "x"}); err != nil {
		t.Fatal(err)
	}
	var keys []string
	if err := s.ForEach("b", func(k string, raw []byte) error {
		keys = append(keys, k)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if want := []string{"m0", "m1", "m2", "m3", "m4", "one"}; !slices.Equal(keys, want) {
		t.Errorf("ForEach keys = %v, want %v", keys, want)
	}
	list, err := store.List[rec](s, "b")
	if err != nil || len(list) != 6 {
		t.Errorf("List = %v, %v", list, err)
	}
	if err := s.Get("b", "one", &got); err != nil || got.Value != 4 {
		t.Errorf("after PutMany, one = %+v, %v", got, err)
	}
	// A record of a PutMany is updated and deleted on its own.
	if err := s.Update("b", "m2", rec{ID: "m2", Value: 20}); err != nil {
		t.Fatal(err)
	}
	if err := s.Get("b", "m2", &got); err != nil || got.Value != 20 {
		t.Errorf("m2 = %+v, %v", got, err)
	}
	if err := s.Get("b", "m3", &got); err != nil || got.Value != 3 {
		t.Errorf("m3 changed with m2: %+v, %v", got, err)
	}
}

// checkDelete checks Delete (of a missing key too), and that ForEach
// returns its function's error.
func checkDelete(t *testing.T, s store.Store) {
	t.Helper()
	var got rec
	for _, k := range []string{"m2", "one", "never"} {
		if err := s.Delete("b", k); err != nil {
			t.Errorf("Delete %s: %v", k, err)
		}
	}
	if err := s.Get("b", "m2", &got); !errdefs.IsNotFound(err) {
		t.Errorf("deleted m2: %v", err)
	}
	if err := s.Update("b", "one", rec{ID: "one"}); !errdefs.IsNotFound(err) {
		t.Errorf("Update of a deleted record = %v, want ErrNotFound", err)
	}
	var keys []string
	s.ForEach("b", func(k string, raw []byte) error { keys = append(keys, k); return nil })
	if want := []string{"m0", "m1", "m3", "m4"}; !slices.Equal(keys, want) {
		t.Errorf("after deletes, keys = %v, want %v", keys, want)
	}
	stop := errors.New("stop")
	if err := s.ForEach("b", func(string, []byte) error { return stop }); !errors.Is(err, stop) {
		t.Errorf("ForEach does not return fn's error: %v", err)
	}
	if err := s.Get("other", "one", &got); err != nil || got.ID != "x" {
		t.Errorf("other bucket: %+v %v", got, err)
	}
}

package kstore_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/moat-sandbox/moat/internal/errdefs"
	"github.com/moat-sandbox/moat/internal/k8s/kclient"
	"github.com/moat-sandbox/moat/internal/k8s/kstore"
	"github.com/moat-sandbox/moat/internal/store/storetest"
	"github.com/moat-sandbox/moat/internal/testutil/k8stest"
)

var env *k8stest.Env

func TestMain(m *testing.M) { k8stest.Main(m, &env, k8stest.Options{Nodes: 1}) }

var nsSeq atomic.Int32

func namespace(t *testing.T) string {
	t.Helper()
	c, err := client.New(env.Config, client.Options{Scheme: kclient.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	ns := fmt.Sprintf("kstore%d", nsSeq.Add(1))
	if err := c.Create(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
		t.Fatal(err)
	}
	return ns
}

func open(t *testing.T, ns string) *kstore.Store {
	t.Helper()
	s, err := kstore.New(env.Config, kstore.Options{Namespace: ns, Scope: "test"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func TestConformance(t *testing.T) {
	k8stest.Require(t, env)
	storetest.Run(t, open(t, namespace(t)))
}

type rec struct {
	ID    string `json:"id"`
	Value int    `json:"value"`
}

func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestReplicas: two stores on one scope (two replicas) see each other's
// records and changes through Watch (never their own), a record one
// deleted is not made again by the other's update, and concurrent
// updates of different records of one group are all kept.
func TestReplicas(t *testing.T) {
	k8stest.Require(t, env)
	ns := namespace(t)
	a, b := open(t, ns), open(t, ns)
	var mu sync.Mutex
	seenA, seenB := map[string][]byte{}, map[string][]byte{}
	watch := func(s *kstore.Store, seen map[string][]byte) {
		s.Watch(context.Background(), "sb", func(k string, raw []byte) {
			mu.Lock()
			defer mu.Unlock()
			seen[k] = raw
		})
	}
	watch(a, seenA)
	watch(b, seenB)
	many := map[string]any{}
	for i := range 20 {
		k := fmt.Sprintf("s%02d", i)
		many[k] = rec{ID: k, Value: i}
	}
	if err := a.PutMany("sb", many); err != nil {
		t.Fatal(err)
	}
	eventually(t, "b sees a's records", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(seenB) == 20
	})
	var got rec
	if err := b.Get("sb", "s07", &got); err != nil || got.Value != 7 {
		t.Fatalf("b.Get = %+v %v", got, err)
	}
	// Concurrent updates of different records of the one group.
	var wg sync.WaitGroup
	for i := range 20 {
		s := a
		if i%2 == 1 {
			s = b
		}
		k := fmt.Sprintf("s%02d", i)
		wg.Go(func() {
			if err := s.Update("sb", k, rec{ID: k, Value: 100 + i}); err != nil {
				t.Errorf("update %s: %v", k, err)
			}
		})
	}
	wg.Wait()
	for _, s := range []*kstore.Store{a, b} {
		eventually(t, "every update kept", func() bool {
			for i := range 20 {
				var r rec
				if s.Get("sb", fmt.Sprintf("s%02d", i), &r) != nil || r.Value != 100+i {
					return false
				}
			}
			return true
		})
	}
	// b deletes a record; a's update right after does not bring it back.
	if err := b.Delete("sb", "s03"); err != nil {
		t.Fatal(err)
	}
	if err := a.Update("sb", "s03", rec{ID: "s03", Value: -1}); !errdefs.IsNotFound(err) {
		t.Errorf("update of a record another replica deleted = %v, want ErrNotFound", err)
	}
	eventually(t, "a hears of the delete", func() bool {
		mu.Lock()
		defer mu.Unlock()
		raw, ok := seenA["s03"]
		return ok && raw == nil
	})
	if err := b.Get("sb", "s03", &got); !errdefs.IsNotFound(err) {
		t.Errorf("deleted record came back: %+v %v", got, err)
	}
	mu.Lock()
	_, own := seenA["s00"]
	mu.Unlock()
	if own {
		// s00 was written only by a itself (PutMany, Update).
		t.Errorf("a was told of its own write of s00")
	}
}

// TestShared: replicas starting together agree on one shared secret.
func TestShared(t *testing.T) {
	k8stest.Require(t, env)
	ns := namespace(t)
	var wg sync.WaitGroup
	vals := make([]string, 4)
	for i := range vals {
		s := open(t, ns)
		wg.Go(func() {
			v, err := s.Shared(context.Background(), "api-key", func() []byte { return []byte(fmt.Sprintf("key-%d", i)) })
			if err != nil {
				t.Error(err)
			}
			vals[i] = string(v)
		})
	}
	wg.Wait()
	for _, v := range vals {
		if v == "" || v != vals[0] {
			t.Fatalf("replicas disagree: %v", vals)
		}
	}
}

// fakeInline is an Inline source whose records the test sets: Drop
// removes one and answers whether it is live.
type fakeInline struct {
	mu      sync.Mutex
	recs    map[string]kstore.InlineRecord
	live    map[string]bool
	dropped map[string]int
	changed func()
}

func (f *fakeInline) Records(part any) map[string]kstore.InlineRecord {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := map[string]kstore.InlineRecord{}
	for k, r := range f.recs {
		if part == nil || r.From == part {
			out[k] = r
		}
	}
	return out
}

func (f *fakeInline) Drop(_ context.Context, key string, rec kstore.InlineRecord) (bool, error) {
	f.mu.Lock()
	if cur, ok := f.recs[key]; ok && string(cur.Raw) == string(rec.Raw) {
		delete(f.recs, key)
	}
	f.dropped[key]++
	live := f.live[key]
	changed := f.changed
	f.mu.Unlock()
	changed()
	return live, nil
}

func (f *fakeInline) dropCount(key string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.dropped[key]
}

// TestInlineRecords: records of the inline source are read as the
// store's own at once and stay inline, costing no write, until a write
// moves one into a Secret of its own with the new value (the inline copy
// dropped); crowded ones (their home short of room) are moved without a
// write; a record whose owner is gone (Drop: not live) is not moved: the
// Secret the move made goes again, and a write answers ErrNotFound.
func TestInlineRecords(t *testing.T) {
	k8stest.Require(t, env)
	ns := namespace(t)
	raw := func(id string, v int) []byte { return []byte(fmt.Sprintf(`{"id":%q,"value":%d}`, id, v)) }
	f := &fakeInline{recs: map[string]kstore.InlineRecord{}, live: map[string]bool{"moved": true, "written": true}, dropped: map[string]int{}}
	open := func(after time.Duration) *kstore.Store {
		s, err := kstore.New(env.Config, kstore.Options{Namespace: ns, Scope: "inl", Inline: f, InlineBucket: "sb", MoveAfter: after})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		return s
	}
	c, err := client.New(env.Config, client.Options{Scheme: kclient.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	own := func() map[string]string {
		var list corev1.SecretList
		if err := c.List(context.Background(), &list, client.InNamespace(ns), client.MatchingLabels{kstore.LabelStore: "inl"}); err != nil {
			t.Fatal(err)
		}
		out := map[string]string{}
		for _, s := range list.Items {
			out[string(s.Data["key"])] = string(s.Data["record"])
		}
		return out
	}

	// A store that keeps them inline: reads, and writes that move.
	slow := open(time.Hour)
	f.mu.Lock()
	f.changed = func() { slow.InlineChanged(nil) }
	f.recs["written"] = kstore.InlineRecord{Raw: raw("written", 1)}
	f.recs["stale"] = kstore.InlineRecord{Raw: raw("stale", 1)}
	f.mu.Unlock()
	slow.InlineChanged(nil)
	var r rec
	if err := slow.Get("sb", "written", &r); err != nil || r.Value != 1 {
		t.Fatalf("inline record: %+v %v", r, err)
	}
	var keys []string
	slow.ForEach("sb", func(k string, _ []byte) error { keys = append(keys, k); return nil })
	if fmt.Sprint(keys) != "[stale written]" {
		t.Errorf("ForEach sees %v", keys)
	}
	if err := slow.Update("sb", "written", rec{ID: "written", Value: 2}); err != nil {
		t.Fatal(err)
	}
	if got := own()["written"]; got != `{"id":"written","value":2}` || f.dropCount("written") != 1 {
		t.Errorf("a write of an inline record: own copy %q, %d drops", got, f.dropCount("written"))
	}
	if err := slow.Get("sb", "written", &r); err != nil || r.Value != 2 {
		t.Errorf("after the write: %+v %v", r, err)
	}
	err = slow.Update("sb", "stale", rec{ID: "stale", Value: 2})
	if !errdefs.IsNotFound(err) {
		t.Errorf("a write of an inline record whose owner is gone: %v, want ErrNotFound", err)
	}
	if _, ok := own()["stale"]; ok {
		t.Error("a write of a gone inline record left a Secret of its own")
	}

	// A store that moves crowded records at once: a live one moves, a
	// gone one does not, one with room stays inline.
	f.mu.Lock()
	f.recs["moved"] = kstore.InlineRecord{Raw: raw("moved", 7), Crowded: true}
	f.recs["deleted"] = kstore.InlineRecord{Raw: raw("deleted", 7), Crowded: true}
	f.recs["roomy"] = kstore.InlineRecord{Raw: raw("roomy", 7)}
	f.live["roomy"] = true
	f.mu.Unlock()
	fast := open(20 * time.Millisecond)
	f.mu.Lock()
	f.changed = func() { slow.InlineChanged(nil); fast.InlineChanged(nil) }
	f.mu.Unlock()
	eventually(t, "moved", func() bool { return f.dropCount("moved") > 0 && f.dropCount("deleted") > 0 })
	eventually(t, "the moved record has its own Secret", func() bool { return own()["moved"] == string(raw("moved", 7)) })
	// The move of a record whose owner is gone makes its Secret and
	// deletes it again once Drop says so: it must not stay.
	eventually(t, "the Secret of a record whose owner is gone deleted", func() bool { _, ok := own()["deleted"]; return !ok })
	time.Sleep(200 * time.Millisecond) // ten times MoveAfter
	if _, ok := own()["roomy"]; ok || f.dropCount("roomy") != 0 {
		t.Errorf("a record with room was moved (%d drops)", f.dropCount("roomy"))
	}
	if err := fast.Get("sb", "roomy", &r); err != nil || r.Value != 7 {
		t.Errorf("inline record with room: %+v %v", r, err)
	}
	if err := fast.Get("sb", "moved", &r); err != nil || r.Value != 7 {
		t.Errorf("moved record: %+v %v", r, err)
	}
	eventually(t, "the gone record gone", func() bool { return fast.Get("sb", "deleted", &r) != nil })
}

// TestInlineParts: a change of one part of the inline source is read
// again alone: its records come, change and go, while a change of
// another part not announced yet is not seen until it is.
func TestInlineParts(t *testing.T) {
	k8stest.Require(t, env)
	ns := namespace(t)
	raw := func(id string, v int) []byte { return []byte(fmt.Sprintf(`{"id":%q,"value":%d}`, id, v)) }
	f := &fakeInline{recs: map[string]kstore.InlineRecord{
		"a1": {Raw: raw("a1", 1), From: "a"}, "a2": {Raw: raw("a2", 1), From: "a"},
		"b1": {Raw: raw("b1", 1), From: "b"},
	}, live: map[string]bool{}, dropped: map[string]int{}, changed: func() {}}
	s, err := kstore.New(env.Config, kstore.Options{Namespace: ns, Scope: "parts", Inline: f, InlineBucket: "sb", MoveAfter: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	var mu sync.Mutex
	var seen []string
	s.Watch(t.Context(), "sb", func(key string, raw []byte) {
		mu.Lock()
		defer mu.Unlock()
		seen = append(seen, fmt.Sprintf("%s=%s", key, raw))
	})
	value := func(key string) int {
		var r rec
		if err := s.Get("sb", key, &r); err != nil {
			return -1
		}
		return r.Value
	}
	if value("a1") != 1 || value("a2") != 1 || value("b1") != 1 {
		t.Fatalf("first listing: a1=%d a2=%d b1=%d", value("a1"), value("a2"), value("b1"))
	}
	f.mu.Lock()
	delete(f.recs, "a1")
	f.recs["a2"] = kstore.InlineRecord{Raw: raw("a2", 2), From: "a"}
	f.recs["a3"] = kstore.InlineRecord{Raw: raw("a3", 3), From: "a"}
	f.recs["b1"] = kstore.InlineRecord{Raw: raw("b1", 2), From: "b"}
	f.mu.Unlock()
	s.InlineChanged("a")
	if value("a2") != 2 || value("a3") != 3 {
		t.Errorf("after part a changed: a2=%d a3=%d, want 2 and 3", value("a2"), value("a3"))
	}
	if v := value("b1"); v != 1 {
		t.Errorf("b1=%d after a change of part a only: part b was read again", v)
	}
	want := []string{`a2={"id":"a2","value":2}`, `a3={"id":"a3","value":3}`}
	mu.Lock()
	got := slices.Sorted(slices.Values(seen))
	mu.Unlock()
	if !slices.Equal(got, want) {
		t.Errorf("watchers saw %v, want %v", got, want)
	}
	// a1 went: shown until it settles (its move's own copy may be on
	// its way), then gone.
	eventually(t, "a1 gone", func() bool { return value("a1") == -1 })
	s.InlineChanged("b")
	if v := value("b1"); v != 2 {
		t.Errorf("b1=%d after part b changed, want 2", v)
	}
}

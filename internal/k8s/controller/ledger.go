package controller

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	sbv1 "github.com/moat-sandbox/moat/api/v1alpha1"
)

// ledger is the controller's in-memory record of which pool pods belong to
// which batch. Allocation happens here, under one mutex, so a pod can never
// be handed to two batches; the record is persisted in the batch's
// annotations (one write per batch, see record) and rebuilt from all
// batches, read straight from the API server, when the controller starts.
//
// Invariants: byPod[p] = b iff p is the pod of a Pool claim of batches[b]
// or was taken by an allocation of b not yet committed or undone; a pod in
// gone is never handed out (the controller deleted or released it and the
// cache may still show it).
type ledger struct {
	mu      sync.Mutex
	loaded  bool
	batches map[types.NamespacedName]record
	byPod   map[types.NamespacedName]types.NamespacedName // pool pod -> batch
	gone    map[types.NamespacedName]time.Time
}

func newLedger() *ledger {
	return &ledger{
		batches: map[types.NamespacedName]record{},
		byPod:   map[types.NamespacedName]types.NamespacedName{},
		gone:    map[types.NamespacedName]time.Time{},
	}
}

// load rebuilds the ledger from every BatchSandbox (r must read from the
// API server, not a cache) once; later calls return at once. A batch whose
// record cannot be parsed is skipped (its reconcile reports it).
func (l *ledger) load(ctx context.Context, r client.Reader) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.loaded {
		return nil
	}
	var list sbv1.BatchSandboxList
	if err := r.List(ctx, &list); err != nil {
		return fmt.Errorf("rebuild ledger: list batches: %w", err)
	}
	for i := range list.Items {
		b := &list.Items[i]
		rec, ok, err := parseRecord(b.Annotations)
		if err != nil {
			slog.Warn("controller: ignoring an unreadable allocation record", "batch", client.ObjectKeyFromObject(b), "err", err)
			continue
		}
		if ok {
			l.recordLocked(client.ObjectKeyFromObject(b), rec)
		}
	}
	l.loaded = true
	return nil
}

// recordLocked makes rec the batch's record. Preconditions: l.mu is held.
func (l *ledger) recordLocked(batch types.NamespacedName, rec record) {
	if old, ok := l.batches[batch]; ok {
		for _, c := range old.Claims {
			if c.Pool && c.Pod != "" {
				delete(l.byPod, l.key(batch, c.Pod))
			}
		}
	}
	l.batches[batch] = rec.clone()
	for _, c := range rec.Claims {
		if c.Pool && c.Pod != "" {
			l.byPod[l.key(batch, c.Pod)] = batch
		}
	}
	now := time.Now()
	for _, p := range rec.Released {
		if _, ok := l.gone[l.key(batch, p)]; !ok {
			l.gone[l.key(batch, p)] = now
		}
	}
}

func (l *ledger) key(batch types.NamespacedName, pod string) types.NamespacedName {
	return types.NamespacedName{Namespace: batch.Namespace, Name: pod}
}

// get returns a copy of the batch's record, and whether it has one.
func (l *ledger) get(batch types.NamespacedName) (record, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	r, ok := l.batches[batch]
	return r.clone(), ok
}

// adopt records rec for a batch the ledger does not know yet (recorded by
// an earlier controller process after this one loaded) and returns the
// ledger's record.
func (l *ledger) adopt(batch types.NamespacedName, rec record) record {
	l.mu.Lock()
	defer l.mu.Unlock()
	if cur, ok := l.batches[batch]; ok {
		return cur.clone()
	}
	l.recordLocked(batch, rec)
	return rec.clone()
}

// commit records rec as the batch's persisted record.
func (l *ledger) commit(batch types.NamespacedName, rec record) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.recordLocked(batch, rec)
}

// owner returns the batch a pool pod is allocated to.
func (l *ledger) owner(pod types.NamespacedName) (types.NamespacedName, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	b, ok := l.byPod[pod]
	return b, ok
}

// taken reports whether pod is allocated or was deleted by the controller.
func (l *ledger) taken(pod types.NamespacedName) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	_, busy := l.byPod[pod]
	_, gone := l.gone[pod]
	return busy || gone
}

// allocate gives a pod to every claim of rec below replicas that has none
// (and is not done), adding claims up to replicas: a free pool pod (from
// free, in order, skipping any taken meanwhile) where warm(i) allows, else
// cold(i, replacement) names a pod to create. Taken pool pods are reserved
// at once, so concurrent allocations never share one; undo releases them
// if the record cannot be persisted. The ledger's record changes only
// with commit.
func (l *ledger) allocate(batch types.NamespacedName, rec record, replicas int, free []string,
	warm func(i int) bool, cold func(i int, replacement bool) string,
) (out record, undo func()) {
	l.mu.Lock()
	defer l.mu.Unlock()
	out = rec.clone()
	var reserved []types.NamespacedName
	fi := 0
	for i := range replicas {
		replacement := i < len(out.Claims)
		if !replacement {
			out.Claims = append(out.Claims, claim{})
		}
		c := &out.Claims[i]
		if c.Pod != "" || c.Done {
			continue
		}
		*c = claim{}
		if warm(i) {
			for fi < len(free) {
				p := l.key(batch, free[fi])
				fi++
				_, busy := l.byPod[p]
				_, gone := l.gone[p]
				if busy || gone {
					continue
				}
				l.byPod[p] = batch
				reserved = append(reserved, p)
				c.Pod, c.Pool = p.Name, true
				break
			}
		}
		if c.Pod == "" {
			c.Pod = cold(i, replacement)
		}
	}
	undo = func() {
		l.mu.Lock()
		defer l.mu.Unlock()
		for _, p := range reserved {
			if l.byPod[p] == batch {
				delete(l.byPod, p)
			}
		}
		// Pods of the committed record stay reserved.
		if cur, ok := l.batches[batch]; ok {
			for _, c := range cur.Claims {
				if c.Pool && c.Pod != "" {
					l.byPod[l.key(batch, c.Pod)] = batch
				}
			}
		}
	}
	return out, undo
}

// release forgets a batch and marks its pods gone; it returns the record.
func (l *ledger) release(batch types.NamespacedName) record {
	l.mu.Lock()
	defer l.mu.Unlock()
	rec := l.batches[batch]
	now := time.Now()
	for _, c := range rec.Claims {
		if c.Pod != "" {
			p := l.key(batch, c.Pod)
			if l.byPod[p] == batch {
				delete(l.byPod, p)
			}
			l.gone[p] = now
		}
	}
	delete(l.batches, batch)
	return rec
}

// markGone records that the controller deletes a free pool pod; false if
// it is allocated.
func (l *ledger) markGone(pod types.NamespacedName) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if _, taken := l.byPod[pod]; taken {
		return false
	}
	l.gone[pod] = time.Now()
	return true
}

// unmarkGone undoes markGone after a failed delete.
func (l *ledger) unmarkGone(pod types.NamespacedName) {
	l.mu.Lock()
	defer l.mu.Unlock()
	delete(l.gone, pod)
}

// settle drops gone entries the cache has caught up with (seenLive
// reports whether the cache still shows the pod as live). A pod that stays
// live (its delete keeps failing) stays gone: handing it out would give a
// released sandbox to a new claim.
func (l *ledger) settle(seenLive func(types.NamespacedName) bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for p := range l.gone {
		if !seenLive(p) {
			delete(l.gone, p)
		}
	}
}

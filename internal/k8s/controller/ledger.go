package controller

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	sbv1 "github.com/moat-sandbox/moat/api/v1alpha1"
)

// ledger is the controller's in-memory record of which pool pods belong to
// which batch. Allocation happens here, under one mutex, so a pod can never
// be handed to two batches; the record is persisted as the batch's status
// (one write per batch) and rebuilt from all batch statuses, read straight
// from the API server, when the controller starts.
//
// Invariants: a pod name is in at most one of byPod and gone; byPod[p] = b
// iff p is a pool claim (not Gone) in batches[b].
type ledger struct {
	mu      sync.Mutex
	loaded  bool
	batches map[types.NamespacedName][]sbv1.SandboxStatus
	byPod   map[types.NamespacedName]types.NamespacedName // pool pod -> batch
	// gone holds pods the controller deleted, until the cache shows them
	// terminating or absent (a stale cache would otherwise report them free).
	gone map[types.NamespacedName]time.Time
}

func newLedger() *ledger {
	return &ledger{
		batches: map[types.NamespacedName][]sbv1.SandboxStatus{},
		byPod:   map[types.NamespacedName]types.NamespacedName{},
		gone:    map[types.NamespacedName]time.Time{},
	}
}

// load rebuilds the ledger from every BatchSandbox (r must read from the
// API server, not a cache) once; later calls return at once.
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
		if len(b.Status.Sandboxes) > 0 {
			l.recordLocked(client.ObjectKeyFromObject(b), b.Status.Sandboxes)
		}
	}
	l.loaded = true
	return nil
}

func (l *ledger) recordLocked(batch types.NamespacedName, claims []sbv1.SandboxStatus) {
	l.batches[batch] = claims
	for _, c := range claims {
		if c.Source == sbv1.SourcePool && !c.Gone {
			l.byPod[types.NamespacedName{Namespace: batch.Namespace, Name: c.Pod}] = batch
		}
	}
}

// claims returns a copy of the batch's record, and whether it has one.
func (l *ledger) claims(batch types.NamespacedName) ([]sbv1.SandboxStatus, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	c, ok := l.batches[batch]
	return slices.Clone(c), ok
}

// update replaces the record of a batch that has one (readiness changes).
// Pool claims may only turn Gone.
func (l *ledger) update(batch types.NamespacedName, claims []sbv1.SandboxStatus) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if _, ok := l.batches[batch]; !ok {
		return
	}
	for _, c := range claims {
		if c.Source == sbv1.SourcePool && c.Gone {
			delete(l.byPod, types.NamespacedName{Namespace: batch.Namespace, Name: c.Pod})
		}
	}
	l.batches[batch] = slices.Clone(claims)
}

// owner returns the batch a pool pod is allocated to.
func (l *ledger) owner(pod types.NamespacedName) (types.NamespacedName, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	b, ok := l.byPod[pod]
	return b, ok
}

// allocated reports whether pod is taken or was deleted by the controller.
func (l *ledger) allocated(pod types.NamespacedName) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	_, taken := l.byPod[pod]
	_, gone := l.gone[pod]
	return taken || gone
}

// allocate atomically records claims for batch, taking up to want pods
// from free (pool pods in the batch's namespace, as the cache sees them):
// pick(i) says whether claim i may be served from the pool, cold(i) makes
// claim i's cold record. It returns the record and a function that undoes
// it (for a failed status write). A batch that has a record keeps it.
func (l *ledger) allocate(batch types.NamespacedName, replicas int32, free []string,
	pick func(i int32) bool, cold func(i int32) sbv1.SandboxStatus, poolClaim func(i int32, pod string) sbv1.SandboxStatus,
) (claims []sbv1.SandboxStatus, undo func(), fresh bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if c, ok := l.batches[batch]; ok {
		return slices.Clone(c), func() {}, false
	}
	claims = make([]sbv1.SandboxStatus, 0, replicas)
	var taken []types.NamespacedName
	fi := 0
	for i := range replicas {
		if pick(i) {
			for fi < len(free) {
				p := types.NamespacedName{Namespace: batch.Namespace, Name: free[fi]}
				fi++
				_, busy := l.byPod[p]
				_, gone := l.gone[p]
				if busy || gone {
					continue
				}
				l.byPod[p] = batch
				taken = append(taken, p)
				claims = append(claims, poolClaim(i, p.Name))
				goto next
			}
		}
		claims = append(claims, cold(i))
	next:
	}
	l.batches[batch] = claims
	undo = func() {
		l.mu.Lock()
		defer l.mu.Unlock()
		for _, p := range taken {
			delete(l.byPod, p)
		}
		delete(l.batches, batch)
	}
	return slices.Clone(claims), undo, true
}

// release forgets a batch and marks its pool pods gone; it returns the
// claims it had.
func (l *ledger) release(batch types.NamespacedName) []sbv1.SandboxStatus {
	l.mu.Lock()
	defer l.mu.Unlock()
	claims := l.batches[batch]
	now := time.Now()
	for _, c := range claims {
		if c.Source == sbv1.SourcePool {
			p := types.NamespacedName{Namespace: batch.Namespace, Name: c.Pod}
			delete(l.byPod, p)
			l.gone[p] = now
		}
	}
	delete(l.batches, batch)
	return claims
}

// markGone records that the controller deleted a free pool pod.
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

// settle drops gone entries the cache has caught up with (seen reports
// whether the cache still shows the pod as live) or that are old.
func (l *ledger) settle(seenLive func(types.NamespacedName) bool, maxAge time.Duration) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for p, t := range l.gone {
		if !seenLive(p) || time.Since(t) > maxAge {
			delete(l.gone, p)
		}
	}
}

// counts returns the number of pods allocated from each pool pod set.
func (l *ledger) allocatedIn(pods []types.NamespacedName) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, p := range pods {
		if _, ok := l.byPod[p]; ok {
			n++
		}
	}
	return n
}

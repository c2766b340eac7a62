package controller

import (
	"context"
	"fmt"
	"sync"
	"testing"

	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	sbv1 "github.com/moat-sandbox/moat/api/v1alpha1"
)

func allocN(l *ledger, batch string, n int32, free []string) ([]sbv1.SandboxStatus, func()) {
	claims, undo, _ := l.allocate(types.NamespacedName{Namespace: "ns", Name: batch}, n, free,
		func(int32) bool { return true },
		func(i int32) sbv1.SandboxStatus {
			return sbv1.SandboxStatus{Index: i, Pod: coldPodName(batch, "u1", i), Source: sbv1.SourceCold}
		},
		func(i int32, pod string) sbv1.SandboxStatus {
			return sbv1.SandboxStatus{Index: i, Pod: pod, Source: sbv1.SourcePool}
		})
	return claims, undo
}

func TestLedgerConcurrentAllocation(t *testing.T) {
	l := newLedger()
	l.loaded = true
	var free []string
	for i := range 50 {
		free = append(free, fmt.Sprintf("pod-%d", i))
	}
	var mu sync.Mutex
	owner := map[string]string{}
	warm, cold := 0, 0
	var wg sync.WaitGroup
	for b := range 20 {
		wg.Go(func() {
			name := fmt.Sprintf("b%d", b)
			claims, _ := allocN(l, name, 4, free)
			mu.Lock()
			defer mu.Unlock()
			for _, c := range claims {
				if prev, ok := owner[c.Pod]; ok {
					t.Errorf("pod %s given to %s and %s", c.Pod, prev, name)
				}
				owner[c.Pod] = name
				if c.Source == sbv1.SourcePool {
					warm++
				} else {
					cold++
				}
			}
		})
	}
	wg.Wait()
	if warm != 50 || cold != 30 {
		t.Errorf("warm %d cold %d, want 50 and 30", warm, cold)
	}
}

func TestLedgerUndoReleaseAndReload(t *testing.T) {
	l := newLedger()
	l.loaded = true
	free := []string{"p0", "p1", "p2"}
	_, undo := allocN(l, "a", 2, free)
	undo()
	claims, _ := allocN(l, "b", 3, free)
	if claims[2].Source != sbv1.SourcePool {
		t.Fatalf("undo did not free the pods: %+v", claims)
	}
	// A batch's second allocate returns its record, taking nothing more.
	again, _ := allocN(l, "b", 3, []string{"p9"})
	if again[0].Pod != claims[0].Pod {
		t.Errorf("re-allocate changed the record: %+v", again)
	}
	// Released pods are gone: never handed out again, even if a stale
	// cache lists them as free.
	l.release(types.NamespacedName{Namespace: "ns", Name: "b"})
	c2, _ := allocN(l, "c", 1, free)
	if c2[0].Source != sbv1.SourceCold {
		t.Errorf("released pod re-allocated: %+v", c2)
	}

	// Reload from batch statuses (a controller restart).
	rec := &sbv1.BatchSandbox{}
	rec.Namespace, rec.Name = "ns", "x"
	rec.Status.Sandboxes = []sbv1.SandboxStatus{{Index: 0, Pod: "q0", Source: sbv1.SourcePool}, {Index: 1, Pod: "q1", Source: sbv1.SourcePool, Gone: true}}
	r := fake.NewClientBuilder().WithScheme(Scheme()).WithObjects(rec).WithStatusSubresource(rec).Build()
	l2 := newLedger()
	if err := l2.load(context.Background(), r); err != nil {
		t.Fatal(err)
	}
	if !l2.allocated(client.ObjectKey{Namespace: "ns", Name: "q0"}) {
		t.Error("reloaded ledger lost q0")
	}
	if l2.allocated(client.ObjectKey{Namespace: "ns", Name: "q1"}) {
		t.Error("gone pod q1 counted as allocated")
	}
	got, _ := allocN(l2, "y", 2, []string{"q0", "q1"})
	if got[0].Pod != "q1" || got[1].Source != sbv1.SourceCold {
		t.Errorf("after reload: %+v", got)
	}
}

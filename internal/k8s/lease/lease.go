// Package lease elects one leader among the replicas of a process on
// Kubernetes (client-go's leader election on a coordination.k8s.io Lease):
// the replicas of a stateless `moat serve` run their background duties
// (expiry, liveness, orphan clean-up) on the leader only.
package lease

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"sync/atomic"
	"time"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
)

// Timing of the election (client-go's defaults): a leader that stops
// renewing is replaced within LeaseDuration.
const (
	LeaseDuration = 15 * time.Second
	RenewDeadline = 10 * time.Second
	RetryPeriod   = 2 * time.Second
)

// Elector runs an election until its context ends.
type Elector struct {
	id     string
	leader atomic.Bool
}

// Identity returns this candidate's name (hostname and a random part).
func (e *Elector) Identity() string { return e.id }

// IsLeader reports whether this process leads now.
func (e *Elector) IsLeader() bool { return e.leader.Load() }

// Run campaigns for Lease name in namespace ns until ctx ends (then it
// gives the lease up), re-campaigning after a lost term. It returns at
// once.
func Run(ctx context.Context, rc *rest.Config, ns, name string) (*Elector, error) {
	host, _ := os.Hostname()
	b := make([]byte, 4)
	rand.Read(b)
	e := &Elector{id: host + "-" + hex.EncodeToString(b)}
	lock, err := resourcelock.NewFromKubeconfig(resourcelock.LeasesResourceLock, ns, name,
		resourcelock.ResourceLockConfig{Identity: e.id}, rc, RenewDeadline)
	if err != nil {
		return nil, fmt.Errorf("lease %s/%s: %w", ns, name, err)
	}
	le, err := leaderelection.NewLeaderElector(leaderelection.LeaderElectionConfig{
		Lock: lock, LeaseDuration: LeaseDuration, RenewDeadline: RenewDeadline, RetryPeriod: RetryPeriod,
		ReleaseOnCancel: true, Name: name,
		Callbacks: leaderelection.LeaderCallbacks{
			OnStartedLeading: func(context.Context) { e.leader.Store(true) },
			OnStoppedLeading: func() { e.leader.Store(false) },
		},
	})
	if err != nil {
		return nil, fmt.Errorf("lease %s/%s: %w", ns, name, err)
	}
	go func() {
		for ctx.Err() == nil {
			le.Run(ctx) // returns when a term ends
		}
	}()
	return e, nil
}

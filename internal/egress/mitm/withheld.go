package mitm

import (
	"context"
	"net/netip"
	"sync"
	"time"
)

// Withheld is a credential the proxy did not inject: the request matched
// Binding, but its destination Dst is not an address moat's DNS resolved
// for Host, nor one the binding trusts (match.trustedCidrs).
type Withheld struct {
	Binding string
	Host    string
	Dst     netip.Addr
}

// Bounds of a client's withheld-credential reports.
const (
	// WithheldInterval: at most one report per binding and host in this
	// long.
	WithheldInterval = time.Minute
	// MaxWithheldKeys is how many binding and host pairs a client tracks;
	// while that many were reported within WithheldInterval, reports of
	// other pairs are dropped.
	MaxWithheldKeys = 64
)

// OnWithheld sets the function told of withheld credentials, at most once
// per binding and host in WithheldInterval (MaxWithheldKeys); nil: none.
// It runs on a goroutine of its own, never delaying the request. Setting
// it again keeps what was reported.
func (c *Client) OnWithheld(fn func(ctx context.Context, w Withheld)) {
	if fn == nil {
		c.withheld.Store(nil)
		return
	}
	th := newThrottle(WithheldInterval, MaxWithheldKeys, time.Now)
	if old := c.withheld.Load(); old != nil {
		th = old.throttle
	}
	c.withheld.Store(&withheldReporter{fn: fn, throttle: th})
}

// withheldReporter is a client's OnWithheld function and its throttle.
type withheldReporter struct {
	fn       func(ctx context.Context, w Withheld)
	throttle *throttle
}

// reportWithheld returns the client's OnWithheld function if w is to be
// reported (the throttle lets it through), else nil.
func (c *Client) reportWithheld(w Withheld) func(ctx context.Context, w Withheld) {
	r := c.withheld.Load()
	if r == nil || !r.throttle.allow(w.Binding+"\x00"+w.Host) {
		return nil
	}
	return r.fn
}

// throttle lets a key through at most once per interval, tracking at most
// max keys: when that many went through within the interval, a new key is
// held back (memory and the rate of reports stay bounded whatever the
// sandbox sends).
type throttle struct {
	every time.Duration
	max   int
	now   func() time.Time

	mu   sync.Mutex
	last map[string]time.Time // when each key last went through
}

func newThrottle(every time.Duration, keys int, now func() time.Time) *throttle {
	return &throttle{every: every, max: keys, now: now, last: map[string]time.Time{}}
}

// allow reports whether key may go through now, and if so records it.
func (t *throttle) allow(key string) bool {
	now := t.now()
	t.mu.Lock()
	defer t.mu.Unlock()
	if at, ok := t.last[key]; ok {
		if now.Sub(at) < t.every {
			return false
		}
	} else if len(t.last) >= t.max {
		for k, at := range t.last {
			if now.Sub(at) >= t.every {
				delete(t.last, k)
			}
		}
		if len(t.last) >= t.max {
			return false
		}
	}
	t.last[key] = now
	return true
}

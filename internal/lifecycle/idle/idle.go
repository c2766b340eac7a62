// Package idle is the idle policies of sandboxes: a sandbox created with
// extension moat.idle.timeout (seconds) is paused (frozen, its memory
// kept) once nothing has reached it for that long, and a request that
// reaches it while it is so paused wakes it: the request is held while
// the sandbox resumes, then proceeds. Many requests at once cause one
// resume. It plugs into the lifecycle core as lifecycle.IdlePolicies.
//
// Activity is what the server sees: requests through the server proxy,
// the ingress gateway (plain and signed routes) and endpoint lookups (an
// SDK's connect), all of which call Access. Traffic that goes straight to
// a sandbox's address does not pass the server and is not seen.
package idle

import (
	"context"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"time"

	"github.com/moat-sandbox/moat/internal/errdefs"
	"github.com/moat-sandbox/moat/internal/lifecycle"
	"github.com/moat-sandbox/moat/internal/runtime"
)

// Extension keys of an idle policy.
const (
	// ExtTimeout is the idle timeout in seconds (1..MaxTimeout).
	ExtTimeout = lifecycle.ExtIdlePrefix + "timeout"
	// ExtAction is what happens when the timeout runs out: ActionPause
	// (the default) or ActionHibernate.
	ExtAction = lifecycle.ExtIdlePrefix + "action"
)

// Idle actions (ExtAction).
const (
	// ActionPause freezes the sandbox; its memory stays in place.
	ActionPause = "pause"
	// ActionHibernate would write the sandbox's memory to disk; no
	// runtime class of this server does it yet, so it is refused.
	ActionHibernate = "hibernate"
)

// MaxTimeout bounds ExtTimeout.
const MaxTimeout = 7 * 24 * time.Hour

// Routes that wake a sandbox (Access's via), as Woken events name them.
const (
	ViaProxy    = "a request through the server proxy"
	ViaIngress  = "an ingress request"
	ViaEndpoint = "an endpoint lookup"
)

// Wake outcomes (Metrics.ObserveWake).
const (
	WakeOK      = "ok"      // the sandbox is Running again
	WakeFailed  = "failed"  // the runtime could not resume it
	WakeTimeout = "timeout" // a request gave up waiting (WakeBudget)
)

// Policy is a sandbox's idle policy; the zero Policy is none.
type Policy struct {
	Timeout time.Duration
	Action  string
}

// PolicyOf parses the idle policy in a sandbox's extensions.
func PolicyOf(ext map[string]string) (Policy, error) {
	v, ok := ext[ExtTimeout]
	action, hasAction := ext[ExtAction]
	if !ok {
		if hasAction {
			return Policy{}, invalid(fmt.Sprintf("extensions[%s] needs extensions[%s]", ExtAction, ExtTimeout))
		}
		return Policy{}, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 || time.Duration(n)*time.Second > MaxTimeout {
		return Policy{}, invalid(fmt.Sprintf("extensions[%s]: must be an integer number of seconds between 1 and %d", ExtTimeout, int(MaxTimeout.Seconds())))
	}
	if !hasAction {
		action = ActionPause
	}
	if action != ActionPause && action != ActionHibernate {
		return Policy{}, invalid(fmt.Sprintf("extensions[%s]: %q is not %s or %s", ExtAction, action, ActionPause, ActionHibernate))
	}
	return Policy{Timeout: time.Duration(n) * time.Second, Action: action}, nil
}

func invalid(msg string) error { return errdefs.Invalid("SANDBOX::INVALID_PARAMETER", msg) }

// Config tunes the feature. Zero values take the documented defaults.
type Config struct {
	// Interval is how often sandboxes are checked for idleness. Default 1s.
	Interval time.Duration
	// WakeBudget bounds how long a request waits for its sandbox to wake
	// before it is answered 503 with Retry-After (the wake goes on).
	// Default 30s.
	WakeBudget time.Duration
	// RetryAfter is the Retry-After of that answer. Default 2s.
	RetryAfter time.Duration
}

func (c *Config) setDefaults() {
	if c.Interval == 0 {
		c.Interval = time.Second
	}
	if c.WakeBudget == 0 {
		c.WakeBudget = 30 * time.Second
	}
	if c.RetryAfter == 0 {
		c.RetryAfter = 2 * time.Second
	}
}

// Metrics receives the feature's observations (internal/metrics). Calls
// must not block.
type Metrics interface {
	// ObserveIdlePause records a sandbox paused by its idle policy.
	ObserveIdlePause(action string)
	// ObserveWake records a wake's outcome (WakeOK, WakeFailed, or
	// WakeTimeout for each request that gave up) and, unless it timed
	// out, how long the resume took.
	ObserveWake(outcome string, d time.Duration)
}

// Idle is the idle-policy feature. It is safe for concurrent use.
//
// mu guards seen and wakes. Lock order: a sandbox's lock before mu; mu
// is never held while the core is called.
type Idle struct {
	core    *lifecycle.Service
	rt      runtime.Runtime
	log     *slog.Logger
	cfg     Config
	metrics Metrics
	leader  func() bool
	// started is when the feature started: a sandbox it has seen no
	// activity of since is idle from then at the earliest (a restarted
	// server does not pause everything at once).
	started time.Time

	mu sync.Mutex
	// seen is the last activity of each sandbox (by ID).
	seen map[string]time.Time
	// wakes are the wakes in flight, by sandbox ID: the requests that
	// reach a waking sandbox wait for the same one.
	wakes map[string]*wake
}

// wake is one resume of an idle-paused sandbox; err is set before done
// is closed.
type wake struct {
	done chan struct{}
	err  error
}

// New returns the idle feature of core; metrics is optional.
func New(core *lifecycle.Service, cfg Config, metrics Metrics) *Idle {
	cfg.setDefaults()
	d := core.Deps()
	leader := d.Leader
	if leader == nil {
		leader = func() bool { return true }
	}
	return &Idle{core: core, rt: d.Runtime, log: d.Log, cfg: cfg, metrics: metrics, leader: leader,
		started: core.Now(), seen: map[string]time.Time{}, wakes: map[string]*wake{}}
}

// CheckPolicy validates the idle policy of a new sandbox's record: its
// runtime must be able to pause sandboxes, and hibernation is refused.
func (f *Idle) CheckPolicy(sb *lifecycle.Sandbox) error {
	p, err := PolicyOf(sb.Extensions)
	if err != nil || p.Timeout == 0 {
		return err
	}
	if _, ok := f.rt.(runtime.Pauser); !ok {
		return errdefs.WithPublic(errdefs.ErrNotImplemented, "SANDBOX::API_NOT_SUPPORTED",
			fmt.Sprintf("extensions[%s]: the %s runtime cannot pause sandboxes", ExtTimeout, f.rt.Name()))
	}
	if p.Action == ActionHibernate {
		class := sb.Class
		if class == "" {
			class = f.rt.Name()
		}
		return errdefs.WithPublic(errdefs.ErrNotImplemented, "SANDBOX::API_NOT_SUPPORTED",
			fmt.Sprintf("extensions[%s]: runtime %s cannot hibernate sandboxes; use %s", ExtAction, class, ActionPause))
	}
	return nil
}

// Access records activity of sandbox id and, if its idle policy paused
// it, wakes it: Access returns once it is Running again. A wake that does
// not finish within the WakeBudget is an ErrUnavailable error with a
// Retry-After (503). via names the route (ViaProxy...) for the Woken
// event. A sandbox ctx does not see is left alone (nil: the caller's own
// lookup answers).
func (f *Idle) Access(ctx context.Context, id, via string) error {
	f.mu.Lock()
	w := f.wakes[id]
	if w != nil {
		f.seen[id] = f.core.Now()
	}
	f.mu.Unlock()
	if w == nil {
		var paused bool
		err := f.core.WithLock(ctx, id, func(e *lifecycle.Entry) error {
			paused = idlePaused(e.Sandbox())
			f.touch(id) // only sandboxes that exist: the proxy route is open
			return nil
		})
		if err != nil || !paused {
			return nil
		}
		w = f.startWake(id, via)
	}
	return f.await(ctx, id, w)
}

// touch records activity of sandbox id now.
func (f *Idle) touch(id string) {
	f.mu.Lock()
	f.seen[id] = f.core.Now()
	f.mu.Unlock()
}

func idlePaused(sb *lifecycle.Sandbox) bool {
	return sb.Status.State == lifecycle.StatePaused && sb.Status.Reason == lifecycle.ReasonIdlePaused
}

// startWake returns the wake in flight of sandbox id, starting one if
// there is none. The wake runs on its own: it finishes even when every
// request that waits for it has gone.
func (f *Idle) startWake(id, via string) *wake {
	f.mu.Lock()
	defer f.mu.Unlock()
	if w := f.wakes[id]; w != nil {
		return w
	}
	w := &wake{done: make(chan struct{})}
	f.wakes[id] = w
	go func() {
		start := time.Now()
		var woke bool
		// The caller was checked to see the sandbox; the wake itself is
		// the server's.
		err := f.core.WithLock(context.Background(), id, func(e *lifecycle.Entry) error {
			if !idlePaused(e.Sandbox()) {
				return nil // woken or deleted meanwhile
			}
			woke = true
			return e.Resume(context.Background(), lifecycle.ReasonWaking, "woken by "+via)
		})
		switch {
		case errdefs.IsNotFound(err):
			err = nil // deleted meanwhile: the caller's lookup says so
		case err != nil:
			f.log.Warn("wake idle sandbox", "id", id, "err", err)
			f.observeWake(WakeFailed, time.Since(start))
		case woke:
			f.log.Info("woke idle sandbox", "id", id, "via", via, "took", time.Since(start))
			f.observeWake(WakeOK, time.Since(start))
		}
		f.mu.Lock()
		delete(f.wakes, id)
		if err == nil {
			f.seen[id] = f.core.Now()
		}
		f.mu.Unlock()
		w.err = err
		close(w.done)
	}()
	return w
}

// await waits for w within the WakeBudget.
func (f *Idle) await(ctx context.Context, id string, w *wake) error {
	t := time.NewTimer(f.cfg.WakeBudget)
	defer t.Stop()
	select {
	case <-w.done:
		if w.err != nil {
			return errdefs.WithRetryAfter(errdefs.WithPublic(fmt.Errorf("wake sandbox %s: %w: %w", id, w.err, errdefs.ErrUnavailable),
				"SANDBOX::WAKE_FAILED", fmt.Sprintf("sandbox %s is paused for idleness and could not be woken", id)), f.cfg.RetryAfter)
		}
		return nil
	case <-t.C:
		f.observeWake(WakeTimeout, 0)
		return errdefs.WithRetryAfter(errdefs.WithPublic(fmt.Errorf("wake sandbox %s: not done within %s: %w", id, f.cfg.WakeBudget, errdefs.ErrUnavailable),
			"SANDBOX::WAKING", fmt.Sprintf("sandbox %s is waking up from an idle pause; retry shortly", id)), f.cfg.RetryAfter)
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (f *Idle) observeWake(outcome string, d time.Duration) {
	if f.metrics != nil {
		f.metrics.ObserveWake(outcome, d)
	}
}

// Run pauses idle sandboxes every Interval until ctx is done (on the
// leader of replicas sharing a store; see lifecycle.Deps.Leader).
func (f *Idle) Run(ctx context.Context) {
	t := time.NewTicker(f.cfg.Interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if f.leader() {
			f.Sweep(ctx)
		}
	}
}

// Sweep pauses the Running sandboxes whose idle timeout has run out: no
// activity (Access) since, nor a change of state (a create, a resume, a
// claim from a pool). A sandbox busy with another operation is looked at
// on the next sweep.
func (f *Idle) Sweep(ctx context.Context) {
	now := f.core.Now()
	f.mu.Lock()
	seen := make(map[string]time.Time, len(f.seen))
	for id, t := range f.seen {
		if now.Sub(t) > MaxTimeout {
			delete(f.seen, id) // it no longer matters: any policy ran out
			continue
		}
		seen[id] = t
	}
	f.mu.Unlock()
	f.core.TryEach(func(e *lifecycle.Entry) {
		sb := e.Sandbox()
		if sb.Warm || sb.Status.State != lifecycle.StateRunning {
			return
		}
		p, err := PolicyOf(sb.Extensions)
		if err != nil || p.Timeout == 0 {
			return
		}
		last := f.started
		for _, t := range []time.Time{seen[sb.ID], sb.Status.LastTransitionAt} {
			if t.After(last) {
				last = t
			}
		}
		if now.Sub(last) < p.Timeout {
			return
		}
		msg := fmt.Sprintf("no activity for %ds (idle timeout %ds)", int(now.Sub(last).Seconds()), int(p.Timeout.Seconds()))
		if err := e.Pause(ctx, lifecycle.ReasonIdlePaused, msg); err != nil {
			f.log.Warn("pause idle sandbox", "id", sb.ID, "err", err)
			return
		}
		f.log.Info("paused idle sandbox", "id", sb.ID, "idle", now.Sub(last), "timeout", p.Timeout)
		if f.metrics != nil {
			f.metrics.ObserveIdlePause(p.Action)
		}
	})
}

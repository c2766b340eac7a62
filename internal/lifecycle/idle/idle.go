// Package idle is the idle policies of sandboxes: a sandbox created with
// extension moat.idle.timeout (seconds) is paused (frozen, its memory
// kept) or hibernated (moat.idle.action hibernate: its processes stopped
// and their memory freed) once nothing has reached it for that long and,
// with moat.idle.cpuBelow, its CPU use over that time stayed below a
// share of a core. A request that reaches it while it is so paused wakes
// it: the request is held while the sandbox resumes, then proceeds. Many
// requests at once cause one resume. It plugs into the lifecycle core as
// lifecycle.IdlePolicies.
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
	// ExtCPUBelow is an optional CPU threshold in percent of one core
	// (0 < x <= MaxCPUBelow): the sandbox is idle only if its CPU use
	// over the idle timeout averaged below it.
	ExtCPUBelow = lifecycle.ExtIdlePrefix + "cpuBelow"
)

// MaxCPUBelow bounds ExtCPUBelow (percent: 64 cores).
const MaxCPUBelow = 6400

// Idle actions (ExtAction).
const (
	// ActionPause freezes the sandbox; its memory stays in place.
	ActionPause = "pause"
	// ActionHibernate stops its processes and frees their memory: on
	// gVisor (runsc) the memory is written to disk and the processes
	// continue on wake; on runc and crun the writable layer is kept and
	// the processes start afresh on wake (runtime.Hibernator).
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
	// CPUBelow is ExtCPUBelow, in percent of one core; 0 is none.
	CPUBelow float64
}

// PolicyOf parses the idle policy in a sandbox's extensions.
func PolicyOf(ext map[string]string) (Policy, error) {
	v, ok := ext[ExtTimeout]
	action, hasAction := ext[ExtAction]
	cpu, hasCPU := ext[ExtCPUBelow]
	if !ok {
		for k, set := range map[string]bool{ExtAction: hasAction, ExtCPUBelow: hasCPU} {
			if set {
				return Policy{}, invalid(fmt.Sprintf("extensions[%s] needs extensions[%s]", k, ExtTimeout))
			}
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
	p := Policy{Timeout: time.Duration(n) * time.Second, Action: action}
	if hasCPU {
		f, err := strconv.ParseFloat(cpu, 64)
		if err != nil || !(f > 0 && f <= MaxCPUBelow) {
			return Policy{}, invalid(fmt.Sprintf("extensions[%s]: must be a percentage of one core above 0 and at most %d", ExtCPUBelow, MaxCPUBelow))
		}
		p.CPUBelow = f
	}
	return p, nil
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
	// ObserveIdlePause records a sandbox paused by its idle policy
	// (action ActionPause or ActionHibernate).
	ObserveIdlePause(action string)
	// ObserveWake records a wake's outcome (WakeOK, WakeFailed, or
	// WakeTimeout for each request that gave up) and, unless it timed
	// out, how long the resume took.
	ObserveWake(outcome string, d time.Duration)
}

// Idle is the idle-policy feature. It is safe for concurrent use.
//
// mu guards sandboxes and wakes. Lock order: a sandbox's lock before mu;
// mu is never held while the core is called.
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
	// sandboxes are the sandboxes with an idle policy, by ID, as the
	// last sweep found them, with their activity.
	sandboxes map[string]*tracked
	// wakes are the wakes in flight, by sandbox ID: the requests that
	// reach a waking sandbox wait for the same one.
	wakes map[string]*wake
}

// tracked is a sandbox with an idle policy. Guarded by Idle.mu.
type tracked struct {
	owner string // the sandbox's tenant (fixed)
	// seen is the last activity; inflight counts the requests under way
	// (a sandbox with one is never idle).
	seen     time.Time
	inflight int
	// pausing is set while a sweep pauses the sandbox, paused while its
	// idle policy holds it paused: a request then wakes it.
	pausing, paused bool
	// swept is when a sweep last found the sandbox.
	swept time.Time
	// cpu is the CPU counter's history over the idle timeout (a policy
	// with CPUBelow), oldest first, while the sandbox runs.
	cpu []cpuSample
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
		started: core.Now(), sandboxes: map[string]*tracked{}, wakes: map[string]*wake{}}
}

// CheckPolicy validates the idle policy of a new sandbox's record: its
// runtime must be able to pause sandboxes, hibernate those of its class
// (ActionHibernate) and read their CPU use (CPUBelow).
func (f *Idle) CheckPolicy(sb *lifecycle.Sandbox) error {
	p, err := PolicyOf(sb.Extensions)
	if err != nil || p.Timeout == 0 {
		return err
	}
	if _, ok := f.rt.(runtime.Pauser); !ok {
		return errdefs.WithPublic(errdefs.ErrNotImplemented, "SANDBOX::API_NOT_SUPPORTED",
			fmt.Sprintf("extensions[%s]: the %s runtime cannot pause sandboxes", ExtTimeout, f.rt.Name()))
	}
	if p.Action == ActionHibernate && lifecycle.Hibernator(f.rt, sb.Class) == nil {
		class := sb.Class
		if class == "" {
			class = f.rt.Name()
		}
		return errdefs.WithPublic(errdefs.ErrNotImplemented, "SANDBOX::API_NOT_SUPPORTED",
			fmt.Sprintf("extensions[%s]: runtime %s cannot hibernate sandboxes; use %s", ExtAction, class, ActionPause))
	}
	if _, ok := f.rt.(runtime.CPUReader); p.CPUBelow > 0 && !ok {
		return errdefs.WithPublic(errdefs.ErrNotImplemented, "SANDBOX::API_NOT_SUPPORTED",
			fmt.Sprintf("extensions[%s]: the %s runtime cannot tell the CPU use of sandboxes", ExtCPUBelow, f.rt.Name()))
	}
	return nil
}

// Access records a request to sandbox id and, if its idle policy paused
// it, wakes it: Access returns once it is Running again. A wake that does
// not finish within the WakeBudget is an ErrUnavailable error with a
// Retry-After (503). via names the route (ViaProxy...) for the Woken
// event. The caller calls done once the request is over (a sandbox with
// a request under way is never idle); done is never nil. A sandbox ctx
// does not see, or one without an idle policy, is left alone.
func (f *Idle) Access(ctx context.Context, id, via string) (done func(), err error) {
	f.mu.Lock()
	r := f.sandboxes[id]
	if r == nil {
		// Not swept yet (created within the last sweep interval), or
		// without a policy (the next sweep forgets it): its activity is
		// counted for the first sweep, which a request under way (a
		// long first command) must keep from pausing it. It is not paused,
		// so there is nothing to wake.
		r = &tracked{}
		f.sandboxes[id] = r
	} else if r.owner != "" && !lifecycle.Visible(ctx, r.owner) {
		f.mu.Unlock()
		return func() {}, nil
	}
	r.seen = f.core.Now()
	r.inflight++
	var w *wake
	if r.paused || r.pausing {
		w = f.startWakeLocked(id, via)
	}
	f.mu.Unlock()
	var once sync.Once
	done = func() {
		once.Do(func() {
			f.mu.Lock()
			r.inflight--
			r.seen = f.core.Now()
			f.mu.Unlock()
		})
	}
	if w != nil {
		if err := f.await(ctx, id, w); err != nil {
			done()
			return func() {}, err
		}
	}
	return done, nil
}

// idlePaused reports whether sb's idle policy paused or hibernated it.
func idlePaused(sb *lifecycle.Sandbox) bool {
	r := sb.Status.Reason
	return sb.Status.State == lifecycle.StatePaused && (r == lifecycle.ReasonIdlePaused || r == lifecycle.ReasonIdleHibernated)
}

// startWakeLocked returns the wake in flight of sandbox id, starting
// one if there is none; the caller holds f.mu. The wake runs on its own:
// it finishes even when every request that waits for it has gone.
func (f *Idle) startWakeLocked(id, via string) *wake {
	if w := f.wakes[id]; w != nil {
		return w
	}
	w := &wake{done: make(chan struct{})}
	f.wakes[id] = w
	go func() {
		start := time.Now()
		var woke bool
		// The caller was checked to see the sandbox; the wake itself is
		// the server's. A pause under way finishes first (the lock).
		err := f.core.WithLock(context.Background(), id, func(e *lifecycle.Entry) error {
			if !idlePaused(e.Sandbox()) {
				return nil // resumed or paused through the API meanwhile
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
		if r := f.sandboxes[id]; r != nil && err == nil {
			r.paused = false
			r.seen = f.core.Now()
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

// Run sweeps every Interval until ctx is done, starting at once (the
// sandboxes a restarted server re-adopted paused are woken on access
// from then on).
func (f *Idle) Run(ctx context.Context) {
	t := time.NewTicker(f.cfg.Interval)
	defer t.Stop()
	for {
		f.Sweep(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// forgetAfter is how long a sandbox no sweep found (deleted, or busy
// with a long operation) keeps its activity record.
const forgetAfter = time.Minute

// Sweep finds the sandboxes with an idle policy and pauses the Running
// ones whose idle timeout has run out: no request to them (Access) since,
// none under way, and no change of state (a create, a resume, a claim
// from a pool) since. Only the leader of replicas sharing a store pauses
// (lifecycle.Deps.Leader); every replica wakes. A sandbox busy with
// another operation is looked at on the next sweep.
func (f *Idle) Sweep(ctx context.Context) {
	now := f.core.Now()
	leader := f.leader()
	f.core.TryEach(func(e *lifecycle.Entry) {
		sb := e.Sandbox()
		p, err := PolicyOf(sb.Extensions)
		if sb.Warm || err != nil || p.Timeout == 0 {
			return
		}
		f.mu.Lock()
		r := f.sandboxes[sb.ID]
		if r == nil {
			r = &tracked{}
			f.sandboxes[sb.ID] = r
		}
		r.owner, r.swept = e.Owner(), now
		r.paused = idlePaused(sb)
		last := f.started
		for _, t := range []time.Time{r.seen, sb.Status.LastTransitionAt} {
			if t.After(last) {
				last = t
			}
		}
		running := sb.Status.State == lifecycle.StateRunning
		cpuOK, cpuPct := true, 0.0
		if p.CPUBelow > 0 {
			cpuOK, cpuPct = f.cpuIdle(ctx, r, sb.ID, running, now, p)
		}
		// Decided and marked under mu: a request from now on wakes it.
		due := leader && running && cpuOK && r.inflight == 0 && now.Sub(last) >= p.Timeout
		r.pausing = due
		f.mu.Unlock()
		if !due {
			return
		}
		msg := fmt.Sprintf("no activity for %ds (idle timeout %ds)", int(now.Sub(last).Seconds()), int(p.Timeout.Seconds()))
		if p.CPUBelow > 0 {
			msg += fmt.Sprintf(", CPU %.1f%% (below %g%%)", cpuPct, p.CPUBelow)
		}
		if p.Action == ActionHibernate {
			var h runtime.Hibernation
			h, err = e.Hibernate(ctx, lifecycle.ReasonIdleHibernated, msg)
			if err == nil {
				f.log.Info("hibernated idle sandbox", "id", sb.ID, "mode", h.Mode, "freed", h.FreedBytes, "image", h.DiskBytes)
			}
		} else {
			err = e.Pause(ctx, lifecycle.ReasonIdlePaused, msg)
		}
		f.mu.Lock()
		r.pausing, r.paused = false, err == nil
		f.mu.Unlock()
		if err != nil {
			f.log.Warn("pause idle sandbox", "id", sb.ID, "err", err)
			return
		}
		f.log.Info("paused idle sandbox", "id", sb.ID, "idle", now.Sub(last), "timeout", p.Timeout)
		if f.metrics != nil {
			f.metrics.ObserveIdlePause(p.Action)
		}
	})
	f.mu.Lock()
	for id, r := range f.sandboxes {
		if now.Sub(r.swept) > forgetAfter && r.inflight == 0 && f.wakes[id] == nil {
			delete(f.sandboxes, id)
		}
	}
	f.mu.Unlock()
}

// cpuSamples is how many CPU readings cover an idle timeout at most.
const cpuSamples = 64

// cpuSample is a reading of a sandbox's CPU counter.
type cpuSample struct {
	at   time.Time
	used time.Duration
}

// cpuIdle reads sandbox id's CPU counter into r's history (reset while it
// does not run) and reports whether its use over the idle timeout is
// known and below p.CPUBelow, and the use in percent of a core. The
// caller holds f.mu.
func (f *Idle) cpuIdle(ctx context.Context, r *tracked, id string, running bool, now time.Time, p Policy) (bool, float64) {
	if !running {
		r.cpu = nil
		return false, 0
	}
	used, err := f.rt.(runtime.CPUReader).CPUUsage(ctx, id)
	if err != nil {
		r.cpu = nil
		return false, 0
	}
	s := cpuSample{at: now, used: used}
	pct, ok := cpuPercent(r.cpu, s, p.Timeout)
	r.cpu = addSample(r.cpu, s, p.Timeout)
	return ok && pct < p.CPUBelow, pct
}

// addSample appends s to the history samples, at most cpuSamples over a
// window, and drops the readings older than needed to cover the window
// before s. A counter that went back (a sandbox started again) restarts
// the history.
func addSample(samples []cpuSample, s cpuSample, window time.Duration) []cpuSample {
	if n := len(samples); n > 0 && s.used < samples[n-1].used {
		samples = samples[:0]
	}
	if n := len(samples); n == 0 || s.at.Sub(samples[n-1].at) >= window/cpuSamples {
		samples = append(samples, s)
	}
	// Keep the newest reading at least a window old as the base.
	i := 0
	for i+1 < len(samples) && !samples[i+1].at.After(s.at.Add(-window)) {
		i++
	}
	return samples[i:]
}

// cpuPercent is the CPU use between the history's base (its newest
// reading at least a window before now) and now, in percent of one core;
// ok is false while the history covers less than nine tenths of the
// window, or the counter went back.
func cpuPercent(samples []cpuSample, now cpuSample, window time.Duration) (pct float64, ok bool) {
	base := -1
	for i, s := range samples {
		if !s.at.After(now.at.Add(-window * 9 / 10)) {
			base = i
		}
	}
	if base < 0 {
		return 0, false
	}
	b := samples[base]
	span := now.at.Sub(b.at)
	if span <= 0 || now.used < b.used {
		return 0, false
	}
	return 100 * float64(now.used-b.used) / float64(span), true
}

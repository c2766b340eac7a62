package docker

import (
	"context"
	"strconv"
	"sync"
	"time"

	"github.com/moby/moby/api/types/events"
	"github.com/moby/moby/client"

	"github.com/moat-sandbox/moat/internal/runtime"
)

// Exit notification (runtime.ExitNotifier): the daemon's "die" events of
// this server's containers, followed from the first NotifyExits until
// Close; an OOM kill is what the container's state says (OOMKilled).

// exitWatch is the follow of the daemon's events.
type exitWatch struct {
	mu     sync.Mutex
	fns    []func(runtime.Exit)
	cancel context.CancelFunc // set once the follow runs
	done   chan struct{}
}

// NotifyExits implements runtime.ExitNotifier.
func (r *Runtime) NotifyExits(f func(runtime.Exit)) {
	w := &r.exits
	w.mu.Lock()
	defer w.mu.Unlock()
	w.fns = append(w.fns, f)
	if w.cancel != nil {
		return
	}
	ctx, cancel := context.WithCancel(context.Background())
	w.cancel, w.done = cancel, make(chan struct{})
	go func() {
		defer close(w.done)
		r.followExits(ctx)
	}()
}

// stopExits ends the follow (Close).
func (r *Runtime) stopExits() {
	w := &r.exits
	w.mu.Lock()
	cancel, done := w.cancel, w.done
	w.mu.Unlock()
	if cancel != nil {
		cancel()
		<-done
	}
}

// followExits reads the daemon's die events until ctx ends, connecting
// again a second after the stream breaks (a daemon restart).
func (r *Runtime) followExits(ctx context.Context) {
	f := make(client.Filters).Add("type", "container").Add("event", "die").Add("label", LabelScope+"="+r.cfg.Scope)
	for {
		res := r.cli.Events(ctx, client.EventsListOptions{Filters: f})
	read:
		for {
			select {
			case <-ctx.Done():
				return
			case m := <-res.Messages:
				r.died(ctx, m)
			case err := <-res.Err:
				if ctx.Err() == nil {
					r.log.Warn("docker: event stream broke; following again", "err", err)
				}
				break read
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(time.Second):
		}
	}
}

// died reports the die event m of a sandbox container.
func (r *Runtime) died(ctx context.Context, m events.Message) {
	id := m.Actor.Attributes[LabelSandbox]
	if !runtime.ValidID(id) {
		return
	}
	ex := runtime.Exit{ID: id, Reason: runtime.ExitReasonExited, ExitCode: -1}
	if code, err := strconv.Atoi(m.Actor.Attributes["exitCode"]); err == nil {
		ex.ExitCode = code
	}
	ictx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if c, err := r.inspect(ictx, id); err == nil && c.State.OOMKilled {
		ex.Reason = runtime.ExitReasonOOMKilled
	}
	r.log.Debug("docker: sandbox container died", "id", id, "reason", ex.Reason, "code", ex.ExitCode)
	r.exits.mu.Lock()
	fns := r.exits.fns
	r.exits.mu.Unlock()
	for _, f := range fns {
		f(ex)
	}
}

package code

import (
	"context"
	"fmt"
	"os"
	"sync"

	"github.com/moat-sandbox/moat/internal/errdefs"
	"github.com/moat-sandbox/moat/internal/execd/proc"
	"github.com/moat-sandbox/moat/internal/execd/wire"
)

// backend runs the cells of one context: a Jupyter kernel (kernelClient)
// or a built-in driver (driverProc).
type backend interface {
	// exec runs one cell, streaming its output events (the caller sends
	// init and the final event). It calls x.markStarted once the
	// interpreter has begun running the cell, and returns the error that
	// ended the cell, nil on success.
	exec(ctx context.Context, x *execution, code string, stream Sink) *wire.EventError
	// interrupt interrupts the running cell (SIGINT to the interpreter,
	// or a Jupyter interrupt_request); ctx bounds a wait for the answer.
	interrupt(ctx context.Context) error
	// process is the interpreter process.
	process() *proc.Proc
	// exited reports whether the interpreter is gone.
	exited() bool
}

// codeContext is a stateful interpreter (POST /code/context). It runs one
// execution at a time.
type codeContext struct {
	id, language, cwd string
	key               string // languageKey(language)
	dir               string // private files (cells, connection file, logs)
	backend           backend
	// turn queues the executions of Exec: one holds it at a time.
	turn chan struct{}

	mu   sync.Mutex
	cur  *execution // the running execution, if any (guarded by mu)
	runs int        // executions started (guarded by mu)
	// restarts counts Restart's replacements of the interpreter
	// (guarded by mu).
	restarts int
}

// begin claims the context for one execution.
func (c *codeContext) begin(run *proc.Runner) (*execution, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.cur != nil {
		return nil, errBusy()
	}
	if c.backend.exited() {
		return nil, wire.Runtime(fmt.Errorf("%w: interpreter exited", errdefs.ErrFailedPrecondition),
			"context interpreter has exited"+c.exitDetail()+"; create a new context")
	}
	c.runs++
	x := &execution{ctx: c, n: c.runs, run: run}
	c.cur = x
	return x, nil
}

// exitDetail tells how the context's interpreter ended: its wait status
// and the tail of a kernel's log (a kernel that dies between cells is
// otherwise a mystery to the client).
func (c *codeContext) exitDetail() string {
	var d string
	if p := c.backend.process(); p != nil && p.Exited() {
		d = " (" + proc.DescribeStatus(p.Status()) + ")"
	}
	if t := kernelLogTail(c.dir, 1024); t != "" {
		d += "; its output ends: " + t
	}
	return d
}

// interrupt interrupts the running execution; with none there is nothing
// to interrupt.
func (c *codeContext) interrupt(ctx context.Context) error {
	c.mu.Lock()
	x := c.cur
	c.mu.Unlock()
	if x == nil {
		return nil
	}
	return x.interrupt(ctx)
}

// close kills the interpreter and removes the context's files.
func (c *codeContext) close() {
	if p := c.backend.process(); p != nil {
		p.Signal(sigKILL)
		<-p.Done()
	}
	os.RemoveAll(c.dir)
}

// execution is one cell run in a context. Its interrupt state makes an
// interrupt sent right after the init event count: until the interpreter
// has begun the cell (markStarted), a requested interrupt is only
// recorded; markStarted delivers it. Interpreters ignore SIGINT between
// cells (or, like IRkernel, die of it), so one sent earlier would be lost.
type execution struct {
	ctx *codeContext
	n   int // the context's execution number, from 1
	run *proc.Runner

	// sending serializes deliveries: a held interrupt, the client's
	// interrupts and repeats each wait for the gate in turn.
	sending sync.Mutex

	mu        sync.Mutex
	started   bool          // the interpreter is running the cell
	ended     bool          // the cell has finished
	pending   bool          // an interrupt waits for started
	delivered bool          // an interrupt was sent to the interpreter
	canceled  bool          // the client went away
	gate      interruptGate // set by markStarted; nil: interrupt at once
}

// interruptGate tells when an interpreter running a cell may be sent an
// interrupt (see kernelGate).
type interruptGate interface {
	// wait blocks until the interpreter may be interrupted and reports
	// true, or false once it may not any more (the cell is over) or ctx
	// is done. again: an interrupt was sent already; another needs
	// stronger evidence that the cell still runs.
	wait(ctx context.Context, again bool) bool
	// sent records that an interrupt was sent: the next wait measures
	// from now.
	sent()
}

// interrupt delivers an interrupt once the cell is running (and its gate
// allows it), or holds it until it is.
func (x *execution) interrupt(ctx context.Context) error {
	x.mu.Lock()
	if x.ended {
		x.mu.Unlock()
		return nil
	}
	if !x.started {
		x.pending = true
		x.mu.Unlock()
		return nil
	}
	again := x.delivered
	x.mu.Unlock()
	if again {
		// One more, once the cell shows it still runs (which it may
		// never do): in the background.
		x.run.Go(func() {
			x.sending.Lock()
			defer x.sending.Unlock()
			x.deliverLocked(x.run.Context())
		})
		return nil
	}
	x.sending.Lock()
	defer x.sending.Unlock()
	return x.deliverLocked(ctx)
}

// deliverLocked sends one interrupt when the gate opens, unless the cell
// is over by then. Preconditions: x.sending is held, x.started.
func (x *execution) deliverLocked(ctx context.Context) error {
	x.mu.Lock()
	g, again := x.gate, x.delivered
	x.mu.Unlock()
	if g != nil && !g.wait(ctx, again) {
		return ctx.Err()
	}
	x.mu.Lock()
	if x.ended {
		x.mu.Unlock()
		return nil
	}
	x.delivered = true
	x.mu.Unlock()
	err := x.ctx.backend.interrupt(ctx)
	if g != nil {
		g.sent()
	}
	return err
}

// redeliver repeats a delivered interrupt while the cell runs (in the
// background: exec's reader must go on); a delivery already under way
// (waiting for its gate) is not doubled.
func (x *execution) redeliver() {
	x.mu.Lock()
	again := x.delivered && !x.ended
	x.mu.Unlock()
	if !again || !x.sending.TryLock() {
		return
	}
	x.run.Go(func() {
		defer x.sending.Unlock()
		x.deliverLocked(x.run.Context())
	})
}

// interruptRequested reports whether an interrupt was asked for.
func (x *execution) interruptRequested() bool {
	x.mu.Lock()
	defer x.mu.Unlock()
	return x.pending || x.delivered || x.canceled
}

// interruptDelivered reports whether an interrupt was sent to the
// interpreter during the execution.
func (x *execution) interruptDelivered() bool {
	x.mu.Lock()
	defer x.mu.Unlock()
	return x.delivered
}

// cancel interrupts the cell because its client went away.
func (x *execution) cancel(ctx context.Context) {
	x.mu.Lock()
	x.canceled = true
	x.mu.Unlock()
	x.interrupt(ctx)
}

func (x *execution) cancelled() bool {
	x.mu.Lock()
	defer x.mu.Unlock()
	return x.canceled
}

// markStarted records that the interpreter is running the cell and
// delivers a held interrupt (in the background: exec's reader must go on)
// once gate allows (nil: at once). Every later interrupt of the cell waits
// for the same gate. Only the first call counts.
func (x *execution) markStarted(gate interruptGate) {
	x.mu.Lock()
	if x.started || x.ended {
		x.mu.Unlock()
		return
	}
	x.started = true
	x.gate = gate
	deliver := x.pending
	x.pending = false
	x.mu.Unlock()
	if !deliver {
		return
	}
	x.run.Go(func() {
		x.sending.Lock()
		defer x.sending.Unlock()
		x.deliverLocked(x.run.Context())
	})
}

// end marks the cell finished and frees the context; it is idempotent.
func (x *execution) end() {
	x.mu.Lock()
	x.ended = true
	x.mu.Unlock()
	x.ctx.mu.Lock()
	if x.ctx.cur == x {
		x.ctx.cur = nil
	}
	x.ctx.mu.Unlock()
}

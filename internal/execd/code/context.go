package code

import (
	"context"
	"fmt"
	"os"
	"sync"
	"time"

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
	exec(ctx context.Context, x *execution, code string, stream *wire.Stream) *wire.EventError
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
	seq               uint64 // creation order
	backend           backend

	mu   sync.Mutex
	cur  *execution // the running execution, if any (guarded by mu)
	runs int        // executions started (guarded by mu)
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
// cells, so one sent earlier would be lost.
type execution struct {
	ctx *codeContext
	n   int // the context's execution number, from 1
	run *proc.Runner

	mu        sync.Mutex
	started   bool // the interpreter is running the cell
	ended     bool // the cell has finished
	pending   bool // an interrupt waits for started
	delivered bool // an interrupt was sent to the interpreter
	canceled  bool // the client went away
	// readyAt is when the interpreter takes an interrupt (markStarted's
	// delay after the start): an interrupt asked for earlier waits.
	readyAt time.Time
}

// interrupt delivers an interrupt now if the cell is running, or holds it
// until it is.
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
	wait := time.Until(x.readyAt)
	x.mu.Unlock()
	if wait > 0 {
		t := time.NewTimer(wait)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		}
	}
	x.mu.Lock()
	if x.ended {
		x.mu.Unlock()
		return nil
	}
	x.delivered = true
	x.mu.Unlock()
	return x.ctx.backend.interrupt(ctx)
}

// redeliver repeats a delivered interrupt while the cell runs (in the
// background: exec's reader must go on).
func (x *execution) redeliver() {
	x.mu.Lock()
	again := x.delivered && !x.ended
	x.mu.Unlock()
	if again {
		x.run.Go(func() { x.ctx.backend.interrupt(x.run.Context()) })
	}
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
// delivers a held interrupt (in the background: exec's reader must go on),
// after delay: a kernel announces the cell (execute_input) a moment before
// it is ready for SIGINT, and IRkernel dies of one that lands in between.
// An interrupt asked for after the start waits out the same delay. A cell
// that ends within the delay is not interrupted.
func (x *execution) markStarted(delay time.Duration) {
	x.mu.Lock()
	if x.started || x.ended {
		x.mu.Unlock()
		return
	}
	x.started = true
	x.readyAt = time.Now().Add(delay)
	deliver := x.pending
	x.pending = false
	x.mu.Unlock()
	if !deliver {
		return
	}
	x.run.Go(func() {
		if delay > 0 {
			t := time.NewTimer(delay)
			defer t.Stop()
			select {
			case <-t.C:
			case <-x.run.Context().Done():
				return
			}
		}
		x.mu.Lock()
		if x.ended {
			x.mu.Unlock()
			return
		}
		x.delivered = true
		x.mu.Unlock()
		x.ctx.backend.interrupt(x.run.Context())
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

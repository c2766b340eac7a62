package code

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/moat-sandbox/moat/internal/execd/proc"
	"github.com/moat-sandbox/moat/internal/execd/wire"
)

// recordingBackend records when interrupts reach the interpreter.
type recordingBackend struct {
	mu    sync.Mutex
	times []time.Time
}

func (b *recordingBackend) exec(context.Context, *execution, string, *wire.Stream) *wire.EventError {
	return nil
}

func (b *recordingBackend) interrupt(context.Context) error {
	b.mu.Lock()
	b.times = append(b.times, time.Now())
	b.mu.Unlock()
	return nil
}

func (b *recordingBackend) process() *proc.Proc { return nil }
func (b *recordingBackend) exited() bool        { return false }

func (b *recordingBackend) sent() []time.Time {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]time.Time(nil), b.times...)
}

// An interrupt asked for right after the start waits out the start delay
// like a held one: a SIGINT that lands before IRkernel is inside the cell
// kills it (CI saw "context interpreter has exited" on the cell after an
// interrupted loop; under stress-ng the kernel's output ended "Execution
// halted").
func TestInterruptStaysInsideTheCell(t *testing.T) {
	e := newTestEnv(t)
	const delay = 150 * time.Millisecond
	newExec := func() (*execution, *recordingBackend) {
		b := &recordingBackend{}
		c := &codeContext{backend: b}
		x, err := c.begin(e.run)
		if err != nil {
			t.Fatal(err)
		}
		return x, b
	}

	// Asked for after the start: delivered no earlier than the delay.
	x, b := newExec()
	start := time.Now()
	x.markStarted(delay)
	if err := x.interrupt(context.Background()); err != nil {
		t.Fatal(err)
	}
	if got := b.sent(); len(got) != 1 || got[0].Sub(start) < delay {
		t.Fatalf("interrupt right after the start: sent at %v (start %v, delay %v)", got, start, delay)
	}

	// Held (asked for before the start): delivered after the delay.
	x, b = newExec()
	x.interrupt(context.Background())
	start = time.Now()
	x.markStarted(delay)
	deadline := time.Now().Add(5 * time.Second)
	for len(b.sent()) == 0 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	if got := b.sent(); len(got) != 1 || got[0].Sub(start) < delay {
		t.Fatalf("held interrupt: sent at %v (start %v, delay %v)", got, start, delay)
	}
}

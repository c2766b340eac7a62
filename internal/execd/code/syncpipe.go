package code

import (
	"errors"
	"os"
	"sync"
	"time"

	"github.com/moat-sandbox/moat/internal/execd/proc"
)

// syncPipe copies a long-lived child's output pipe to a switchable sink and
// supports barriers: barrier() returns once everything the child wrote
// before the call has been delivered. It works like outputPipe's exit
// handling: barrier sets an immediate read deadline; the copier, on the
// deadline, takes the pending barriers and clears the deadline under mu
// (so a later barrier re-arms it), drains the pipe with non-blocking reads,
// and releases the barriers it took.
type syncPipe struct {
	r *os.File

	mu       sync.Mutex
	sink     func([]byte)
	barriers []chan struct{}
	closed   bool
}

func newSyncPipe(r *os.File) *syncPipe { return &syncPipe{r: r} }

func (p *syncPipe) setSink(f func([]byte)) {
	p.mu.Lock()
	p.sink = f
	p.mu.Unlock()
}

func (p *syncPipe) deliver(b []byte) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.sink != nil {
		p.sink(b)
	}
}

// barrier waits until prior output is delivered (or the pipe is closed).
func (p *syncPipe) barrier() {
	ch := make(chan struct{})
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return
	}
	p.barriers = append(p.barriers, ch)
	p.r.SetReadDeadline(time.Now())
	p.mu.Unlock()
	<-ch
}

func (p *syncPipe) run() {
	defer func() {
		p.mu.Lock()
		p.closed = true
		for _, ch := range p.barriers {
			close(ch)
		}
		p.barriers = nil
		p.mu.Unlock()
		p.r.Close()
	}()
	buf := make([]byte, 32<<10)
	for {
		n, err := p.r.Read(buf)
		if n > 0 {
			p.deliver(buf[:n])
		}
		if err == nil {
			continue
		}
		if !errors.Is(err, os.ErrDeadlineExceeded) {
			return
		}
		p.mu.Lock()
		taken := p.barriers
		p.barriers = nil
		p.r.SetReadDeadline(time.Time{})
		p.mu.Unlock()
		eof := proc.Drain(p.r, buf, p.deliver)
		for _, ch := range taken {
			close(ch)
		}
		if eof {
			return
		}
	}
}

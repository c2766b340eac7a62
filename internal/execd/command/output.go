package command

import (
	"errors"
	"io"
	"os"
	"sync"
	"time"

	"github.com/moat-sandbox/moat/internal/execd/proc"
	"github.com/moat-sandbox/moat/internal/execd/wire"
)

// outputLog is a command's merged output file (served by /command/{id}/logs).
type outputLog struct {
	mu sync.Mutex
	f  *os.File
}

func (l *outputLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.f.Write(p)
}

// outputPipe copies one of a child's output pipes into the command's log
// and, until the stream is complete, to a sink (the SSE encoder).
//
// The stream must end as soon as the process has exited and its output is
// flushed, even if a grandchild (`server &`) still holds the pipe open. So
// on exit, markExited sets an immediate read deadline; the copier then
// drains what the kernel has buffered with non-blocking reads, detaches the
// sink and closes flushed. It keeps copying into the log until EOF, so a
// lingering grandchild never gets EPIPE.
type outputPipe struct {
	r   *os.File
	log io.Writer

	mu      sync.Mutex
	sink    func([]byte) // nil once flushed
	flushed chan struct{}
	once    sync.Once
}

func newOutputPipe(r *os.File, log io.Writer, sink func([]byte)) *outputPipe {
	return &outputPipe{r: r, log: log, sink: sink, flushed: make(chan struct{})}
}

func (p *outputPipe) deliver(b []byte) {
	p.log.Write(b)
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.sink != nil {
		p.sink(b)
	}
}

func (p *outputPipe) markFlushed() {
	p.once.Do(func() {
		p.mu.Lock()
		p.sink = nil
		p.mu.Unlock()
		close(p.flushed)
	})
}

// markExited is called once the child has been reaped.
func (p *outputPipe) markExited() { p.r.SetReadDeadline(time.Now()) }

// run copies until EOF; call it in its own goroutine.
func (p *outputPipe) run() {
	defer p.r.Close()
	defer p.markFlushed()
	buf := make([]byte, 64<<10)
	for {
		n, err := p.r.Read(buf)
		if n > 0 {
			p.deliver(buf[:n])
		}
		if err == nil {
			continue
		}
		if !errors.Is(err, os.ErrDeadlineExceeded) {
			return // EOF (all writers gone) or a read error
		}
		p.r.SetReadDeadline(time.Time{})
		eof := proc.Drain(p.r, buf, p.deliver)
		p.markFlushed()
		if eof {
			return
		}
	}
}

// lineOutput streams one output pipe as line events of one type.
type lineOutput struct {
	pipe  *outputPipe
	split *wire.LineSplitter
	buf   []byte // the sink's frame buffer, reused per read
}

// streamLines copies r into log and, as typ events, onto stream until the
// process exits (see finishLines).
func (s *Service) streamLines(r *os.File, log io.Writer, typ string, stream *wire.Stream) *lineOutput {
	o := &lineOutput{split: wire.NewLineSplitter(typ)}
	o.pipe = newOutputPipe(r, log, func(b []byte) {
		o.buf = o.split.Append(o.buf[:0], b)
		stream.Write(o.buf)
	})
	s.run.Go(o.pipe.run)
	return o
}

// finishLines, once the process has been reaped, waits for every output
// to flush and returns the splitters' last partial lines as events. The
// sinks are detached by then, so the splitters are the caller's alone.
func finishLines(outs ...*lineOutput) []byte {
	for _, o := range outs {
		o.pipe.markExited()
	}
	var tail []byte
	for _, o := range outs {
		<-o.pipe.flushed
		tail = o.split.Flush(tail)
	}
	return tail
}

// pipes opens n pipes and returns their read and write ends.
func pipes(n int) (rs, ws []*os.File, err error) {
	for range n {
		r, w, err := os.Pipe()
		if err != nil {
			closeAll(rs, ws)
			return nil, nil, err
		}
		rs, ws = append(rs, r), append(ws, w)
	}
	return rs, ws, nil
}

func closeAll(lists ...[]*os.File) {
	for _, fs := range lists {
		for _, f := range fs {
			f.Close()
		}
	}
}

package client

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"time"
)

// ErrSandboxEnded marks a command stream cut short because its sandbox
// ended (it was found Failed, Terminated or gone while the stream was
// silent).
var ErrSandboxEnded = errors.New("sandbox ended")

// defaultStreamSilence is how long a command stream may stay silent
// before the client asks the server whether its sandbox still runs. The
// agent pings every 3 s on a stream; a silent one is a dead connection
// (a sandbox that died cannot always reset it: a gVisor sandbox's network
// stack dies with it, and the TCP connection would take minutes to time
// out) or a paused sandbox.
const defaultStreamSilence = 6 * time.Second

// watchedBody is the body of a command stream, cut with ErrSandboxEnded
// once a silence of the stream turns out to be the sandbox's end.
type watchedBody struct {
	body io.ReadCloser
	last atomic.Int64 // when bytes last arrived (UnixNano)

	mu  sync.Mutex
	err error // set when the sandbox was found ended
}

// watchStream watches body, a command stream of sandbox s, until the
// returned stop is called.
func (s *SandboxHandle) watchStream(ctx context.Context, body io.ReadCloser) (*watchedBody, func()) {
	w := &watchedBody{body: body}
	w.last.Store(time.Now().UnixNano())
	silence := s.c.streamSilence
	if silence <= 0 {
		silence = defaultStreamSilence
	}
	done := make(chan struct{})
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		t := time.NewTicker(silence / 4)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-ctx.Done():
				return
			case <-t.C:
			}
			if time.Since(time.Unix(0, w.last.Load())) < silence {
				continue
			}
			if _, err := s.ended(ctx); err != nil {
				w.mu.Lock()
				w.err = err
				w.mu.Unlock()
				body.Close() // ends the blocked Read
				return
			}
			w.last.Store(time.Now().UnixNano()) // alive: look again after another silence
		}
	}()
	return w, func() { close(done); <-stopped }
}

func (w *watchedBody) Read(p []byte) (int, error) {
	n, err := w.body.Read(p)
	if n > 0 {
		w.last.Store(time.Now().UnixNano())
	}
	if err != nil {
		w.mu.Lock()
		if w.err != nil {
			err = w.err
		}
		w.mu.Unlock()
	}
	return n, err
}

// ended asks the server about the sandbox: an error (wrapping
// ErrSandboxEnded) if it has ended; nil if it lives on (running) or the
// server cannot tell.
func (s *SandboxHandle) ended(ctx context.Context) (running bool, err error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	sb, err := s.c.GetSandbox(ctx, s.ID)
	var ae *APIError
	switch {
	case IsNotFound(err) && errors.As(err, &ae) && ae.Code != "":
		return false, fmt.Errorf("sandbox %s is gone: %w", s.ID, ErrSandboxEnded)
	case err != nil:
		return false, nil
	}
	switch sb.Status.State {
	case StateFailed, StateTerminated, StateStopping:
		msg := fmt.Sprintf("sandbox %s is %s", s.ID, sb.Status.State)
		if sb.Status.Message != "" {
			msg += ": " + sb.Status.Message
		}
		return false, fmt.Errorf("%s: %w", msg, ErrSandboxEnded)
	}
	return true, nil
}

// endedSoon is ended for a stream that broke: the server may learn of the
// sandbox's death a moment after the stream did, so a sandbox it still
// reports running is asked about again for up to 3 s.
func (s *SandboxHandle) endedSoon(ctx context.Context) error {
	deadline := time.Now().Add(3 * time.Second)
	for {
		running, err := s.ended(ctx)
		if !running || time.Now().After(deadline) {
			return err
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(250 * time.Millisecond):
		}
	}
}

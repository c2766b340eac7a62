package cli

import (
	"context"
	"time"
)

// watchResize polls the console size (Windows has no SIGWINCH) and calls
// resize, which sends the size, twice a second until ctx is done or the
// returned stop is called.
func watchResize(ctx context.Context, resize func()) (stop func()) {
	done := make(chan struct{})
	go func() {
		t := time.NewTicker(500 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-done:
				return
			case <-t.C:
				resize()
			}
		}
	}()
	return func() { close(done) }
}

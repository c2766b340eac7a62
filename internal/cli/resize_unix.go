//go:build !windows

package cli

import (
	"context"
	"os"
	"os/signal"
	"syscall"
)

// watchResize calls resize whenever the terminal is resized (SIGWINCH)
// until ctx is done or the returned stop is called.
func watchResize(ctx context.Context, resize func()) (stop func()) {
	winch := make(chan os.Signal, 1)
	signal.Notify(winch, syscall.SIGWINCH)
	done := make(chan struct{})
	go func() {
		for {
			select {
			case <-ctx.Done():
				return
			case <-done:
				return
			case <-winch:
				resize()
			}
		}
	}()
	return func() {
		signal.Stop(winch)
		close(done)
	}
}

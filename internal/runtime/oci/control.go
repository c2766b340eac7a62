package oci

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	gorunc "github.com/containerd/go-runc"
	"golang.org/x/sys/unix"

	"github.com/moat-sandbox/moat/internal/errdefs"
	"github.com/moat-sandbox/moat/internal/runtime"
)

// Stop, Pause and Resume of a running sandbox.

// Stop implements runtime.Runtime.
func (r *Runtime) Stop(ctx context.Context, id string, grace time.Duration) error {
	if !runtime.ValidID(id) {
		return fmt.Errorf("sandbox %q: %w", id, errdefs.ErrNotFound)
	}
	rec, err := r.readRecord(id)
	if err != nil {
		return err
	}
	c, found, err := r.containerState(ctx, rec.Class, id)
	if err != nil {
		return err
	}
	if !found || c.Status == "stopped" || c.Pid == 0 {
		return nil
	}
	rc := r.runc(rec.Class)
	r.collectHelpers()
	paused := c.Status == "paused"
	if grace > 0 {
		if err := rc.Kill(ctx, id, int(unix.SIGTERM), nil); err != nil && alive(c.Pid) {
			return fmt.Errorf("oci: kill %s: %w: %w", id, err, errdefs.ErrInternal)
		}
		if paused {
			// A frozen process cannot act on a signal; thaw so it can.
			if err := rc.Resume(ctx, id); err != nil && alive(c.Pid) {
				return fmt.Errorf("oci: resume %s: %w: %w", id, err, errdefs.ErrInternal)
			}
			paused = false
		}
		if waitExit(ctx, c.Pid, grace) {
			return nil
		}
	}
	if err := rc.Kill(ctx, id, int(unix.SIGKILL), &gorunc.KillOpts{All: true}); err != nil && alive(c.Pid) {
		return fmt.Errorf("oci: kill -9 %s: %w: %w", id, err, errdefs.ErrInternal)
	}
	if paused {
		// SIGKILL is not acted on by frozen tasks until they thaw.
		rc.Resume(ctx, id)
	}
	if !waitExit(ctx, c.Pid, 10*time.Second) {
		return fmt.Errorf("oci: sandbox %s did not die after SIGKILL: %w", id, errdefs.ErrInternal)
	}
	return nil
}

// alive reports whether pid exists and is not a zombie.
func alive(pid int) bool {
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	// The state follows the parenthesized command name.
	s := string(data)
	i := strings.LastIndexByte(s, ')')
	if i < 0 || i+2 >= len(s) {
		return false
	}
	switch s[i+2] {
	case 'Z', 'X', 'x':
		return false
	}
	return true
}

// waitExit polls until pid is gone, d has passed or ctx is done.
func waitExit(ctx context.Context, pid int, d time.Duration) bool {
	deadline := time.Now().Add(d)
	for {
		if !alive(pid) {
			return true
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return false
		}
		select {
		case <-ctx.Done():
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// Pause implements runtime.Pauser.
func (r *Runtime) Pause(ctx context.Context, id string) error {
	return r.freeze(ctx, id, true)
}

// Resume implements runtime.Pauser.
func (r *Runtime) Resume(ctx context.Context, id string) error {
	return r.freeze(ctx, id, false)
}

func (r *Runtime) freeze(ctx context.Context, id string, pause bool) error {
	if !runtime.ValidID(id) {
		return fmt.Errorf("sandbox %q: %w", id, errdefs.ErrNotFound)
	}
	rec, err := r.readRecord(id)
	if err != nil {
		return err
	}
	c, found, err := r.containerState(ctx, rec.Class, id)
	if err != nil {
		return err
	}
	if hibernated(rec) && (!found || c.Status == "stopped") {
		if pause {
			return fmt.Errorf("sandbox %q is hibernated: %w", id, errdefs.ErrFailedPrecondition)
		}
		return r.wake(ctx, id, rec)
	}
	want, op := "running", r.runc(rec.Class).Pause
	if !pause {
		want, op = "paused", r.runc(rec.Class).Resume
	}
	if !found || c.Status != want {
		status := "gone"
		if found {
			status = c.Status
		}
		return fmt.Errorf("sandbox %q is %s, not %s: %w", id, status, want, errdefs.ErrFailedPrecondition)
	}
	if err := op(ctx, id); err != nil {
		return fmt.Errorf("oci: pause/resume %s: %w: %w", id, err, errdefs.ErrInternal)
	}
	return nil
}

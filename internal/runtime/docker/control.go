package docker

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/moby/moby/api/types/container"
	"github.com/moby/moby/client"

	"github.com/moat-sandbox/moat/internal/errdefs"
	"github.com/moat-sandbox/moat/internal/runtime"
)

// Stop implements runtime.Runtime. A paused sandbox is thawed first so
// that it can handle SIGTERM.
func (r *Runtime) Stop(ctx context.Context, id string, grace time.Duration) error {
	c, err := r.inspect(ctx, id)
	if err != nil {
		return err
	}
	switch r.status(c).State {
	case runtime.StateStopped, runtime.StateCreating:
		return nil
	case runtime.StatePaused:
		if _, err := r.cli.ContainerUnpause(ctx, c.ID, client.ContainerUnpauseOptions{}); err != nil && !cerrdefs.IsConflict(err) {
			return classify("unpause "+id, err)
		}
	}
	if grace <= 0 {
		return r.kill(ctx, id, c.ID)
	}
	secs := int((grace + time.Second - 1) / time.Second)
	if _, err := r.cli.ContainerStop(ctx, c.ID, client.ContainerStopOptions{Timeout: &secs}); err != nil {
		if cerrdefs.IsNotFound(err) {
			return notFound(id)
		}
		return classify("stop "+id, err)
	}
	return nil
}

// kill sends SIGKILL and waits until the container has stopped. (API
// 1.41 has no stop signal parameter; `stop -t 0` sends SIGTERM first.)
func (r *Runtime) kill(ctx context.Context, id, cid string) error {
	if _, err := r.cli.ContainerKill(ctx, cid, client.ContainerKillOptions{Signal: "SIGKILL"}); err != nil {
		switch {
		case cerrdefs.IsNotFound(err):
			return notFound(id)
		case !cerrdefs.IsConflict(err): // conflict: it is not running any more
			return classify("kill "+id, err)
		}
	}
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	w := r.cli.ContainerWait(wctx, cid, client.ContainerWaitOptions{Condition: container.WaitConditionNotRunning})
	select {
	case <-w.Result:
		return nil
	case err := <-w.Error:
		if cerrdefs.IsNotFound(err) {
			return notFound(id)
		}
		return classify("wait "+id, err)
	}
}

// Pause implements runtime.Pauser (the daemon's freezer).
func (r *Runtime) Pause(ctx context.Context, id string) error {
	c, err := r.inspect(ctx, id)
	if err != nil {
		return err
	}
	if st := r.status(c).State; st != runtime.StateRunning {
		return fmt.Errorf("sandbox %q is %s, not running: %w", id, st, errdefs.ErrFailedPrecondition)
	}
	if _, err := r.cli.ContainerPause(ctx, c.ID, client.ContainerPauseOptions{}); err != nil {
		if cerrdefs.IsConflict(err) {
			return fmt.Errorf("sandbox %q: %w: %w", id, err, errdefs.ErrFailedPrecondition)
		}
		return classify("pause "+id, err)
	}
	return nil
}

// Resume implements runtime.Pauser.
func (r *Runtime) Resume(ctx context.Context, id string) error {
	c, err := r.inspect(ctx, id)
	if err != nil {
		return err
	}
	if st := r.status(c).State; st != runtime.StatePaused {
		return fmt.Errorf("sandbox %q is %s, not paused: %w", id, st, errdefs.ErrFailedPrecondition)
	}
	if _, err := r.cli.ContainerUnpause(ctx, c.ID, client.ContainerUnpauseOptions{}); err != nil {
		if cerrdefs.IsConflict(err) {
			return fmt.Errorf("sandbox %q: %w: %w", id, err, errdefs.ErrFailedPrecondition)
		}
		return classify("resume "+id, err)
	}
	return nil
}

// Delete implements runtime.Runtime: force-removes the container (and its
// anonymous volumes) and the agent.json. Unknown IDs are a no-op.
func (r *Runtime) Delete(ctx context.Context, id string) error {
	if !runtime.ValidID(id) {
		return nil
	}
	switch _, err := r.inspect(ctx, id); {
	case errdefs.IsNotFound(err):
		// Not ours (or gone): only a leftover agent.json and volume binds
		// may remain.
		if err := r.removeFiles(id); err != nil {
			return err
		}
		return r.unstageVolumes(id)
	case err != nil:
		return err
	}
	return r.remove(ctx, id)
}

func (r *Runtime) remove(ctx context.Context, id string) error {
	_, err := r.cli.ContainerRemove(ctx, containerName(id), client.ContainerRemoveOptions{Force: true, RemoveVolumes: true})
	if err != nil && !cerrdefs.IsNotFound(err) {
		// A removal already in progress (409) finishes on its own.
		if !cerrdefs.IsConflict(err) || !strings.Contains(err.Error(), "already in progress") {
			return classify("remove "+id, err)
		}
	}
	if err := r.removeFiles(id); err != nil {
		return err
	}
	return r.unstageVolumes(id)
}

// removeFiles removes sandbox id's agent.json and resolv.conf.
func (r *Runtime) removeFiles(id string) error {
	for _, p := range []string{r.agentConfPath(id), r.resolvConfPath(id)} {
		if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("docker: %w", err)
		}
	}
	return nil
}

package oci

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"time"

	gorunc "github.com/containerd/go-runc"
	"golang.org/x/sys/unix"

	"github.com/moat-sandbox/moat/internal/errdefs"
	"github.com/moat-sandbox/moat/internal/runtime"
)

// Delete and the idempotent cleanup it shares with a failed Create and
// with recovery.

// Delete implements runtime.Runtime.
func (r *Runtime) Delete(ctx context.Context, id string) error {
	if !runtime.ValidID(id) {
		return nil
	}
	return r.cleanup(ctx, id)
}

// cleanup removes everything that may exist for id, in reverse order of
// creation. Each step tolerates its resource being absent, so it serves
// for Delete, for the rollback of a failed Create and for recovery.
func (r *Runtime) cleanup(ctx context.Context, id string) (err error) {
	dir := r.sandboxDir(id)
	// Cumulative time at the end of each step, logged like "oci: created"
	// (a slow delete on a busy host shows which step waited).
	t0 := time.Now()
	var phases []any
	phase := func(name string) { phases = append(phases, name, time.Since(t0)) }
	defer func() {
		r.log.Debug("oci: deleted", append([]any{"id", id, "err", err}, phases...)...)
	}()
	classes := slices.Sorted(maps.Keys(r.classes))
	var named []string
	if rec, err := r.readRecord(id); err == nil {
		classes = []string{rec.Class}
		for _, m := range rec.Spec.Mounts {
			if m.Volume != "" {
				named = append(named, m.Volume)
			}
		}
	}
	var errs []error
	for _, class := range classes {
		if err := r.deleteContainer(ctx, class, id); err != nil {
			errs = append(errs, err)
		}
	}
	phase("container")
	// A container the runtime lost track of (a `run` of a crashed server
	// that finished late) is still in its cgroups: kill it there.
	killCgroupProcs(r.cgroupPath(id))
	phase("kill")
	if err := unmountAll(filepath.Join(dir, "rootfs")); err != nil {
		errs = append(errs, err)
	} else if err := unmountAll(filepath.Join(dir, diskMount)); err != nil {
		// The loop device of the quota filesystem auto-clears here.
		errs = append(errs, err)
	}
	phase("unmount")
	if err := unmountVolumes(dir); err != nil {
		errs = append(errs, err)
	} else {
		// The sandbox's binds are gone: drop it from its named volumes'
		// users (the last one unmounts the volume's filesystem).
		for _, n := range named {
			if err := r.vols.Release(n, id); err != nil {
				errs = append(errs, err)
			}
		}
	}
	phase("volumes")
	if err := r.net.Teardown(ctx, id); err != nil {
		errs = append(errs, err)
	}
	phase("network")
	if err := removeCgroups(r.cgroupPath(id)); err != nil {
		errs = append(errs, err)
	}
	phase("cgroups")
	if len(errs) > 0 {
		// Keep the directory (and its record) so a later Delete retries.
		return fmt.Errorf("oci: delete %s: %w", id, errors.Join(errs...))
	}
	if left := mountsUnder(dir); len(left) > 0 {
		// Never RemoveAll through a mount (a host volume above all).
		return fmt.Errorf("oci: delete %s: still mounted: %v: %w", id, left, errdefs.ErrInternal)
	}
	if err := removeDirRetry(dir); err != nil {
		return fmt.Errorf("oci: delete %s: %w", id, err)
	}
	phase("dir")
	r.images.Unpin(id) // its root is unmounted: the layers may go
	return nil
}

// removeDirRetry is os.RemoveAll retried a few times on ENOTEMPTY: a
// runsc helper that is exiting (seen under heavy load) can still create a
// file in the sandbox directory while it is being removed.
func removeDirRetry(dir string) error {
	var err error
	for i := range 5 {
		if err = os.RemoveAll(dir); err == nil || !errors.Is(err, unix.ENOTEMPTY) {
			return err
		}
		time.Sleep(time.Duration(50<<i) * time.Millisecond)
	}
	return err
}

func (r *Runtime) deleteContainer(ctx context.Context, class, id string) error {
	if _, ok := r.classes[class]; !ok {
		return nil
	}
	if r.kinds[class] == runscKind {
		// runsc delete removes the .state file but may leave .lock files.
		defer removeRunscLeftovers(r.stateRoot(class), id)
	}
	if !r.hasState(class, id) {
		return nil
	}
	rc := r.runc(class)
	r.collectHelpers()
	if c, err := rc.State(ctx, id); err == nil && c.Status == "paused" {
		// SIGKILL is not delivered to frozen tasks until they thaw.
		rc.Kill(ctx, id, int(unix.SIGKILL), &gorunc.KillOpts{All: true})
		rc.Resume(ctx, id)
	}
	if err := rc.Delete(ctx, id, &gorunc.DeleteOpts{Force: true}); err != nil {
		if !r.hasState(class, id) {
			return nil
		}
		return fmt.Errorf("%s delete: %w", class, err)
	}
	return nil
}

// removeCgroups removes cgroup cg (a sandbox's) in every hierarchy, in
// case the OCI runtime did not (e.g. it crashed between creating and
// starting).
func removeCgroups(cg string) error {
	dirs := cgroupDirs(cg)
	var errs []error
	for _, d := range dirs {
		// Nested cgroups first (a cgroup namespace lets the sandbox make them).
		var sub []string
		filepath.WalkDir(d, func(p string, e os.DirEntry, err error) error {
			if err == nil && e.IsDir() && p != d {
				sub = append(sub, p)
			}
			return nil
		})
		for i := len(sub) - 1; i >= 0; i-- {
			unix.Rmdir(sub[i])
		}
		if err := unix.Rmdir(d); err != nil && !errors.Is(err, unix.ENOENT) {
			errs = append(errs, fmt.Errorf("remove cgroup %s: %w", d, err))
		}
	}
	return errors.Join(errs...)
}

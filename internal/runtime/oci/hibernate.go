package oci

import (
	"context"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	gorunc "github.com/containerd/go-runc"
	"golang.org/x/sys/unix"

	"github.com/moat-sandbox/moat/internal/agentproto"
	"github.com/moat-sandbox/moat/internal/errdefs"
	"github.com/moat-sandbox/moat/internal/image"
	"github.com/moat-sandbox/moat/internal/runtime"
)

// Hibernation (runtime.Hibernator) and the CPU counter (runtime.CPUReader).
//
// A runsc sandbox is checkpointed in place (`runsc checkpoint
// --leave-running` into sandboxes/<id>/hibernate), then its container is
// deleted; a wake restores it from that image in the same bundle and
// network namespace. A runc or crun sandbox has its container deleted
// and its writable layer (upper directory) kept; a wake mounts the root
// again and runs the container afresh. The record (state.json) says
// which, so that Status reports it Paused and a restarted server keeps it
// hibernated.
//
// Crash safety: the record is written hibernated only once the image is
// complete (runsc) and before the processes are stopped. A server killed
// before that finds the sandbox running (the checkpoint leaves it
// running); one killed after finds it hibernated, and recover finishes
// the stop. A sandbox found running with a hibernated record (a wake or a
// hibernate cut short) is running.

var (
	_ runtime.Hibernator = (*Runtime)(nil)
	_ runtime.CPUReader  = (*Runtime)(nil)
)

// hibSaving is record.Hibernated while a runsc checkpoint is under way.
const hibSaving = "saving"

// hibernateImage is the directory of a runsc sandbox's hibernation image.
func (r *Runtime) hibernateImage(id string) string {
	return filepath.Join(r.sandboxDir(id), "hibernate")
}

// hibernated reports whether rec is of a hibernated sandbox.
func hibernated(rec record) bool {
	return rec.Hibernated == runtime.HibernateMemory || rec.Hibernated == runtime.HibernateRestart
}

// hibernatedMessage is the Status message of a hibernated sandbox.
func hibernatedMessage(mode string) string {
	if mode == runtime.HibernateMemory {
		return "hibernated: memory saved to disk, processes continue on wake"
	}
	return "hibernated: processes stopped, writable layer kept; they start afresh on wake"
}

// HibernateMode implements runtime.Hibernator: runsc classes that can
// checkpoint save memory; runc and crun restart.
func (r *Runtime) HibernateMode(class string) string {
	if class == "" {
		class = r.cfg.DefaultClass
	}
	if _, ok := r.classes[class]; !ok {
		return ""
	}
	if r.kinds[class] == runscKind {
		if r.checkpointable[class] {
			return runtime.HibernateMemory
		}
		return ""
	}
	return runtime.HibernateRestart
}

// Hibernate implements runtime.Hibernator.
func (r *Runtime) Hibernate(ctx context.Context, id string) (h runtime.Hibernation, err error) {
	if !runtime.ValidID(id) {
		return h, fmt.Errorf("sandbox %q: %w", id, errdefs.ErrNotFound)
	}
	rec, err := r.readRecord(id)
	if err != nil {
		return h, err
	}
	mode := r.HibernateMode(rec.Class)
	switch {
	case mode == "":
		return h, errdefs.WithPublic(fmt.Errorf("hibernate a %s sandbox: %w", rec.Class, errdefs.ErrNotImplemented),
			"", fmt.Sprintf("runtime %s cannot hibernate sandboxes (gVisor runsc 0.0~%d or later, runc and crun can)", rec.Class, minCheckpointRunsc))
	case mode == runtime.HibernateMemory && len(rec.Spec.Mounts) > 0:
		return h, errdefs.WithPublic(fmt.Errorf("hibernate sandbox %q with volumes: %w", id, errdefs.ErrNotImplemented),
			"", "gVisor sandboxes with volumes cannot be hibernated")
	case !rec.Complete || rec.Hibernated != "":
		return h, fmt.Errorf("sandbox %q is not running: %w", id, errdefs.ErrFailedPrecondition)
	}
	c, found, err := r.containerState(ctx, rec.Class, id)
	if err != nil {
		return h, err
	}
	if !found || c.Status != "running" {
		return h, fmt.Errorf("sandbox %q is not running: %w", id, errdefs.ErrFailedPrecondition)
	}
	h = runtime.Hibernation{Mode: mode, FreedBytes: memoryUsage(r.cgroupPath(id))}
	t0 := time.Now()
	if mode == runtime.HibernateMemory {
		if h.DiskBytes, err = r.saveMemory(ctx, id, rec); err != nil {
			return runtime.Hibernation{}, err
		}
	}
	// The commit point: from here a restarted server finds it hibernated.
	rec.Hibernated = mode
	if err := r.writeRecord(id, rec); err != nil {
		r.abandonHibernate(id, rec)
		return runtime.Hibernation{}, fmt.Errorf("oci: %w", err)
	}
	if err := r.stopContainer(ctx, rec.Class, id); err != nil {
		if c, found, _ := r.containerState(ctx, rec.Class, id); found && c.Status == "running" {
			r.abandonHibernate(id, rec)
			return runtime.Hibernation{}, err
		}
		r.log.Warn("oci: hibernated sandbox's container not fully removed", "id", id, "err", err)
	}
	r.log.Debug("oci: hibernated", "id", id, "mode", mode, "freed", h.FreedBytes, "image", h.DiskBytes, "took", time.Since(t0))
	return h, nil
}

// saveMemory checkpoints runsc sandbox id into its hibernation image,
// leaving it running, and returns the image's size.
func (r *Runtime) saveMemory(ctx context.Context, id string, rec record) (int64, error) {
	rec.Hibernated = hibSaving
	if err := r.writeRecord(id, rec); err != nil {
		return 0, fmt.Errorf("oci: %w", err)
	}
	img := r.hibernateImage(id)
	os.RemoveAll(img)
	err := os.Mkdir(img, 0o700)
	if err == nil {
		err = r.runc(rec.Class).Checkpoint(ctx, id, &gorunc.CheckpointOpts{ImagePath: img}, gorunc.LeaveRunning)
		if err != nil {
			err = fmt.Errorf("oci: checkpoint %s: %w: %w", id, err, errdefs.ErrInternal)
		}
	}
	if err != nil {
		r.abandonHibernate(id, rec)
		return 0, err
	}
	return dirSize(img), nil
}

// abandonHibernate puts the record of a sandbox that stays running back
// and drops its image.
func (r *Runtime) abandonHibernate(id string, rec record) {
	rec.Hibernated = ""
	if err := r.writeRecord(id, rec); err != nil {
		r.log.Error("oci: cannot mark sandbox running again after a failed hibernate", "id", id, "err", err)
	}
	os.RemoveAll(r.hibernateImage(id))
}

// stopContainer kills sandbox id's processes and deletes its container
// and cgroup (its network, files and writable layer stay).
func (r *Runtime) stopContainer(ctx context.Context, class, id string) error {
	err := r.deleteContainer(ctx, class, id)
	killCgroupProcs(r.cgroupPath(id))
	if err == nil {
		err = removeCgroups(r.cgroupPath(id))
	}
	return err
}

// wake starts hibernated sandbox id again: a runsc restore from its image
// or a fresh run on its writable layer, in the same bundle and network
// namespace. It returns once the agent accepts connections. A wake that
// fails leaves it hibernated.
func (r *Runtime) wake(ctx context.Context, id string, rec record) (err error) {
	t0 := time.Now()
	dir := r.sandboxDir(id)
	// What is left of the stopped container (a crash before its delete).
	if err := r.stopContainer(ctx, rec.Class, id); err != nil {
		return err
	}
	os.Remove(filepath.Join(dir, "exit"))
	if n, ok := r.net.(interface {
		Readdress(ctx context.Context, id string) error
	}); ok {
		if err := n.Readdress(ctx, id); err != nil {
			return fmt.Errorf("oci: wake %s: %w", id, err)
		}
	}
	spec := rec.Spec
	spec.Class, spec.Checkpoint = rec.Class, ""
	rootfs := filepath.Join(dir, "rootfs")
	img := ""
	if rec.Hibernated == runtime.HibernateMemory {
		img = r.hibernateImage(id)
	} else {
		if err := unmountAll(rootfs); err != nil {
			return err
		}
		upper, work := writableDirs(dir)
		if err := image.MountRootfs(rec.Layers, upper, work, rootfs); err != nil {
			return fmt.Errorf("oci: wake %s: %w", id, err)
		}
		if err := unix.Mount("", rootfs, "", unix.MS_PRIVATE, ""); err != nil {
			unmountAll(rootfs)
			return fmt.Errorf("oci: make %s private: %w", rootfs, err)
		}
	}
	defer func() {
		if err != nil {
			r.stopContainer(context.WithoutCancel(ctx), rec.Class, id)
			if img == "" {
				unmountAll(rootfs)
			}
		}
	}()
	pid, err := r.start(ctx, spec, filepath.Join(dir, "bundle"), r.net.NetnsPath(id), img)
	if err != nil {
		return err
	}
	if img == "" {
		r.dropRootfs(rootfs)
	}
	mode := rec.Hibernated
	rec.Hibernated = ""
	if err := r.writeRecord(id, rec); err != nil {
		return fmt.Errorf("oci: %w", err)
	}
	r.track(pid, id)
	r.trackHelpers(rec.Class, id, pid)
	if img != "" {
		os.RemoveAll(img)
	}
	if err := awaitAgent(ctx, rec.IP, 30*time.Second); err != nil {
		r.log.Warn("oci: woken sandbox's agent does not answer", "id", id, "err", err)
	}
	r.log.Debug("oci: woke", "id", id, "mode", mode, "took", time.Since(t0))
	return nil
}

// awaitAgent waits until the agent at ip accepts TCP connections.
func awaitAgent(ctx context.Context, ip string, d time.Duration) error {
	if ip == "" {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	addr := net.JoinHostPort(ip, strconv.Itoa(agentproto.Port))
	var dl net.Dialer
	for {
		c, err := dl.DialContext(ctx, "tcp", addr)
		if err == nil {
			c.Close()
			return nil
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// recoverHibernation settles sandbox id's hibernation at start-up (see
// the crash rules above) and reports whether it is hibernated (its init
// is not to be tracked).
func (r *Runtime) recoverHibernation(ctx context.Context, id string, rec record) bool {
	if rec.Hibernated == "" {
		return false
	}
	c, found, err := r.containerState(ctx, rec.Class, id)
	running := err == nil && found && (c.Status == "running" || c.Status == "paused")
	if rec.Hibernated == hibSaving || running {
		r.log.Info("oci: sandbox found running after a hibernate or wake was cut short", "id", id)
		r.abandonHibernate(id, rec)
		return false
	}
	if err := r.stopContainer(ctx, rec.Class, id); err != nil {
		r.log.Warn("oci: hibernated sandbox's leftover container", "id", id, "err", err)
	}
	return true
}

// CPUUsage implements runtime.CPUReader from the sandbox's cgroup: v2
// cpu.stat usage_usec, v1 cpuacct.usage.
func (r *Runtime) CPUUsage(ctx context.Context, id string) (time.Duration, error) {
	if !runtime.ValidID(id) {
		return 0, fmt.Errorf("sandbox %q: %w", id, errdefs.ErrNotFound)
	}
	if _, err := r.readRecord(id); err != nil {
		return 0, err
	}
	if d, ok := cgroupCPU(r.cgroupPath(id)); ok {
		return d, nil
	}
	return 0, fmt.Errorf("cpu usage of sandbox %q: no cgroup counter: %w", id, errdefs.ErrUnavailable)
}

// cgroupCPU reads the CPU time of cgroup cg.
func cgroupCPU(cg string) (time.Duration, bool) {
	if us, ok := cgroupField(cgroupRoot+cg+"/cpu.stat", "usage_usec"); ok {
		return time.Duration(us) * time.Microsecond, true
	}
	for _, f := range []string{cgroupRoot + "/cpuacct" + cg + "/cpuacct.usage", cgroupRoot + "/cpu,cpuacct" + cg + "/cpuacct.usage"} {
		data, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		if ns, err := strconv.ParseInt(strings.TrimSpace(string(data)), 10, 64); err == nil {
			return time.Duration(ns), true
		}
	}
	return 0, false
}

// memoryUsage is the memory cgroup cg holds in bytes (v2 memory.current,
// v1 memory.usage_in_bytes; 0 if unknown).
func memoryUsage(cg string) int64 {
	for _, f := range []string{cgroupRoot + cg + "/memory.current", cgroupRoot + "/memory" + cg + "/memory.usage_in_bytes"} {
		data, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		if n, err := strconv.ParseInt(strings.TrimSpace(string(data)), 10, 64); err == nil {
			return n
		}
	}
	return 0
}

// dirSize is the size of the regular files under dir.
func dirSize(dir string) int64 {
	var n int64
	filepath.WalkDir(dir, func(_ string, e fs.DirEntry, err error) error {
		if err != nil {
			return nil
		}
		if info, err := e.Info(); err == nil && info.Mode().IsRegular() {
			n += info.Size()
		}
		return nil
	})
	return n
}

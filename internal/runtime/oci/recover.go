package oci

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/moat-sandbox/moat/internal/runtime"
	"golang.org/x/sys/unix"
)

// Recovery at start-up: what a crashed or SIGKILLed server left behind.

// recover removes sandboxes whose creation never completed, OCI
// containers and network attachments that belong to no sandbox, and
// re-tracks the init processes of running sandboxes for reaping.
func (r *Runtime) recover(ctx context.Context) error {
	entries, err := os.ReadDir(r.sandboxesDir())
	if err != nil {
		return fmt.Errorf("oci: %w", err)
	}
	known := map[string]bool{}
	for _, e := range entries {
		id := e.Name()
		if !runtime.ValidID(id) {
			continue
		}
		rec, err := r.readRecord(id)
		if err == nil && rec.Complete {
			known[id] = true
			r.pinLayers(id, rec)
			if r.recoverHibernation(ctx, id, rec) {
				continue
			}
			if pid, err := readPid(filepath.Join(r.sandboxDir(id), "pid")); err == nil {
				r.track(pid, id)
				r.trackHelpers(rec.Class, id, pid)
			}
			continue
		}
		r.log.Info("oci: removing half-created sandbox", "id", id)
		if err := r.cleanupHalfCreated(ctx, id); err != nil {
			// Its directory stays, so the next start (or a Delete) retries;
			// refusing to start would strand every healthy sandbox.
			r.log.Error("oci: could not remove half-created sandbox", "id", id, "err", err)
		}
	}
	for class := range r.classes {
		for _, id := range r.stateIDs(class) {
			if !known[id] {
				r.log.Info("oci: removing orphaned container", "id", id, "class", class)
				if err := r.deleteContainer(ctx, class, id); err != nil {
					return err
				}
				removeCgroups(r.cgroupPath(id))
			}
		}
	}
	// Named volumes: drop users that are no sandbox any more (a crash
	// between a create's Acquire and its record, or a delete's unmount
	// and Release) and unmount volumes left without users.
	if err := r.vols.Sweep(func(id string) bool { return known[id] }); err != nil {
		r.log.Error("oci: named volumes", "err", err)
	}
	atts, err := r.net.List(ctx)
	if err != nil {
		return err
	}
	for _, a := range atts {
		if !known[a.ID] {
			r.log.Info("oci: removing orphaned network", "id", a.ID)
			if err := r.net.Teardown(ctx, a.ID); err != nil {
				return err
			}
		}
	}
	return nil
}

// cleanupHalfCreated removes a sandbox whose Create never completed. The
// OCI runtime process the dead server started may still be running (it is
// not killed with the server) and create the container after a first
// cleanup pass, so cleanup is retried for a few seconds.
func (r *Runtime) cleanupHalfCreated(ctx context.Context, id string) error {
	var err error
	for attempt := range 10 {
		if err = r.cleanup(ctx, id); err == nil {
			// The late runtime process may still create the container
			// once more; one more pass after it had time to finish.
			if attempt == 0 {
				time.Sleep(200 * time.Millisecond)
				if exists(r.sandboxDir(id)) || r.anyState(id) || cgroupsExist(r.cgroupPath(id)) {
					continue
				}
			}
			return nil
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(300 * time.Millisecond):
		}
	}
	return err
}

// anyState reports whether any OCI runtime holds state for id.
func (r *Runtime) anyState(id string) bool {
	for class := range r.classes {
		if r.hasState(class, id) {
			return true
		}
	}
	return false
}

// cgroupPath is the cgroup of sandbox id (Config.CgroupParent/id), the
// same path in every hierarchy.
func (r *Runtime) cgroupPath(id string) string { return r.cfg.CgroupParent + "/" + id }

// cgroupDirs returns the directories of cgroup path cg (v1 and v2).
//
// It stats cg under each entry of /sys/fs/cgroup (one per v1 controller)
// rather than globbing "/sys/fs/cgroup/*"+cg: a glob reads the parent
// directory of cg in full under every controller, which holds one entry
// per sandbox, so each call cost O(sandboxes) (17% of the server's CPU in
// a 300-sandbox batch, most of it in deletes).
func cgroupDirs(cg string) []string {
	var dirs []string
	ents, _ := os.ReadDir("/sys/fs/cgroup")
	for _, e := range ents {
		if d := "/sys/fs/cgroup/" + e.Name() + cg; exists(d) {
			dirs = append(dirs, d)
		}
	}
	if d := "/sys/fs/cgroup" + cg; exists(d) {
		dirs = append(dirs, d)
	}
	return dirs
}

func cgroupsExist(cg string) bool { return len(cgroupDirs(cg)) > 0 }

// cgroupPids lists the processes in cgroup cg, nested cgroups included.
func cgroupPids(cg string) []int {
	seen := map[int]bool{}
	var out []int
	for _, d := range cgroupDirs(cg) {
		filepath.WalkDir(d, func(p string, e os.DirEntry, err error) error {
			if err != nil || e.IsDir() || e.Name() != "cgroup.procs" {
				return nil
			}
			data, _ := os.ReadFile(p)
			for _, f := range strings.Fields(string(data)) {
				if pid, err := strconv.Atoi(f); err == nil && pid > 0 && !seen[pid] {
					seen[pid] = true
					out = append(out, pid)
				}
			}
			return nil
		})
	}
	return out
}

// killCgroupProcs SIGKILLs every process left in cgroup cg (thawing a
// frozen one first) and waits up to 2s for them to go.
func killCgroupProcs(cg string) {
	pids := cgroupPids(cg)
	if len(pids) == 0 {
		return
	}
	for _, d := range cgroupDirs(cg) {
		if st := filepath.Join(d, "freezer.state"); exists(st) {
			os.WriteFile(st, []byte("THAWED"), 0o644)
		}
		if fz := filepath.Join(d, "cgroup.freeze"); exists(fz) {
			os.WriteFile(fz, []byte("0"), 0o644)
		}
	}
	deadline := time.Now().Add(2 * time.Second)
	for len(pids) > 0 && time.Now().Before(deadline) {
		for _, pid := range pids {
			killInCgroup(pid, cg)
		}
		time.Sleep(20 * time.Millisecond)
		pids = cgroupPids(cg)
	}
}

// killInCgroup SIGKILLs pid only if it is still a process of cgroup cg.
// A listed pid may exit (its zombie is listed until reaped) and be reused
// by an unrelated process, for example the agent of a sandbox being
// created at the same time, before the signal is sent: the pidfd pins one
// process, and the cgroup check after opening it makes sure that process
// belongs to cg.
func killInCgroup(pid int, cg string) {
	fd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		return // gone
	}
	defer unix.Close(fd)
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cgroup")
	if err != nil || !strings.Contains(string(data), ":"+cg+"\n") && !strings.Contains(string(data), ":"+cg+"/") {
		return // reused by a process of another cgroup
	}
	unix.PidfdSendSignal(fd, unix.SIGKILL, nil, 0)
}

// pinLayers pins the image layers of re-adopted sandbox id: those of its
// record or, for a record of an older build, the lower dirs of its mounted
// root filesystem.
func (r *Runtime) pinLayers(id string, rec record) {
	layers := rec.Layers
	if len(layers) == 0 {
		layers = overlayLowers(filepath.Join(r.sandboxDir(id), "rootfs"))
	}
	if len(layers) == 0 {
		return
	}
	if err := r.images.Pin(id, layers); err != nil {
		r.log.Error("oci: cannot pin the image layers of a re-adopted sandbox; image GC may remove them", "id", id, "err", err)
	}
}

// overlayLowers returns the lower dirs (bottom first) of the overlay
// mounted at target, from /proc/self/mountinfo; nil if there is none or
// they were passed as /proc/self/fd paths.
func overlayLowers(target string) []string {
	data, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return nil
	}
	for _, line := range strings.Split(string(data), "\n") {
		f := strings.Fields(line)
		sep := slices.Index(f, "-")
		if len(f) < 5 || f[4] != target || sep < 0 || sep+3 >= len(f) || f[sep+1] != "overlay" {
			continue
		}
		for _, opt := range strings.Split(f[sep+3], ",") {
			if dirs, ok := strings.CutPrefix(opt, "lowerdir="); ok && !strings.Contains(dirs, "/proc/self/fd/") {
				top := strings.Split(dirs, ":")
				slices.Reverse(top)
				return top
			}
		}
	}
	return nil
}

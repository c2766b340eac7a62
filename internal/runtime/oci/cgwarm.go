package oci

import (
	"os"
	"path/filepath"
	"strings"
)

// warmCgroupAttach starts, in the background, the RCU grace period that the
// OCI runtime's first cgroup attach of a create waits for, so that the
// wait overlaps the other create steps instead of following them.
//
// Why: moving a process into a cgroup (a write to cgroup.procs, which runc,
// crun and runsc do for every new container on a cgroup v1 host) takes the
// kernel's global cgroup_threadgroup_rwsem for writing. When nobody wrote
// it during the last grace period, that first waits for a full RCU grace
// period: 8-15 ms on a 2-core HZ=250 host, a third of a whole create.
// Writes that arrive while a grace period for the lock is running or has
// just ended do not wait again. So each create here moves moat itself into
// the cgroup it is already in (cgroup.procs "0": the writer's own process;
// a no-op move) as soon as the create starts, on a goroutine nobody waits
// for; when the runtime attaches the sandbox some milliseconds later, most
// or all of the grace period is over.
//
// It is best effort: any error (no cgroup file, read-only cgroupfs) only
// means the runtime waits as it did before. At most one is in flight.
func (r *Runtime) warmCgroupAttach() {
	if !r.warming.CompareAndSwap(false, true) {
		return
	}
	r.warmed.Add(1)
	go func() {
		defer r.warmed.Done()
		defer r.warming.Store(false)
		procs := selfCgroupProcs()
		if procs == "" {
			return
		}
		f, err := os.OpenFile(procs, os.O_WRONLY, 0)
		if err != nil {
			return
		}
		f.WriteString("0")
		f.Close()
	}()
}

// selfCgroupProcs returns the cgroup.procs file of the cgroup this process
// is in: in the v1 pids hierarchy, else in the v2 hierarchy; "" if neither
// is found.
func selfCgroupProcs() string {
	data, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		return ""
	}
	v2 := ""
	for line := range strings.SplitSeq(strings.TrimSpace(string(data)), "\n") {
		f := strings.SplitN(line, ":", 3)
		if len(f) != 3 || !strings.HasPrefix(f[2], "/") {
			continue
		}
		switch {
		case f[1] == "pids":
			if p := filepath.Join("/sys/fs/cgroup/pids", f[2], "cgroup.procs"); exists(p) {
				return p
			}
		case f[0] == "0" && f[1] == "":
			// On a hybrid host the v2 hierarchy is /sys/fs/cgroup/unified.
			for _, root := range []string{"/sys/fs/cgroup", "/sys/fs/cgroup/unified"} {
				if p := filepath.Join(root, f[2], "cgroup.procs"); v2 == "" && exists(p) && exists(filepath.Join(root, "cgroup.controllers")) {
					v2 = p
				}
			}
		}
	}
	return v2
}

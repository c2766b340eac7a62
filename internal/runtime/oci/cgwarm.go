package oci

import (
	"os"
	goruntime "runtime"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// warmCgroupAttach starts, in the background, the RCU grace period that the
// OCI runtime's first cgroup attach of a create waits for, so that the
// wait overlaps the other create steps instead of following them.
//
// Why: moving a process into a cgroup v1 hierarchy (the write to
// cgroup.procs that runc, crun and runsc make for every new container on a
// cgroup v1 host) takes the kernel's global cgroup_threadgroup_rwsem for
// writing, and when nobody wrote it during the last grace period that
// first waits for a full RCU grace period: 8-15 ms on a 2-core HZ=250
// host, a third of a whole create. A writer that comes while a grace
// period for the lock runs or has just ended does not wait again. So when
// a create starts while no other is in flight, one thread of moat moves
// itself into the cgroup it is already in (its own TID written to the
// pids hierarchy's "tasks" file: a no-op move of that one thread), on a
// goroutine nobody waits for; when the runtime attaches the sandbox some
// milliseconds later, most or all of the grace period is over. Concurrent
// creates keep the lock warm for each other, so they skip it.
//
// It is best effort: without a v1 pids hierarchy (cgroup v2 runtimes
// create into the cgroup with clone3 and take no such lock) or on any
// error, the runtime waits as it did before. At most one is in flight.
func (r *Runtime) warmCgroupAttach() {
	tasks := r.tasksFile
	if tasks == "" || !r.warming.CompareAndSwap(false, true) {
		return
	}
	r.warmed.Add(1)
	go func() {
		defer r.warmed.Done()
		defer r.warming.Store(false)
		// The thread stays locked: it exits with the goroutine, so a thread
		// written to a cgroup the process has since left never runs moat's
		// code again.
		goruntime.LockOSThread()
		f, err := os.OpenFile(tasks, os.O_WRONLY, 0)
		if err != nil {
			return
		}
		f.WriteString(strconv.Itoa(unix.Gettid()))
		f.Close()
	}()
}

// selfTasksFile returns the "tasks" file of the cgroup v1 pids hierarchy
// cgroup this process is in, "" if there is none.
func selfTasksFile() string {
	data, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		return ""
	}
	for line := range strings.SplitSeq(strings.TrimSpace(string(data)), "\n") {
		f := strings.SplitN(line, ":", 3)
		if len(f) == 3 && f[1] == "pids" && strings.HasPrefix(f[2], "/") {
			if p := "/sys/fs/cgroup/pids" + strings.TrimSuffix(f[2], "/") + "/tasks"; exists(p) {
				return p
			}
		}
	}
	return ""
}

package oci

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/moat-sandbox/moat/internal/runtime"
)

// Exit notification (runtime.ExitNotifier): the watch of each sandbox
// init (track, reap.go) calls exited the moment the init ends, which
// classifies the exit with the sandbox's cgroup and tells the
// subscribers.

// NotifyExits implements runtime.ExitNotifier.
func (r *Runtime) NotifyExits(f func(runtime.Exit)) {
	r.exitMu.Lock()
	defer r.exitMu.Unlock()
	r.exitFns = append(r.exitFns, f)
}

// exited reports the end of sandbox id's init: code is its exit status
// (-1 if unknown), oomBase the sandbox's OOM kill count when the watch
// began. The reason is stored with the exit code (sandboxes/<id>/exit),
// so that Status tells it too.
func (r *Runtime) exited(id string, code int, oomBase int64) {
	if rec, err := r.readRecord(id); err == nil && hibernated(rec) {
		r.log.Debug("oci: hibernated sandbox's init ended", "id", id, "code", code)
		return
	}
	ex := runtime.Exit{ID: id, Reason: runtime.ExitReasonExited, ExitCode: code}
	if r.oomKilled(id, code, oomBase) {
		ex.Reason = runtime.ExitReasonOOMKilled
		if limit := memoryLimit(r.cgroupPath(id)); limit > 0 {
			ex.Message = fmt.Sprintf("memory limit %d MiB", limit>>20)
		}
	}
	if code >= 0 || ex.Reason != runtime.ExitReasonExited {
		os.WriteFile(filepath.Join(r.sandboxDir(id), "exit"), []byte(strconv.Itoa(code)+" "+ex.Reason), 0o600)
	}
	r.log.Debug("oci: sandbox init exited", "id", id, "reason", ex.Reason, "code", code)
	r.exitMu.Lock()
	fns := r.exitFns
	r.exitMu.Unlock()
	for _, f := range fns {
		f(ex)
	}
}

// oomKilled tells whether the init of sandbox id, ended with code, was
// killed by the OOM killer: the cgroup's OOM kill count moved since the
// watch began (oomBase), and the init died of SIGKILL (what the OOM killer
// sends) or, for runsc, whose Sentry is the sandbox, in any way (the
// Sentry ends when the OOM killer takes its gofer).
func (r *Runtime) oomKilled(id string, code int, oomBase int64) bool {
	n := oomKills(r.cgroupPath(id))
	if n <= oomBase {
		return false
	}
	if code == 128+9 || code < 0 {
		return true
	}
	rec, err := r.readRecord(id)
	return err == nil && r.kinds[rec.Class] == runscKind
}

// oomKills is the number of processes the OOM killer took in cgroup cg
// (cgroup v2 memory.events oom_kill, v1 memory.oom_control oom_kill), 0
// if the kernel does not count them.
func oomKills(cg string) int64 {
	for _, f := range []string{cgroupRoot + cg + "/memory.events", cgroupRoot + "/memory" + cg + "/memory.oom_control"} {
		if n, ok := cgroupField(f, "oom_kill"); ok {
			return n
		}
	}
	return 0
}

// memoryLimit is the memory limit of cgroup cg in bytes (0: none or
// unknown).
func memoryLimit(cg string) int64 {
	for _, f := range []string{cgroupRoot + cg + "/memory.max", cgroupRoot + "/memory" + cg + "/memory.limit_in_bytes"} {
		data, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		n, err := strconv.ParseInt(strings.TrimSpace(string(data)), 10, 64)
		if err != nil || n >= 1<<62 { // "max", or v1's page-rounded "unlimited"
			return 0
		}
		return n
	}
	return 0
}

// cgroupField reads the value of key from a flat-keyed cgroup file
// ("key value" lines).
func cgroupField(file, key string) (int64, bool) {
	data, err := os.ReadFile(file)
	if err != nil {
		return 0, false
	}
	for line := range strings.SplitSeq(string(data), "\n") {
		if k, v, ok := strings.Cut(line, " "); ok && k == key {
			n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
			return n, err == nil
		}
	}
	return 0, false
}

// readExit parses sandboxes/<id>/exit: "<code>[ <reason>]".
func readExit(data []byte) (code int, reason string) {
	f := strings.Fields(string(data))
	if len(f) > 0 {
		code, _ = strconv.Atoi(f[0])
	}
	if len(f) > 1 {
		reason = f[1]
	}
	return code, reason
}

package oci

import (
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Reaping as a child subreaper: sandbox inits (their exit codes go to
// sandboxes/<id>/exit), the helper processes runsc leaves behind, and any
// other orphan the server inherits.

// track registers a container init for reaping (if Subreaper is on).
func (r *Runtime) track(pid int, id string) {
	if r.stop == nil {
		return
	}
	r.reapMu.Lock()
	r.reapPids[pid] = id
	r.reapMu.Unlock()
	r.reap() // it may have exited before we tracked it
}

// trackHelpers registers the helper processes of a runsc sandbox (see
// Runtime.helpers) for reaping, if Subreaper is on.
func (r *Runtime) trackHelpers(class, id string, pid int) {
	if r.stop == nil || r.kinds[class] != runscKind {
		return
	}
	r.reapMu.Lock()
	defer r.reapMu.Unlock()
	r.runscInits[pid] = true
	r.sawRunsc = true
	if gofer := runscGoferPid(r.stateRoot(class), id); gofer > 0 {
		r.addHelperLocked(gofer)
	}
	r.collectHelpersLocked()
}

func (r *Runtime) addHelperLocked(pid int) {
	if _, ok := r.helpers[pid]; ok {
		return
	}
	if st, ok := readProcStat(pid); ok {
		r.helpers[pid] = st.start
	}
}

// collectHelpersLocked adds the current descendants of each live runsc
// sandbox to helpers.
func (r *Runtime) collectHelpersLocked() {
	for pid := range r.runscInits {
		if _, live := r.reapPids[pid]; !live {
			delete(r.runscInits, pid)
			continue
		}
		for _, d := range descendants(pid) {
			r.addHelperLocked(d)
		}
	}
}

// collectHelpers is collectHelpersLocked for callers about to kill a
// sandbox, so that helpers started since the last tick are known.
func (r *Runtime) collectHelpers() {
	if r.stop == nil {
		return
	}
	r.reapMu.Lock()
	r.collectHelpersLocked()
	r.reapMu.Unlock()
}

// reapLoop reaps exited sandbox inits on SIGCHLD. It waits only for the
// tracked PIDs, never for "any child", so it does not race with os/exec.
func (r *Runtime) reapLoop() {
	defer close(r.done)
	ch := make(chan os.Signal, 1)
	signal.Notify(ch, syscall.SIGCHLD)
	defer signal.Stop(ch)
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		select {
		case <-r.stop:
			return
		case <-ch:
		case <-tick.C:
		}
		r.reap()
	}
}

func (r *Runtime) reap() {
	r.reapMu.Lock()
	defer r.reapMu.Unlock()
	r.collectHelpersLocked()
	for pid, id := range r.reapPids {
		var ws unix.WaitStatus
		got, err := unix.Wait4(pid, &ws, unix.WNOHANG, nil)
		if got == 0 && err == nil {
			continue // still running
		}
		delete(r.reapPids, pid)
		if err != nil {
			continue // not our child (adopted by another process)
		}
		code := ws.ExitStatus()
		if ws.Signaled() {
			code = 128 + int(ws.Signal())
		}
		os.WriteFile(filepath.Join(r.sandboxDir(id), "exit"), []byte(strconv.Itoa(code)), 0o600)
	}
	self := os.Getpid()
	for pid, start := range r.helpers {
		st, ok := readProcStat(pid)
		if !ok || st.start != start {
			delete(r.helpers, pid) // gone, or the PID was reused
			continue
		}
		if st.state != 'Z' || st.ppid != self {
			continue // running, or not (yet) adopted by us
		}
		unix.Wait4(pid, nil, unix.WNOHANG, nil)
		delete(r.helpers, pid)
	}
	r.reapOrphansLocked()
}

// reapOrphansLocked reaps the zombie children nobody waits for: orphans
// this subreaper inherited (the processes of a sandbox whose init left
// them behind, a dead runtime CLI's children, ...), whatever their name.
// os/exec reaps its own children in Cmd.Wait, normally the moment they
// exit, and at worst (a child that exits before its caller reached Wait)
// a scheduling delay later: a zombie child that has been one for
// orphanGrace is one nobody will wait for. Tracked sandbox inits are left
// to reap, which records their exit codes. gVisor's helpers (comm "exe":
// sandbox, gofer and ptrace stubs re-exec /proc/self/exe, and nothing
// else this process starts is called that) are reaped at once. The caller
// holds reapMu.
func (r *Runtime) reapOrphansLocked() {
	// The scan reads every process's stat: at most once a second (reap
	// also runs on every SIGCHLD and every create), unless runsc helpers,
	// which are reaped at once, may be waiting.
	if !r.sawRunsc && time.Since(r.lastOrphanScan) < time.Second {
		return
	}
	r.lastOrphanScan = time.Now()
	self := os.Getpid()
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return
	}
	now := time.Now()
	seen := map[zombie]time.Time{}
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if _, tracked := r.reapPids[pid]; tracked {
			continue
		}
		st, ok := readProcStat(pid)
		if !ok || st.state != 'Z' || st.ppid != self {
			continue
		}
		z := zombie{pid, st.start}
		first, before := r.zombies[z]
		if !before {
			first = now
		}
		if now.Sub(first) < orphanGrace && !(r.sawRunsc && procComm(pid) == "exe") {
			seen[z] = first
			continue
		}
		unix.Wait4(pid, nil, unix.WNOHANG, nil)
		delete(r.helpers, pid)
	}
	r.zombies = seen
}

// orphanGrace is how long a zombie child stays before reapOrphansLocked
// takes it for an orphan.
const orphanGrace = 5 * time.Second

// zombie identifies a process across PID reuse.
type zombie struct {
	pid   int
	start uint64
}

// procComm is the command name of pid ("" if gone).
func procComm(pid int) string {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/comm")
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}

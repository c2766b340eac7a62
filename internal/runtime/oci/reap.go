package oci

import (
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Reaping as a child subreaper: sandbox inits (their exit codes go to
// sandboxes/<id>/exit), the helper processes runsc leaves behind, and any
// other orphan the server inherits. Watching the inits: every exit is
// reported to the NotifyExits subscribers at once (exit.go).

// track watches a container init: a goroutine per init waits, parked in
// the poller, for its pidfd to turn readable (the init exited), reaps it
// then (if Subreaper is on) and reports the exit. A SIGCHLD costs nothing
// per tracked sandbox (a wait4 for each one on every SIGCHLD cost O(n)
// with n sandboxes, and SIGCHLDs come with every runtime call). Without
// Subreaper the init is not this process's child: its exit is still
// seen (a pidfd works for any process), without its exit code.
func (r *Runtime) track(pid int, id string) {
	oomBase := oomKills(r.cgroupPath(id))
	r.reapMu.Lock()
	if r.stop != nil {
		r.reapPids[pid] = id
	}
	fd, err := unix.PidfdOpen(pid, unix.PIDFD_NONBLOCK)
	if err == nil {
		f := os.NewFile(uintptr(fd), "pidfd")
		r.pidfds[pid] = f
		r.watching.Add(1)
		go r.awaitInit(pid, id, f, oomBase)
	}
	r.reapMu.Unlock()
	if err != nil {
		r.exited(id, r.reapInit(pid), oomBase) // gone already
	}
}

// awaitInit reaps the tracked init pid of sandbox id once its pidfd f is
// readable and reports the exit, or returns when Close closes f. oomBase
// is the sandbox's OOM kill count when the watch began.
func (r *Runtime) awaitInit(pid int, id string, f *os.File, oomBase int64) {
	defer r.watching.Done()
	exited := false
	if rc, err := f.SyscallConn(); err == nil {
		rc.Read(func(fd uintptr) bool {
			fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
			n, err := unix.Poll(fds, 0)
			exited = err == nil && n > 0
			return exited
		})
	}
	r.reapMu.Lock()
	if r.pidfds[pid] == f {
		delete(r.pidfds, pid)
	}
	f.Close()
	code := -1
	if exited {
		code = r.reapInitLocked(pid)
	}
	r.reapMu.Unlock()
	if exited {
		r.exited(id, code, oomBase)
	}
}

// stopAwaiting ends the awaitInit goroutines (Close).
func (r *Runtime) stopAwaiting() {
	r.reapMu.Lock()
	for _, f := range r.pidfds {
		f.Close()
	}
	r.reapMu.Unlock()
	r.watching.Wait()
}

// reapInit is reapInitLocked for callers without reapMu.
func (r *Runtime) reapInit(pid int) int {
	r.reapMu.Lock()
	defer r.reapMu.Unlock()
	return r.reapInitLocked(pid)
}

// reapInitLocked reaps the tracked init pid if it exited, records its
// exit code in sandboxes/<id>/exit and returns it (-1 if it did not reap
// it). The caller holds reapMu.
func (r *Runtime) reapInitLocked(pid int) int {
	id, ok := r.reapPids[pid]
	if !ok {
		return -1
	}
	var ws unix.WaitStatus
	got, err := unix.Wait4(pid, &ws, unix.WNOHANG, nil)
	if got == 0 && err == nil {
		return -1 // still running
	}
	delete(r.reapPids, pid)
	if err != nil {
		return -1 // not our child (adopted by another process)
	}
	code := ws.ExitStatus()
	if ws.Signaled() {
		code = 128 + int(ws.Signal())
	}
	os.WriteFile(filepath.Join(r.sandboxDir(id), "exit"), []byte(strconv.Itoa(code)), 0o600)
	return code
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

// reapLoop reaps, on SIGCHLD and once a second, the runsc helpers and the
// orphans this subreaper inherits (tracked inits are awaitInit's). It
// waits only for PIDs it knows are zombies no one else waits for, never
// for "any child", so it does not race with os/exec.
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

// firstZombieChild returns the PID of a zombie child of this process
// without reaping it, 0 if there is none.
func firstZombieChild() int {
	var info unix.Siginfo
	if err := unix.Waitid(unix.P_ALL, 0, &info, unix.WEXITED|unix.WNOHANG|unix.WNOWAIT, nil); err != nil {
		return 0
	}
	// siginfo_t of SIGCHLD: si_pid is the first field of the union, right
	// after si_signo, si_errno, si_code (and padding on 64-bit), which
	// x/sys/unix.Siginfo does not name.
	type sigchldInfo struct {
		Signo, Errno, Code int32
		_                  int32
		Pid                int32
	}
	return int((*sigchldInfo)(unsafe.Pointer(&info)).Pid)
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
	// The scan reads every process's stat (2,000 and more with 1,000
	// sandboxes): only when there is a zombie child at all (one waitid
	// that reaps nothing tells), and then at most every orphanScanEvery,
	// unless runsc helpers, which are reaped at once, may be waiting.
	if !r.sawRunsc {
		if firstZombieChild() <= 0 {
			r.zombies = nil
			return
		}
		if time.Since(r.lastOrphanScan) < orphanScanEvery {
			return
		}
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

// orphanScanEvery is the least time between two scans for orphans.
const orphanScanEvery = 2 * time.Second

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

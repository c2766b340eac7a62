package oci

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	goruntime "runtime"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// runscKind is the base name that marks a class binary as gVisor's runsc.
const runscKind = "runsc"

// runscArgs are the global flags given to every runsc invocation.
//
//   - --network=sandbox (the default, spelled out): the application's
//     sockets are served by gVisor's own TCP/IP stack (netstack) inside
//     the Sentry; the host kernel only sees raw frames on the sandbox's
//     veth through an AF_PACKET socket. runsc takes the veth's address
//     over inside the network namespace that network.Manager created, so
//     the moat bridge, the address plan and the host-side egress rules
//     apply unchanged. We deliberately do not use --network=host
//     ("hostinet"): it would still be confined to our namespace, but it
//     would forward every socket call of the application to the host
//     kernel's network stack, the largest part of the host attack surface
//     that gVisor exists to remove. See runscStart for the workaround
//     that older runsc releases need on recent kernels.
//   - --gso=false: with host GSO, runsc (20221219) sets PACKET_VNET_HDR on
//     the AF_PACKET socket, and on Linux 6.18 netstack then receives
//     nothing (not even ARP). gVisor's software GSO (--software-gso, on by
//     default) keeps large writes efficient.
//   - --oci-seccomp: runsc ignores the spec's seccomp profile unless told
//     otherwise; with it the Sentry applies the same deny-list to the
//     application as runc and crun do (the Sentry itself is confined by
//     runsc's own host seccomp filter either way).
//   - the platform is left at runsc's default: ptrace on releases before
//     mid-2023 and systrap after, neither of which needs /dev/kvm. KVM
//     would be faster but is unavailable on most hosts (nested VMs).
//   - cgroups are configured (no --ignore-cgroups): runsc puts the
//     sandbox, gofer and Sentry in Linux.CgroupsPath on cgroup v1 and v2,
//     so the CPU, memory and pids limits hold for the whole sandbox.
var runscArgs = []string{"--network=sandbox", "--gso=false", "--oci-seccomp"}

// runscPidsHeadroom is added to a runsc sandbox's pids limit. The host's
// pids cgroup holds the Sentry and the gofer too, and their own threads
// count against it: 63 when idle and about 90 after one exec (runsc
// 20221219), growing with the Go runtime's threads under load, so the
// limit passed unchanged killed sandboxes of pids=128 within a minute
// ("fork rejected by pids controller"). That runsc release enforces no
// pids limit inside the sandbox, so the host's limit stays the one that
// stops a fork bomb, raised by this margin for the Sentry's threads.
const runscPidsHeadroom = 256

// runscProcNetCore is the directory whose contents older runsc releases
// use to detect the host's root network namespace.
const runscProcNetCore = "/proc/sys/net/core"

// runscStart calls start, which must start the runsc process on the
// calling goroutine (as gorunc.Runc.Run does), so that runsc sees an empty
// /proc/sys/net/core while it is in the sandbox's network namespace
// netnsPath.
//
// Why: before it moves the veth into netstack, `runsc run` refuses to
// work in the host's root network namespace, which it detects by the
// presence of /proc/sys/net/core/rmem_default (runsc/sandbox/network.go,
// isRootNS). Since Linux 6.11 or so that sysctl exists in every network
// namespace, so runsc releases without the upstream fix (gVisor issue
// #10704, 2024; Debian 12 ships 20221219) reject every namespace with
// "cannot run with network enabled in root network namespace", including
// the fresh netns we pass in the spec. The check is a sanity heuristic,
// not a security boundary, and our spec always names a sandbox netns of
// its own, so we hide the file from that one check.
//
// How: on a locked OS thread, unshare the mount namespace and make it
// private, enter netnsPath and mount an empty read-only tmpfs on
// /proc/sys/net/core (procfs keeps a separate dentry per network
// namespace, so the mask covers only that namespace's view), return to
// the original network namespace, and start runsc, which inherits the
// mount namespace. The host's mounts are unaffected, and runsc's sandbox
// and gofer processes build their own mount namespaces, chroots and
// procfs instances, so only `runsc run` sees the mask. The thread is
// never unlocked, so Go discards it afterwards instead of reusing a
// thread with a foreign mount namespace. Releases with the fix compare
// namespace inodes and are unaffected by the mask.
func runscStart(netnsPath string, start func() error) error {
	errc := make(chan error, 1)
	go func() {
		goruntime.LockOSThread()
		// No UnlockOSThread: see above.
		errc <- func() error {
			self, err := os.Open("/proc/thread-self/ns/net")
			if err != nil {
				return fmt.Errorf("runsc: %w", err)
			}
			defer self.Close()
			target, err := os.Open(netnsPath)
			if err != nil {
				return fmt.Errorf("runsc: sandbox netns: %w", err)
			}
			defer target.Close()
			hostMnt, err := os.Open("/proc/thread-self/ns/mnt")
			if err != nil {
				return fmt.Errorf("runsc: %w", err)
			}
			defer hostMnt.Close()
			if err := unix.Unshare(unix.CLONE_NEWNS | unix.CLONE_FS); err != nil {
				return fmt.Errorf("runsc: unshare mount namespace: %w", err)
			}
			// Go does not end a locked thread that is the main thread: it
			// parks it for good. Left in the private namespace, that thread
			// would pin a copy of every host mount of the moment (sandbox
			// roots, quota filesystems and their loop devices, volume
			// binds) for the life of the process. Return it to the host's
			// mount namespace once runsc has started; the private namespace
			// then dies with its last user.
			defer unix.Setns(int(hostMnt.Fd()), unix.CLONE_NEWNS)
			if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
				return fmt.Errorf("runsc: make mounts private: %w", err)
			}
			if err := unix.Setns(int(target.Fd()), unix.CLONE_NEWNET); err != nil {
				return fmt.Errorf("runsc: enter sandbox netns: %w", err)
			}
			err = unix.Mount("moat-mask", runscProcNetCore, "tmpfs",
				unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, "size=4k,mode=0555")
			if serr := unix.Setns(int(self.Fd()), unix.CLONE_NEWNET); serr != nil {
				return fmt.Errorf("runsc: return to host netns: %w", serr)
			}
			if err != nil {
				return fmt.Errorf("runsc: mask %s: %w", runscProcNetCore, err)
			}
			return start()
		}()
	}()
	return <-errc
}

// runscStateExists reports whether runsc (with state root root) holds
// state for container id. runsc keeps flat files named
// "<id>_sandbox:<sandbox id>.state" (plus .lock) instead of runc's
// per-container directory.
func runscStateExists(root, id string) bool {
	m, _ := filepath.Glob(filepath.Join(root, id+"_sandbox:*.state"))
	return len(m) > 0
}

// removeRunscLeftovers deletes the lock files runsc leaves behind for id
// after `runsc delete` (it removes the .state file but not always the
// .lock files).
func removeRunscLeftovers(root, id string) error {
	m, _ := filepath.Glob(filepath.Join(root, id+"_sandbox:*"))
	var errs []error
	for _, p := range m {
		if strings.HasSuffix(p, ".state") {
			continue // still a live container; runsc delete owns it
		}
		if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// runscGoferPid reads the gofer's PID from runsc's state file for id (0
// if unknown).
func runscGoferPid(root, id string) int {
	m, _ := filepath.Glob(filepath.Join(root, id+"_sandbox:*.state"))
	if len(m) == 0 {
		return 0
	}
	data, err := os.ReadFile(m[0])
	if err != nil {
		return 0
	}
	var st struct {
		GoferPid int `json:"goferPid"`
	}
	json.Unmarshal(data, &st)
	return st.GoferPid
}

// procStat is what reaping needs from /proc/<pid>/stat.
type procStat struct {
	state byte
	ppid  int
	start uint64 // start time in clock ticks since boot; identifies the process across PID reuse
}

func readProcStat(pid int) (procStat, bool) {
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return procStat{}, false
	}
	s := string(data)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return procStat{}, false
	}
	// Fields after the command name: state(3) ppid(4) ... starttime(22).
	f := strings.Fields(s[i+1:])
	if len(f) < 20 || len(f[0]) != 1 {
		return procStat{}, false
	}
	ppid, err1 := strconv.Atoi(f[1])
	start, err2 := strconv.ParseUint(f[19], 10, 64)
	if err1 != nil || err2 != nil {
		return procStat{}, false
	}
	return procStat{state: f[0][0], ppid: ppid, start: start}, true
}

// descendants returns the PIDs of all descendants of pid (read from
// /proc/<pid>/task/*/children, which needs CONFIG_PROC_CHILDREN).
func descendants(pid int) []int {
	var out []int
	queue := []int{pid}
	for len(queue) > 0 && len(out) < 4096 {
		p := queue[0]
		queue = queue[1:]
		tasks, _ := filepath.Glob("/proc/" + strconv.Itoa(p) + "/task/*/children")
		for _, t := range tasks {
			data, _ := os.ReadFile(t)
			for _, c := range strings.Fields(string(data)) {
				if n, err := strconv.Atoi(c); err == nil {
					out = append(out, n)
					queue = append(queue, n)
				}
			}
		}
	}
	return out
}

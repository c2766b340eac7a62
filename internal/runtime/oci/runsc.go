package oci

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	goruntime "runtime"
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
//     over from the network namespace that network.Manager created, so
//     the moat bridge, the address plan and the host-side egress rules
//     apply unchanged. We deliberately do not use --network=host
//     ("hostinet"), which would still be confined to our namespace but
//     would forward every socket call of the application to the host
//     kernel's network stack, the largest part of the host attack surface
//     that gVisor exists to remove. See runscStart for the workaround
//     that older runsc releases need on recent kernels.
//   - --oci-seccomp: runsc ignores the spec's seccomp profile unless told
//     otherwise; with it the Sentry applies the same deny-list to the
//     application as runc and crun do (the Sentry is separately confined
//     by runsc's own host seccomp filter).
//   - the platform is left at runsc's default: ptrace on releases before
//     mid-2023 and systrap after, neither of which needs /dev/kvm. KVM
//     would be faster but is not available on most hosts (nested VMs).
//   - cgroups are configured (no --ignore-cgroups): runsc puts the
//     sandbox, gofer and Sentry in Linux.CgroupsPath on both cgroup v1
//     and v2, so the CPU, memory and pids limits hold.
var runscArgs = []string{"--network=sandbox", "--oci-seccomp"}

// runscProcNetCore is the directory whose contents older runsc releases
// use to detect the host's root network namespace.
const runscProcNetCore = "/proc/sys/net/core"

// runscStart runs start (which must start the runsc process on the
// calling goroutine, as gorunc.Runc.Run does) so that runsc sees an empty
// /proc/sys/net/core.
//
// Why: before it moves the veth into netstack, `runsc run` refuses to
// work in the host's root network namespace, which it detects by the
// presence of /proc/sys/net/core/rmem_default (runsc/sandbox/network.go,
// isRootNS). Since Linux 6.x (observed from 6.11; this host runs 6.18)
// that sysctl exists in every network namespace, so runsc releases older
// than the upstream fix (gVisor issue #10704, mid-2024; Debian 12 ships
// 20221219) reject every namespace with "cannot run with network enabled
// in root network namespace", including the sandbox's own netns that we
// pass in the spec. The check is a heuristic, not a security boundary:
// our spec always names a fresh, non-root netns (buildSpec requires
// NetnsPath), so we hide the directory from that one check.
//
// How: on a locked OS thread, unshare the mount namespace, make it
// private, and mount an empty read-only tmpfs on /proc/sys/net/core; the
// runsc process forked from that thread inherits the namespace, and the
// host's mounts are unaffected. runsc's sandbox and gofer processes set
// up their own mount namespaces and chroots, so nothing else sees the
// mask. The thread is never unlocked, so Go discards it afterwards
// instead of reusing a thread with a foreign mount namespace. Newer runsc
// releases compare namespace inodes instead and are unaffected.
func runscStart(start func() error) error {
	errc := make(chan error, 1)
	go func() {
		goruntime.LockOSThread()
		// No UnlockOSThread: see above.
		if err := unix.Unshare(unix.CLONE_NEWNS | unix.CLONE_FS); err != nil {
			errc <- fmt.Errorf("runsc: unshare mount namespace: %w", err)
			return
		}
		if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
			errc <- fmt.Errorf("runsc: make mounts private: %w", err)
			return
		}
		if err := unix.Mount("moat-mask", runscProcNetCore, "tmpfs",
			unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, "size=4k,mode=0555"); err != nil {
			errc <- fmt.Errorf("runsc: mask %s: %w", runscProcNetCore, err)
			return
		}
		errc <- start()
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

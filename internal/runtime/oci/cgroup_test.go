package oci

import (
	"os"
	"os/exec"
	"path/filepath"
	goruntime "runtime"
	"slices"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// cgroupMounts mounts a tmpfs (a v1 or hybrid host's /sys/fs/cgroup) and a
// cgroup2 filesystem (a v2 host's) at directories of t's own, in a private
// mount namespace of one locked thread, and runs f there. The host's
// mounts are not touched; the thread is discarded afterwards.
func cgroupMounts(t *testing.T, f func(tmpfs, cg2 string)) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root (mount namespaces)")
	}
	tmpfs, cg2 := t.TempDir(), t.TempDir()
	errc := make(chan error, 1)
	go func() {
		goruntime.LockOSThread() // never unlocked: see the doc comment
		errc <- func() error {
			host, err := os.Open("/proc/thread-self/ns/mnt")
			if err != nil {
				return err
			}
			defer host.Close()
			if err := unix.Unshare(unix.CLONE_NEWNS | unix.CLONE_FS); err != nil {
				return err
			}
			// Back to the host's namespace at the end: a locked main
			// thread is parked, not ended, and other tests check that
			// every thread is in the host's mount namespace.
			defer unix.Setns(int(host.Fd()), unix.CLONE_NEWNS)
			if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
				return err
			}
			if err := unix.Mount("tmpfs", tmpfs, "tmpfs", 0, "size=64k"); err != nil {
				return err
			}
			if err := unix.Mount("cgroup2", cg2, "cgroup2", 0, ""); err != nil {
				return err
			}
			f(tmpfs, cg2)
			return nil
		}()
	}()
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
}

// TestIsCgroup2 checks the v1/v2 decision against both kinds of
// filesystem: a v2 host is told by statfs, not by a mount table.
func TestIsCgroup2(t *testing.T) {
	cgroupMounts(t, func(tmpfs, cg2 string) {
		if isCgroup2(tmpfs) {
			t.Errorf("isCgroup2(tmpfs) = true")
		}
		if !isCgroup2(cg2) {
			t.Errorf("isCgroup2(cgroup2) = false")
		}
	})
	if isCgroup2(filepath.Join(t.TempDir(), "missing")) {
		t.Errorf("isCgroup2(missing dir) = true")
	}
}

// TestInstallDepsCgroupPlan checks what scripts/install-deps.sh would
// mount: on a v2 host nothing, whatever /proc/cgroups says (every
// controller has hierarchy 0 there); on a v1 host the enabled controllers
// no hierarchy holds.
func TestInstallDepsCgroupPlan(t *testing.T) {
	if _, err := exec.LookPath("stat"); err != nil {
		t.Skip("no stat(1)")
	}
	script, err := filepath.Abs("../../../scripts/install-deps.sh")
	if err != nil {
		t.Fatal(err)
	}
	procCgroups := filepath.Join(t.TempDir(), "cgroups")
	os.WriteFile(procCgroups, []byte("#subsys_name\thierarchy\tnum_cgroups\tenabled\n"+
		"cpuset\t0\t1\t1\ncpu\t3\t1\t1\nhugetlb\t0\t1\t1\nrdma\t0\t1\t0\nmisc\t0\t1\t1\n"), 0o644)
	cgroupMounts(t, func(tmpfs, cg2 string) {
		plan := func(root string) []string {
			// The child inherits the locked thread's mount namespace.
			cmd := exec.Command("bash", script, "--cgroup-plan")
			cmd.Env = append(os.Environ(), "MOAT_CGROUP_ROOT="+root, "MOAT_PROC_CGROUPS="+procCgroups)
			out, err := cmd.CombinedOutput()
			if err != nil {
				t.Fatalf("install-deps.sh --cgroup-plan: %v: %s", err, out)
			}
			return strings.Fields(string(out))
		}
		if got := plan(cg2); len(got) != 0 {
			t.Errorf("cgroup v2 host: plan mounts %v, want nothing", got)
		}
		if got, want := plan(tmpfs), []string{"cpuset", "hugetlb", "misc"}; !slices.Equal(got, want) {
			t.Errorf("cgroup v1 host: plan mounts %v, want %v", got, want)
		}
	})
}

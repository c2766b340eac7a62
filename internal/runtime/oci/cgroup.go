package oci

import (
	"os"
	"strings"

	"golang.org/x/sys/unix"
)

// cgroupRoot is where the host's cgroup hierarchies are mounted.
const cgroupRoot = "/sys/fs/cgroup"

// isCgroup2 reports whether dir is a cgroup v2 filesystem. statfs is the
// kernel's own answer: a v2 (unified) host has cgroup2 at /sys/fs/cgroup,
// a v1 or hybrid host a tmpfs holding one mount per hierarchy. The same
// rule decides in scripts/install-deps.sh (stat -f prints cgroup2fs).
func isCgroup2(dir string) bool {
	var st unix.Statfs_t
	return unix.Statfs(dir, &st) == nil && st.Type == unix.CGROUP2_SUPER_MAGIC
}

// hybridWithV2Controllers reports a cgroup v1 host whose unified (v2)
// hierarchy still owns controllers, a setup crun rejects.
func hybridWithV2Controllers() bool {
	if isCgroup2(cgroupRoot) {
		return false
	}
	data, err := os.ReadFile(cgroupRoot + "/unified/cgroup.controllers")
	return err == nil && strings.TrimSpace(string(data)) != ""
}

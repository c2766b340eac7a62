package preflight

import (
	"fmt"
	"path"
	"slices"
	"strings"
)

// cgroupMount is where the cgroup hierarchies are mounted.
const cgroupMount = "/sys/fs/cgroup"

// Controllers the native backend sets limits with on every sandbox (pids
// always, memory and cpu from resourceLimits) and, on cgroup v1, the
// freezer (pause) and devices (runc refuses a v1 host without it).
var (
	v2Hard = []string{"cpu", "memory", "pids"}
	v2Soft = []string{"io"}
	v1Hard = []string{"cpu", "memory", "pids", "freezer", "devices"}
	v1Soft = []string{"cpuset", "blkio"}
)

// controllerConfig names the kernel option of each controller.
var controllerConfig = map[string]string{"cpu": "CONFIG_CGROUP_SCHED", "memory": "CONFIG_MEMCG",
	"pids": "CONFIG_CGROUP_PIDS", "io": "CONFIG_BLK_CGROUP"}

// v1Names are the cgroup v1 controllers a hierarchy's mount options name.
var v1Names = []string{"cpu", "cpuacct", "cpuset", "memory", "devices", "freezer", "net_cls",
	"blkio", "perf_event", "net_prio", "hugetlb", "pids", "rdma", "misc"}

// mount is one line of /proc/self/mountinfo.
type mount struct {
	point, fstype string
	opts          []string // super options
}

// mounts parses the host's /proc/self/mountinfo.
func (h Host) mounts() ([]mount, error) {
	data, err := h.read("/proc/self/mountinfo")
	if err != nil {
		return nil, err
	}
	var out []mount
	for line := range strings.SplitSeq(data, "\n") {
		pre, post, ok := strings.Cut(line, " - ")
		f, g := strings.Fields(pre), strings.Fields(post)
		if !ok || len(f) < 5 || len(g) < 3 {
			continue
		}
		out = append(out, mount{point: unescapeMount(f[4]), fstype: g[0], opts: strings.Split(g[2], ",")})
	}
	return out, nil
}

// unescapeMount undoes mountinfo's octal escapes (\040 for a space).
func unescapeMount(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			var n int
			if _, err := fmt.Sscanf(s[i+1:i+4], "%03o", &n); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// cgroups checks the cgroup version and the controllers sandboxes get.
func cgroups(cfg Config, h Host) []Check {
	ms, err := h.mounts()
	if err != nil {
		return []Check{{Name: "cgroup", Status: Warn, Detail: fmt.Sprintf("cannot read the mount table: %v", err)}}
	}
	var unified bool
	v1 := map[string]string{} // controller -> mount point
	for _, m := range ms {
		switch {
		case m.point == cgroupMount && m.fstype == "cgroup2":
			unified = true
		case m.fstype == "cgroup" && path.Dir(m.point) == cgroupMount:
			for _, o := range m.opts {
				if slices.Contains(v1Names, o) {
					v1[o] = m.point
				}
			}
		}
	}
	switch {
	case unified:
		return cgroupV2(cfg, h)
	case len(v1) > 0:
		return cgroupV1(v1)
	}
	return []Check{{Name: "cgroup", Status: Fail, Detail: "no cgroup filesystem is mounted at " + cgroupMount,
		Fix: "mount cgroup v2 (mount -t cgroup2 none /sys/fs/cgroup), or boot with systemd, which mounts it"}}
}

// cgroupV2 checks the controllers the cgroup parent's sandboxes can get:
// those listed in cgroup.controllers of the parent, or, while moat has
// not made it yet, of its nearest existing ancestor (the OCI runtime
// enables them down the path through cgroup.subtree_control).
func cgroupV2(cfg Config, h Host) []Check {
	parent := cfg.CgroupParent
	if parent == "" {
		parent = "/moat"
	}
	dir := path.Clean(parent)
	for dir != "/" && !h.exists(cgroupMount+dir) {
		dir = path.Dir(dir)
	}
	out := []Check{{Name: "cgroup", Status: OK, Detail: "cgroup v2 (unified) at " + cgroupMount}}
	data, err := h.read(cgroupMount + dir + "/cgroup.controllers")
	if err != nil {
		return append(out, Check{Name: "cgroup.controllers", Status: Fail,
			Detail: fmt.Sprintf("cannot read the controllers of %s: %v", dir, err),
			Fix:    "run moat where " + cgroupMount + " is the host's (or a delegated) cgroup v2 tree"})
	}
	have := strings.Fields(data)
	enabled, _ := h.read(cgroupMount + dir + "/cgroup.subtree_control")
	where := "cgroup " + dir
	if dir != parent {
		where = fmt.Sprintf("cgroup %s (the nearest existing ancestor of %s)", dir, parent)
	}
	check := func(ctl string, hard bool) Check {
		c := Check{Name: "cgroup." + ctl}
		if slices.Contains(have, ctl) {
			c.Status, c.Detail = OK, "delegated to "+where
			if slices.Contains(strings.Fields(enabled), ctl) {
				c.Detail += ", enabled for its children"
			}
			return c
		}
		c.Status, c.Detail = Warn, fmt.Sprintf("not delegated to %s (it has: %s)", where, listOrNone(have))
		if hard {
			c.Status = Fail
		}
		if dir == "/" {
			c.Fix = fmt.Sprintf("the kernel lacks the %s controller (%s) or it is bound to a cgroup v1 hierarchy: boot without cgroup_disable=%s or cgroup_no_v1 options that name it", ctl, controllerConfig[ctl], ctl)
		} else {
			c.Fix = fmt.Sprintf("enable it for %s: echo +%s > %s/cgroup.subtree_control (systemd: Delegate=yes on moat's unit), or choose --cgroup-parent under a cgroup that has it",
				dir, ctl, path.Join(cgroupMount, path.Dir(dir)))
		}
		if !hard {
			c.Detail += "; sandboxes get no " + ctl + " limits"
		}
		return c
	}
	for _, ctl := range v2Hard {
		out = append(out, check(ctl, true))
	}
	for _, ctl := range v2Soft {
		out = append(out, check(ctl, false))
	}
	return out
}

// cgroupV1 checks that a hierarchy is mounted for each controller.
func cgroupV1(mounted map[string]string) []Check {
	names := make([]string, 0, len(mounted))
	for n := range mounted {
		names = append(names, n)
	}
	slices.Sort(names)
	out := []Check{{Name: "cgroup", Status: OK, Detail: "cgroup v1, controllers mounted: " + strings.Join(names, " ")}}
	check := func(ctl string, hard bool) Check {
		c := Check{Name: "cgroup." + ctl}
		if p, ok := mounted[ctl]; ok {
			c.Status, c.Detail = OK, "mounted at "+p
			return c
		}
		c.Status, c.Detail = Warn, "no cgroup v1 hierarchy has the "+ctl+" controller"
		if hard {
			c.Status = Fail
		}
		c.Fix = fmt.Sprintf("mount it: mkdir -p %s/%s && mount -t cgroup -o %s cgroup %s/%s (or boot with systemd.unified_cgroup_hierarchy=1 for cgroup v2)",
			cgroupMount, ctl, ctl, cgroupMount, ctl)
		return c
	}
	for _, ctl := range v1Hard {
		out = append(out, check(ctl, true))
	}
	for _, ctl := range v1Soft {
		out = append(out, check(ctl, false))
	}
	return out
}

func listOrNone(s []string) string {
	if len(s) == 0 {
		return "none"
	}
	return strings.Join(s, " ")
}

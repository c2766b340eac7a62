package preflight

import (
	"bytes"
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/moat-sandbox/moat/internal/errdefs"
)

// tree writes files (path -> content; a path ending in / is a directory)
// under a new root directory.
func tree(t *testing.T, files map[string]string) string {
	t.Helper()
	root := t.TempDir()
	for p, content := range files {
		full := filepath.Join(root, p)
		if strings.HasSuffix(p, "/") {
			if err := os.MkdirAll(full, 0o755); err != nil {
				t.Fatal(err)
			}
			continue
		}
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(full, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return root
}

func gz(t *testing.T, s string) string {
	t.Helper()
	var b bytes.Buffer
	zw := gzip.NewWriter(&b)
	zw.Write([]byte(s))
	zw.Close()
	return b.String()
}

const (
	mountsV2 = `22 1 0:21 / /sys rw,nosuid - sysfs sysfs rw
26 22 0:23 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:4 - cgroup2 cgroup2 rw,nsdelegate,memory_recursiveprot
`
	mountsV1 = `31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu,cpuacct rw,relatime - cgroup cgroup rw,cpu,cpuacct
34 31 0:31 / /sys/fs/cgroup/cpuset rw,relatime - cgroup cgroup rw,cpuset
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
36 31 0:33 / /sys/fs/cgroup/devices rw,relatime - cgroup cgroup rw,devices
37 31 0:34 / /sys/fs/cgroup/freezer rw,relatime - cgroup cgroup rw,freezer
38 31 0:35 / /sys/fs/cgroup/blkio rw,relatime - cgroup cgroup rw,blkio
39 31 0:36 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids
40 31 0:37 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,xattr,name=systemd
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
`
	debianRelease = "6.1.0-27-amd64"
	debianConfig  = `CONFIG_OVERLAY_FS=m
CONFIG_NF_TABLES=m
CONFIG_NFT_NAT=m
CONFIG_NFT_MASQ=m
CONFIG_NFT_CT=m
CONFIG_VETH=m
CONFIG_BRIDGE=m
CONFIG_BLK_DEV_LOOP=m
CONFIG_EXT4_FS=y
CONFIG_USER_NS=y
# CONFIG_FOO is not set
`
)

// debianV2 is a stock Debian 12 host: cgroup v2 under systemd, the
// kernel's config in /boot and its features as modules.
func debianV2() map[string]string {
	mod := "/lib/modules/" + debianRelease + "/kernel/"
	return map[string]string{
		"/proc/self/mountinfo":                  mountsV2,
		"/proc/sys/kernel/osrelease":            debianRelease + "\n",
		"/proc/filesystems":                     "nodev\tsysfs\nnodev\tcgroup2\n\text4\n",
		"/proc/modules":                         "nf_tables 352256 0 - Live 0x0000000000000000\n",
		"/proc/sys/user/max_user_namespaces":    "63334\n",
		"/boot/config-" + debianRelease:         debianConfig,
		"/sys/fs/cgroup/cgroup.controllers":     "cpuset cpu io memory hugetlb pids rdma misc\n",
		"/sys/fs/cgroup/cgroup.subtree_control": "cpu io memory pids\n",
		mod + "fs/overlayfs/overlay.ko":         "",
		mod + "net/netfilter/nf_tables.ko":      "",
		mod + "net/netfilter/nft_nat.ko":        "",
		mod + "net/netfilter/nft_masq.ko":       "",
		mod + "net/netfilter/nft_ct.ko":         "",
		mod + "drivers/net/veth.ko":             "",
		mod + "net/bridge/bridge.ko":            "",
		mod + "drivers/block/loop.ko":           "",
		"/dev/loop-control":                     "",
	}
}

// fakeHost is a host view over root with runc and crun installed.
func fakeHost(root string) Host {
	bins := map[string]string{"runc": "/usr/sbin/runc", "crun": "/usr/bin/crun"}
	return Host{
		Root: root,
		LookPath: func(f string) (string, error) {
			if p, ok := bins[f]; ok {
				return p, nil
			}
			return "", fmt.Errorf("exec: %q: executable file not found in $PATH", f)
		},
		Output: func(ctx context.Context, path string, args ...string) ([]byte, error) {
			switch path {
			case "/usr/sbin/runc":
				return []byte("runc version 1.1.5+ds1\ncommit: 1.1.5+ds1-1+deb12u1\nspec: 1.0.2-dev\n"), nil
			case "/usr/bin/crun":
				return []byte("crun version 1.8.1\ncommit: f8a096be\n"), nil
			case "/usr/local/bin/runsc":
				return []byte("runsc version release-20250101.0\nspec: 1.1.0\n"), nil
			}
			return nil, errors.New("no such program")
		},
		FreeBytes: func(string) (uint64, error) { return 40 << 30, nil },
		Euid:      func() int { return 0 },
	}
}

func ociConfig() Config {
	return Config{Runtime: "oci", Root: "/var/lib/moat", CgroupParent: "/moat", DefaultClass: "runc",
		Classes: []string{"runc", "crun", "runsc"}}
}

// want asserts the status of the named checks, and that every detail is
// filled and every non-ok result has a fix (an info or a warning that
// cannot tell may have none).
func want(t *testing.T, r Report, statuses map[string]Status) {
	t.Helper()
	for name, s := range statuses {
		c, ok := r.Find(name)
		if !ok {
			t.Errorf("no check %s in %+v", name, r.Checks)
			continue
		}
		if c.Status != s {
			t.Errorf("%s: status %s, want %s (%s; fix %q)", name, c.Status, s, c.Detail, c.Fix)
		}
	}
	for _, c := range r.Checks {
		if c.Detail == "" {
			t.Errorf("%s: empty detail", c.Name)
		}
		if c.Status == Fail && c.Fix == "" {
			t.Errorf("%s: failure without a fix: %s", c.Name, c.Detail)
		}
	}
}

// TestStockDebian: a stock Debian 12 host passes every check of the
// native backend, cgroup v2 with the controllers delegated from the root.
func TestStockDebian(t *testing.T) {
	cfg := ociConfig()
	cfg.DiskQuota = true
	r := Run(context.Background(), cfg, fakeHost(tree(t, debianV2())))
	if f := r.With(Fail); len(f) > 0 || r.Err() != nil {
		t.Fatalf("failures on a stock Debian host: %+v", f)
	}
	want(t, r, map[string]Status{
		"privileges": OK, "cgroup": OK, "cgroup.cpu": OK, "cgroup.memory": OK, "cgroup.pids": OK, "cgroup.io": OK,
		"kernel": OK, "kernel.overlayfs": OK, "kernel.nftables": OK, "kernel.nft_nat": OK, "kernel.veth": OK,
		"kernel.bridge": OK, "kernel.loop": OK, "kernel.ext4": OK, "kernel.loop-control": OK,
		"runtime.runc": OK, "runtime.crun": OK, "runtime.runsc": Info, "disk": OK,
	})
	if c, _ := r.Find("cgroup"); !strings.Contains(c.Detail, "cgroup v2") {
		t.Errorf("cgroup detail %q does not name v2", c.Detail)
	}
	if c, _ := r.Find("runtime.runc"); c.Detail != "runc version 1.1.5+ds1 (/usr/sbin/runc), the default class" {
		t.Errorf("runc detail %q", c.Detail)
	}
	if c, _ := r.Find("cgroup.memory"); !strings.Contains(c.Detail, "enabled for its children") || !strings.Contains(c.Detail, "ancestor of /moat") {
		t.Errorf("memory detail %q", c.Detail)
	}
	if c, _ := r.Find("kernel.nftables"); !strings.Contains(c.Detail, "loaded") {
		t.Errorf("nftables detail %q: want the loaded module found first", c.Detail)
	}
}

// TestCgroupV2Delegation: the controllers are those of the cgroup parent
// once it exists (a delegated subtree that lacks memory fails, one that
// lacks io warns), else of its nearest existing ancestor.
func TestCgroupV2Delegation(t *testing.T) {
	files := debianV2()
	files["/sys/fs/cgroup/moat/cgroup.controllers"] = "cpu pids\n"
	files["/sys/fs/cgroup/moat/cgroup.subtree_control"] = "cpu\n"
	r := Report{Checks: cgroups(ociConfig(), fakeHost(tree(t, files)))}
	want(t, r, map[string]Status{"cgroup": OK, "cgroup.cpu": OK, "cgroup.pids": OK, "cgroup.memory": Fail, "cgroup.io": Warn})
	mem, _ := r.Find("cgroup.memory")
	if !strings.Contains(mem.Detail, "not delegated to cgroup /moat (it has: cpu pids)") || !strings.Contains(mem.Fix, "echo +memory > /sys/fs/cgroup/cgroup.subtree_control") {
		t.Errorf("memory: %+v", mem)
	}
	if c, _ := r.Find("cgroup.cpu"); !strings.Contains(c.Detail, "enabled for its children") {
		t.Errorf("cpu detail %q", c.Detail)
	}
	if c, _ := r.Find("cgroup.pids"); strings.Contains(c.Detail, "enabled") {
		t.Errorf("pids detail %q: pids is not in subtree_control", c.Detail)
	}

	// A nested parent whose first component exists: read from /a.
	files["/sys/fs/cgroup/a/cgroup.controllers"] = "cpu memory pids io\n"
	cfg := ociConfig()
	cfg.CgroupParent = "/a/b/c"
	r = Report{Checks: cgroups(cfg, fakeHost(tree(t, files)))}
	want(t, r, map[string]Status{"cgroup.memory": OK, "cgroup.io": OK})
	if c, _ := r.Find("cgroup.memory"); !strings.Contains(c.Detail, "cgroup /a (the nearest existing ancestor of /a/b/c)") {
		t.Errorf("memory detail %q", c.Detail)
	}

	// The root lacking a controller is the kernel's doing.
	files = debianV2()
	files["/sys/fs/cgroup/cgroup.controllers"] = "cpu io pids\n"
	r = Report{Checks: cgroups(ociConfig(), fakeHost(tree(t, files)))}
	want(t, r, map[string]Status{"cgroup.memory": Fail})
	if c, _ := r.Find("cgroup.memory"); !strings.Contains(c.Fix, "CONFIG_MEMCG") {
		t.Errorf("memory fix %q", c.Fix)
	}

	// No cgroup.controllers to read.
	files = debianV2()
	delete(files, "/sys/fs/cgroup/cgroup.controllers")
	r = Report{Checks: cgroups(ociConfig(), fakeHost(tree(t, files)))}
	want(t, r, map[string]Status{"cgroup.controllers": Fail})
}

// TestCgroupV1: every controller on its own hierarchy or co-mounted
// (cpu,cpuacct) counts; a missing freezer or devices fails, a missing
// cpuset warns. The hybrid unified mount does not make the host v2.
func TestCgroupV1(t *testing.T) {
	files := debianV2()
	files["/proc/self/mountinfo"] = mountsV1
	r := Report{Checks: cgroups(ociConfig(), fakeHost(tree(t, files)))}
	want(t, r, map[string]Status{"cgroup": OK, "cgroup.cpu": OK, "cgroup.memory": OK, "cgroup.pids": OK,
		"cgroup.freezer": OK, "cgroup.devices": OK, "cgroup.cpuset": OK, "cgroup.blkio": OK})
	if c, _ := r.Find("cgroup"); !strings.HasPrefix(c.Detail, "cgroup v1") || strings.Contains(c.Detail, "systemd") {
		t.Errorf("cgroup detail %q", c.Detail)
	}
	if c, _ := r.Find("cgroup.cpu"); c.Detail != "mounted at /sys/fs/cgroup/cpu,cpuacct" {
		t.Errorf("cpu detail %q", c.Detail)
	}

	var lines []string
	for _, l := range strings.Split(mountsV1, "\n") {
		if !strings.Contains(l, "freezer") && !strings.Contains(l, "cpuset") && !strings.Contains(l, "devices") {
			lines = append(lines, l)
		}
	}
	files["/proc/self/mountinfo"] = strings.Join(lines, "\n")
	r = Report{Checks: cgroups(ociConfig(), fakeHost(tree(t, files)))}
	want(t, r, map[string]Status{"cgroup.freezer": Fail, "cgroup.devices": Fail, "cgroup.cpuset": Warn, "cgroup.memory": OK})
	if c, _ := r.Find("cgroup.freezer"); !strings.Contains(c.Fix, "mount -t cgroup -o freezer") {
		t.Errorf("freezer fix %q", c.Fix)
	}
}

// TestNoCgroup: nothing mounted at /sys/fs/cgroup, or no mount table.
func TestNoCgroup(t *testing.T) {
	files := debianV2()
	files["/proc/self/mountinfo"] = "22 1 0:21 / /sys rw,nosuid - sysfs sysfs rw\n"
	r := Report{Checks: cgroups(ociConfig(), fakeHost(tree(t, files)))}
	want(t, r, map[string]Status{"cgroup": Fail})
	delete(files, "/proc/self/mountinfo")
	r = Report{Checks: cgroups(ociConfig(), fakeHost(tree(t, files)))}
	want(t, r, map[string]Status{"cgroup": Warn})
}

// TestKernelFeatures: each kind of evidence, and the lack of any.
func TestKernelFeatures(t *testing.T) {
	mod := "/lib/modules/" + debianRelease + "/"
	for _, c := range []struct {
		name  string
		edit  func(map[string]string)
		want  Status
		match string
	}{
		{"module file", func(map[string]string) {}, OK, "loaded on use (CONFIG_VETH=m)"},
		{"built in", func(f map[string]string) {
			f["/boot/config-"+debianRelease] = strings.Replace(debianConfig, "CONFIG_VETH=m", "CONFIG_VETH=y", 1)
		}, OK, "built in (CONFIG_VETH=y)"},
		{"not set", func(f map[string]string) {
			f["/boot/config-"+debianRelease] = strings.Replace(debianConfig, "CONFIG_VETH=m", "# CONFIG_VETH is not set", 1)
		}, Fail, "CONFIG_VETH is not set"},
		{"module not installed", func(f map[string]string) { delete(f, mod+"kernel/drivers/net/veth.ko") }, Fail, "not installed"},
		{"compressed module", func(f map[string]string) {
			delete(f, mod+"kernel/drivers/net/veth.ko")
			f[mod+"kernel/drivers/net/veth.ko.xz"] = ""
		}, OK, "loaded on use"},
		{"loaded via sysfs", func(f map[string]string) {
			delete(f, "/boot/config-"+debianRelease)
			f["/sys/module/veth/"] = ""
		}, OK, "module veth loaded"},
		{"config.gz", func(f map[string]string) {
			delete(f, "/boot/config-"+debianRelease)
			f["/proc/config.gz"] = gz(t, "CONFIG_VETH=y\n")
		}, OK, "built in"},
		{"modules.builtin", func(f map[string]string) {
			delete(f, "/boot/config-"+debianRelease)
			delete(f, mod+"kernel/drivers/net/veth.ko")
			f[mod+"modules.builtin"] = "kernel/drivers/net/veth.ko\n"
		}, OK, "built in (modules.builtin)"},
		{"neither built in nor installed", func(f map[string]string) {
			delete(f, "/boot/config-"+debianRelease)
			delete(f, mod+"kernel/drivers/net/veth.ko")
			f[mod+"modules.builtin"] = "kernel/fs/ext4/ext4.ko\n"
		}, Fail, "neither built in nor installed"},
		{"no evidence", func(f map[string]string) {
			for p := range f {
				if strings.HasPrefix(p, "/lib/modules") || strings.HasPrefix(p, "/boot") {
					delete(f, p)
				}
			}
		}, Warn, "cannot tell"},
	} {
		t.Run(c.name, func(t *testing.T) {
			files := debianV2()
			c.edit(files)
			r := Report{Checks: kernel(ociConfig(), fakeHost(tree(t, files)))}
			want(t, r, map[string]Status{"kernel.veth": c.want})
			if got, _ := r.Find("kernel.veth"); !strings.Contains(got.Detail, c.match) {
				t.Errorf("detail %q, want it to contain %q", got.Detail, c.match)
			}
		})
	}

	// A registered filesystem needs no other evidence.
	files := debianV2()
	files["/proc/filesystems"] = "nodev\toverlay\n"
	delete(files, mod+"kernel/fs/overlayfs/overlay.ko")
	r := Report{Checks: kernel(ociConfig(), fakeHost(tree(t, files)))}
	want(t, r, map[string]Status{"kernel.overlayfs": OK})

	// Disk quotas need loop devices; without --disk-quota they are not checked.
	delete(files, "/dev/loop-control")
	if _, ok := (Report{Checks: kernel(ociConfig(), fakeHost(tree(t, files)))}).Find("kernel.loop"); ok {
		t.Error("kernel.loop checked without disk quotas")
	}
	cfg := ociConfig()
	cfg.DiskQuota = true
	r = Report{Checks: kernel(cfg, fakeHost(tree(t, files)))}
	want(t, r, map[string]Status{"kernel.loop": OK, "kernel.loop-control": Fail})
}

// TestKernelRelease: pause on cgroup v2 needs 5.2.
func TestKernelRelease(t *testing.T) {
	for rel, s := range map[string]Status{"6.1.0-27-amd64": OK, "5.2.0": OK, "5.10.0-rc1": OK, "4.19.0-26-amd64": Warn, "5.1.21": Warn, "": Warn} {
		if got := kernelRelease(kernelInfo{release: rel}); got.Status != s {
			t.Errorf("%q: %s (%s), want %s", rel, got.Status, got.Detail, s)
		}
	}
}

// TestRuntimes: the default class must be installed and run; the
// others are optional; runsc brings the user namespace checks.
func TestRuntimes(t *testing.T) {
	root := tree(t, debianV2())
	h := fakeHost(root)

	cfg := ociConfig()
	cfg.DefaultClass = "runsc"
	r := Report{Checks: runtimes(context.Background(), cfg, h)}
	want(t, r, map[string]Status{"runtime.runsc": Fail, "runtime.runc": OK, "runtime.crun": OK})
	if c, _ := r.Find("runtime.runsc"); !strings.Contains(c.Fix, "gvisor.dev") || !strings.Contains(c.Fix, "--runtime-class") {
		t.Errorf("runsc fix %q", c.Fix)
	}
	if _, ok := r.Find("kernel.userns"); ok {
		t.Error("user namespaces checked without runsc")
	}

	look := h.LookPath
	h.LookPath = func(f string) (string, error) {
		if f == "runsc" {
			return "/usr/local/bin/runsc", nil
		}
		return look(f)
	}
	r = Report{Checks: runtimes(context.Background(), cfg, h)}
	want(t, r, map[string]Status{"runtime.runsc": OK, "kernel.userns": OK, "kernel.userns-limit": OK})
	if c, _ := r.Find("kernel.userns"); !strings.Contains(c.Detail, "CONFIG_USER_NS=y") {
		t.Errorf("userns detail %q", c.Detail)
	}
	// User namespaces are no module: only the config tells, and it may
	// say they are off.
	files := debianV2()
	files["/boot/config-"+debianRelease] = strings.Replace(debianConfig, "CONFIG_USER_NS=y", "# CONFIG_USER_NS is not set", 1)
	files["/sys/module/"] = ""
	r = Report{Checks: runtimes(context.Background(), cfg, withRoot(h, tree(t, files)))}
	want(t, r, map[string]Status{"kernel.userns": Warn})
	delete(files, "/boot/config-"+debianRelease)
	r = Report{Checks: runtimes(context.Background(), cfg, withRoot(h, tree(t, files)))}
	want(t, r, map[string]Status{"kernel.userns": Warn})
	if c, _ := r.Find("kernel.userns"); !strings.Contains(c.Detail, "cannot tell") {
		t.Errorf("userns without a config: %q", c.Detail)
	}
	if c, _ := r.Find("runtime.runsc"); c.Detail != "runsc version release-20250101.0 (/usr/local/bin/runsc), the default class" {
		t.Errorf("runsc detail %q", c.Detail)
	}

	// A default class that does not run fails; an optional one warns.
	out := h.Output
	h.Output = func(ctx context.Context, path string, args ...string) ([]byte, error) {
		if path == "/usr/sbin/runc" || path == "/usr/bin/crun" {
			return nil, errors.New("exit status 127")
		}
		return out(ctx, path, args...)
	}
	cfg.DefaultClass = "runc"
	r = Report{Checks: runtimes(context.Background(), cfg, h)}
	want(t, r, map[string]Status{"runtime.runc": Fail, "runtime.crun": Warn})

	// A configured default outside the known classes is still checked.
	cfg.Classes, cfg.DefaultClass = nil, "youki"
	r = Report{Checks: runtimes(context.Background(), cfg, fakeHost(root))}
	want(t, r, map[string]Status{"runtime.youki": Fail})

	// max_user_namespaces = 0.
	files = debianV2()
	files["/proc/sys/user/max_user_namespaces"] = "0\n"
	if c := maxUserNamespaces(fakeHost(tree(t, files))); c.Status != Warn || c.Fix == "" {
		t.Errorf("max_user_namespaces 0: %+v", c)
	}
}

// TestDiskPrivilegesDaemons: free space thresholds, the effective user,
// and the daemons of the docker and kubernetes backends.
func TestDiskPrivilegesDaemons(t *testing.T) {
	h := fakeHost(tree(t, debianV2()))
	for free, s := range map[uint64]Status{100 << 20: Fail, 1 << 30: Warn, 3 << 30: OK} {
		h.FreeBytes = func(string) (uint64, error) { return free, nil }
		if c := disk(ociConfig(), h); c.Status != s || !strings.Contains(c.Detail, "/var/lib/moat") {
			t.Errorf("%d free: %+v, want %s", free, c, s)
		}
	}
	h.FreeBytes = func(string) (uint64, error) { return 0, errors.New("permission denied") }
	if c := disk(ociConfig(), h); c.Status != Warn {
		t.Errorf("statfs error: %+v", c)
	}
	if got := bytesIEC(3<<30 + 512<<20); got != "3.5 GiB" {
		t.Errorf("bytesIEC: %q", got)
	}

	h.Euid = func() int { return 1000 }
	r := Run(context.Background(), Config{Runtime: "docker", Root: "/var/lib/moat"}, h)
	want(t, r, map[string]Status{"privileges": Fail, "docker": Warn})
	if _, ok := r.Find("cgroup"); ok {
		t.Error("the docker backend's host checked for cgroups (dockerd makes them)")
	}

	h.Euid = func() int { return 0 }
	h.Docker = func(context.Context) (string, error) {
		return "", errors.New("dial unix /var/run/docker.sock: connect: no such file or directory")
	}
	r = Run(context.Background(), Config{Runtime: "docker", Root: "/var/lib/moat"}, h)
	want(t, r, map[string]Status{"privileges": OK, "docker": Fail, "kernel.nftables": OK})
	h.Docker = func(context.Context) (string, error) { return "27.5.1 (API 1.47)", nil }
	r = Run(context.Background(), Config{Runtime: "docker", Root: "/var/lib/moat"}, h)
	want(t, r, map[string]Status{"docker": OK})

	h.Kubernetes = func(context.Context) (string, error) { return "", errors.New("no BatchSandbox CRD") }
	r = Run(context.Background(), Config{Runtime: "kubernetes"}, h)
	want(t, r, map[string]Status{"kubernetes": Fail})
	if len(r.Checks) != 1 {
		t.Errorf("kubernetes backend checks the local host: %+v", r.Checks)
	}
	h.Kubernetes = func(context.Context) (string, error) { return "v1.31.0", nil }
	want(t, Run(context.Background(), Config{Runtime: "kubernetes"}, h), map[string]Status{"kubernetes": OK})

	r = Run(context.Background(), Config{Runtime: "fake"}, Host{})
	if len(r.Checks) != 1 || r.Err() != nil {
		t.Errorf("fake backend: %+v", r)
	}
}

// TestReportErr: a failure makes a failed-precondition error that names
// every failed check with its fix; warnings alone make none.
func TestReportErr(t *testing.T) {
	files := debianV2()
	files["/sys/fs/cgroup/cgroup.controllers"] = "cpu io\n"
	h := fakeHost(tree(t, files))
	h.FreeBytes = func(string) (uint64, error) { return 1 << 30, nil }
	r := Run(context.Background(), ociConfig(), h)
	err := r.Err()
	if !errdefs.IsFailedPrecondition(err) {
		t.Fatalf("Err() = %v, want a failed precondition", err)
	}
	for _, s := range []string{"cgroup.memory: not delegated", "cgroup.pids: not delegated", "fix: the kernel lacks the pids controller", "moat doctor"} {
		if !strings.Contains(err.Error(), s) {
			t.Errorf("error does not contain %q:\n%v", s, err)
		}
	}
	if strings.Contains(err.Error(), "disk") {
		t.Errorf("error names a warning:\n%v", err)
	}
	if got := len(r.With(Warn)); got == 0 {
		t.Error("the low disk is no warning")
	}
	if (Report{Checks: []Check{{Name: "disk", Status: Warn, Detail: "low"}}}).Err() != nil {
		t.Error("warnings alone make an error")
	}
}

func TestUnescapeMount(t *testing.T) {
	for in, out := range map[string]string{`/sys/fs/cgroup`: "/sys/fs/cgroup", `/mnt/a\040b`: "/mnt/a b", `/x\`: `/x\`, `/a\134b`: `/a\b`} {
		if got := unescapeMount(in); got != out {
			t.Errorf("unescapeMount(%q) = %q, want %q", in, got, out)
		}
	}
}

func withRoot(h Host, root string) Host {
	h.Root = root
	return h
}

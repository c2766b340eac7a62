package preflight

import (
	"bytes"
	"compress/gzip"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
)

// feature is a kernel feature and the evidence that the kernel has it.
type feature struct {
	name   string // check name, "kernel.<name>"
	what   string // what moat uses it for
	config string // kernel option (CONFIG_...)
	module string // module name
	path   string // module file under /lib/modules/<release>/, without ".ko"
	fs     string // filesystem name in /proc/filesystems, if it is one
	hard   bool
}

var (
	overlayfs = feature{name: "overlayfs", what: "sandbox root filesystems", config: "CONFIG_OVERLAY_FS",
		module: "overlay", path: "kernel/fs/overlayfs/overlay", fs: "overlay", hard: true}
	nftables = feature{name: "nftables", what: "the sandbox firewall and egress policies", config: "CONFIG_NF_TABLES",
		module: "nf_tables", path: "kernel/net/netfilter/nf_tables", hard: true}
	nftNAT = feature{name: "nft_nat", what: "sandbox NAT (DNS redirect)", config: "CONFIG_NFT_NAT",
		module: "nft_nat", path: "kernel/net/netfilter/nft_nat", hard: true}
	nftMasq = feature{name: "nft_masq", what: "sandbox NAT (masquerade)", config: "CONFIG_NFT_MASQ",
		module: "nft_masq", path: "kernel/net/netfilter/nft_masq", hard: true}
	nftCT = feature{name: "nft_ct", what: "connection tracking in the sandbox firewall", config: "CONFIG_NFT_CT",
		module: "nft_ct", path: "kernel/net/netfilter/nft_ct", hard: true}
	veth = feature{name: "veth", what: "sandbox network interfaces", config: "CONFIG_VETH",
		module: "veth", path: "kernel/drivers/net/veth", hard: true}
	bridge = feature{name: "bridge", what: "the sandbox bridge", config: "CONFIG_BRIDGE",
		module: "bridge", path: "kernel/net/bridge/bridge", hard: true}
	loop = feature{name: "loop", what: "disk quotas (--disk-quota)", config: "CONFIG_BLK_DEV_LOOP",
		module: "loop", path: "kernel/drivers/block/loop", hard: true}
	ext4 = feature{name: "ext4", what: "disk quotas (--disk-quota)", config: "CONFIG_EXT4_FS",
		module: "ext4", path: "kernel/fs/ext4/ext4", fs: "ext4", hard: true}
	userns = feature{name: "userns", what: "gVisor (runsc) sandboxes", config: "CONFIG_USER_NS"}
)

// kernelInfo is what the host says about its kernel, read once.
type kernelInfo struct {
	release     string
	config      map[string]string // option -> y, m; nil if no config was found
	configFrom  string
	modules     map[string]bool // loaded
	builtin     map[string]bool // module paths in modules.builtin; nil if none
	filesystems map[string]bool
	moduleTree  bool // /lib/modules/<release> exists
}

func (h Host) kernelInfo() kernelInfo {
	var k kernelInfo
	rel, _ := h.read("/proc/sys/kernel/osrelease")
	k.release = strings.TrimSpace(rel)
	for _, p := range []string{"/proc/config.gz", "/boot/config-" + k.release} {
		if cfg, err := h.readConfig(p); err == nil {
			k.config, k.configFrom = cfg, p
			break
		}
	}
	k.modules = map[string]bool{}
	if data, err := h.read("/proc/modules"); err == nil {
		for line := range strings.SplitSeq(data, "\n") {
			if f := strings.Fields(line); len(f) > 0 {
				k.modules[f[0]] = true
			}
		}
	}
	modDir := "/lib/modules/" + k.release
	k.moduleTree = k.release != "" && h.exists(modDir)
	if data, err := h.read(modDir + "/modules.builtin"); err == nil {
		k.builtin = map[string]bool{}
		for line := range strings.SplitSeq(data, "\n") {
			k.builtin[strings.TrimSuffix(strings.TrimSpace(line), ".ko")] = true
		}
	}
	k.filesystems = map[string]bool{}
	if data, err := h.read("/proc/filesystems"); err == nil {
		for line := range strings.SplitSeq(data, "\n") {
			if f := strings.Fields(line); len(f) > 0 {
				k.filesystems[f[len(f)-1]] = true
			}
		}
	}
	return k
}

// readConfig parses a kernel config (gzip-compressed if p ends in .gz).
func (h Host) readConfig(p string) (map[string]string, error) {
	data, err := os.ReadFile(h.path(p))
	if err != nil {
		return nil, err
	}
	if strings.HasSuffix(p, ".gz") {
		zr, err := gzip.NewReader(bytes.NewReader(data))
		if err != nil {
			return nil, err
		}
		if data, err = io.ReadAll(zr); err != nil {
			return nil, err
		}
	}
	cfg := map[string]string{}
	for line := range strings.SplitSeq(string(data), "\n") {
		if k, v, ok := strings.Cut(strings.TrimSpace(line), "="); ok && strings.HasPrefix(k, "CONFIG_") {
			cfg[k] = v
		}
	}
	return cfg, nil
}

// moduleFile reports whether f's module is installed under the tree.
func (h Host) moduleFile(k kernelInfo, f feature) bool {
	for _, ext := range []string{".ko", ".ko.xz", ".ko.zst", ".ko.gz"} {
		if h.exists("/lib/modules/" + k.release + "/" + f.path + ext) {
			return true
		}
	}
	return false
}

// has checks one feature against the evidence, strongest first: a
// registered filesystem or loaded module, the kernel config, the list of
// built-in modules, an installed module file. It fails only on evidence
// of absence; with none either way it warns.
func (h Host) has(k kernelInfo, f feature) Check {
	c := Check{Name: "kernel." + f.name}
	fail := func(detail, fix string) Check {
		c.Status, c.Detail, c.Fix = Warn, detail, fix
		if f.hard {
			c.Status = Fail
		}
		return c
	}
	ok := func(detail string) Check {
		c.Status, c.Detail = OK, detail+" ("+f.what+")"
		return c
	}
	switch {
	case f.fs != "" && k.filesystems[f.fs]:
		return ok("filesystem " + f.fs + " registered")
	case f.module != "" && (k.modules[f.module] || h.exists("/sys/module/"+f.module)):
		return ok("module " + f.module + " loaded")
	}
	rebuild := fmt.Sprintf("use a kernel built with %s (Debian's and Ubuntu's stock kernels have it)", f.config)
	if k.config != nil {
		switch k.config[f.config] {
		case "y":
			return ok("built in (" + f.config + "=y)")
		case "m":
			if !k.moduleTree || h.moduleFile(k, f) {
				return ok("module " + f.module + ", loaded on use (" + f.config + "=m)")
			}
			return fail(fmt.Sprintf("%s=m but module %s is not installed under /lib/modules/%s", f.config, f.module, k.release),
				"install the kernel's modules package (Debian: linux-image-"+k.release+")")
		default:
			return fail(fmt.Sprintf("not in this kernel (%s is not set in %s)", f.config, k.configFrom), rebuild)
		}
	}
	switch {
	case f.path == "":
	case k.builtin[f.path]:
		return ok("built in (modules.builtin)")
	case k.moduleTree && h.moduleFile(k, f):
		return ok("module " + f.module + ", loaded on use")
	case k.moduleTree && k.builtin != nil:
		return fail(fmt.Sprintf("module %s is neither built in nor installed under /lib/modules/%s", f.module, k.release), rebuild)
	}
	c.Status = Warn
	c.Detail = fmt.Sprintf("cannot tell: no kernel config (/proc/config.gz, /boot/config-%s), module list or module tree says (%s)", k.release, f.what)
	c.Fix = "modprobe " + f.module + " to be sure (it fails if the kernel lacks it)"
	if f.module == "" {
		c.Fix = "check that the kernel is built with " + f.config
	}
	return c
}

// kernel checks the release and the features cfg's backend uses.
func kernel(cfg Config, h Host) []Check {
	k := h.kernelInfo()
	out := []Check{kernelRelease(k)}
	var fs []feature
	switch cfg.Runtime {
	case "oci":
		fs = []feature{overlayfs, nftables, nftNAT, nftMasq, nftCT, veth, bridge}
		if cfg.DiskQuota {
			fs = append(fs, loop, ext4)
		}
	case "docker":
		// dockerd makes the bridge and the veths; moat's egress stack
		// filters and redirects on it with nftables.
		fs = []feature{nftables, nftNAT, nftCT}
	}
	for _, f := range fs {
		out = append(out, h.has(k, f))
	}
	if cfg.Runtime == "oci" && cfg.DiskQuota {
		c := Check{Name: "kernel.loop-control", Status: OK, Detail: "/dev/loop-control present"}
		if !h.exists("/dev/loop-control") {
			c.Status, c.Detail = Fail, "/dev/loop-control is missing (disk quotas loop-mount an ext4 file per sandbox)"
			c.Fix = "modprobe loop, or drop --disk-quota"
		}
		out = append(out, c)
	}
	return out
}

// kernelRelease reports the release; cgroup v2 freezing (pause) needs 5.2.
func kernelRelease(k kernelInfo) Check {
	c := Check{Name: "kernel", Status: OK, Detail: "Linux " + k.release}
	if k.release == "" {
		c.Status, c.Detail = Warn, "cannot read /proc/sys/kernel/osrelease"
		return c
	}
	if maj, min, ok := majorMinor(k.release); ok && (maj < 5 || maj == 5 && min < 2) {
		c.Status = Warn
		c.Detail += " (older than 5.2: no cgroup v2 freezer, so pause works only on cgroup v1)"
		c.Fix = "use Linux 5.2 or later (Debian 12 has 6.1)"
	}
	return c
}

func majorMinor(release string) (int, int, bool) {
	f := strings.SplitN(release, ".", 3)
	if len(f) < 2 {
		return 0, 0, false
	}
	maj, err1 := strconv.Atoi(f[0])
	minor := f[1]
	if i := strings.IndexFunc(minor, func(r rune) bool { return r < '0' || r > '9' }); i >= 0 {
		minor = minor[:i]
	}
	min, err2 := strconv.Atoi(minor)
	return maj, min, err1 == nil && err2 == nil
}

package oci

import (
	"maps"
	goruntime "runtime"
	"slices"
	"strings"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/moat-sandbox/moat/internal/agentproto"
	"github.com/moat-sandbox/moat/internal/image"
	"github.com/moat-sandbox/moat/internal/runtime"
)

// Paths inside every sandbox.
const (
	defaultPath = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
	cpuPeriod   = 100000 // µs
)

// defaultCaps is the capability set of the agent and, through it, of every
// command run as root in the sandbox. It is Docker's default minus
// NET_RAW, MKNOD and AUDIT_WRITE.
var defaultCaps = []string{
	"CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FSETID", "CAP_FOWNER", "CAP_SETGID", "CAP_SETUID",
	"CAP_SETFCAP", "CAP_SETPCAP", "CAP_NET_BIND_SERVICE", "CAP_SYS_CHROOT", "CAP_KILL",
}

// sandboxOOMScoreAdj is the oom_score_adj of every sandbox process.
var sandboxOOMScoreAdj = 500

// bundleInput is everything buildSpec needs.
type bundleInput struct {
	ID        string
	Hostname  string
	Rootfs    string // absolute host path
	Args      []string
	Env       []string
	Cwd       string
	AgentBin  string // host path of the agent binary
	AgentConf string // host path of agent.json
	// Host paths of the per-sandbox /etc files.
	HostsFile    string
	HostnameFile string
	ResolvConf   string
	NetnsPath    string
	CgroupsPath  string // Config.CgroupParent/ID
	Resources    runtime.Resources
	// Volumes are host bind mounts (validated by Runtime.validate).
	Volumes []runtime.Mount
}

// buildSpec returns the OCI runtime config of a sandbox.
func buildSpec(in bundleInput) *specs.Spec {
	caps := slices.Clone(defaultCaps)
	s := &specs.Spec{
		// The oldest runtimes we support (runc 1.1, crun 1.8) reject newer
		// version strings; nothing used here is newer than 1.0.2.
		Version: "1.0.2",
		Root:    &specs.Root{Path: in.Rootfs},
		Process: &specs.Process{
			User:            specs.User{UID: 0, GID: 0},
			Args:            in.Args,
			Env:             in.Env,
			Cwd:             in.Cwd,
			NoNewPrivileges: true,
			Capabilities: &specs.LinuxCapabilities{
				Bounding:  caps,
				Effective: caps,
				Permitted: caps,
			},
			Rlimits: []specs.POSIXRlimit{nofile()},
			// Under host memory pressure (a sandbox without a memory
			// limit), the kernel's OOM killer picks sandbox processes
			// before host daemons such as moat itself. Without
			// CAP_SYS_RESOURCE a sandbox cannot lower it again.
			OOMScoreAdj: &sandboxOOMScoreAdj,
		},
		Hostname: in.Hostname,
		Mounts: []specs.Mount{
			{Destination: "/proc", Type: "proc", Source: "proc", Options: []string{"nosuid", "noexec", "nodev"}},
			{Destination: "/dev", Type: "tmpfs", Source: "tmpfs", Options: []string{"nosuid", "strictatime", "mode=755", "size=65536k"}},
			{Destination: "/dev/pts", Type: "devpts", Source: "devpts", Options: []string{"nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620", "gid=5"}},
			{Destination: "/dev/shm", Type: "tmpfs", Source: "shm", Options: []string{"nosuid", "noexec", "nodev", "mode=1777", "size=65536k"}},
			{Destination: "/dev/mqueue", Type: "mqueue", Source: "mqueue", Options: []string{"nosuid", "noexec", "nodev"}},
			{Destination: "/sys", Type: "sysfs", Source: "sysfs", Options: []string{"nosuid", "noexec", "nodev", "ro"}},
			{Destination: "/sys/fs/cgroup", Type: "cgroup", Source: "cgroup", Options: []string{"nosuid", "noexec", "nodev", "relatime", "ro"}},
			{Destination: "/etc/resolv.conf", Type: "bind", Source: in.ResolvConf, Options: []string{"rbind", "rprivate", "nosuid", "nodev", "noexec", "rw"}},
			{Destination: "/etc/hosts", Type: "bind", Source: in.HostsFile, Options: []string{"rbind", "rprivate", "nosuid", "nodev", "noexec", "rw"}},
			{Destination: "/etc/hostname", Type: "bind", Source: in.HostnameFile, Options: []string{"rbind", "rprivate", "nosuid", "nodev", "noexec", "rw"}},
			{Destination: agentproto.BinPath, Type: "bind", Source: in.AgentBin, Options: []string{"bind", "rprivate", "nosuid", "nodev", "ro"}},
			{Destination: agentproto.ConfigPath, Type: "bind", Source: in.AgentConf, Options: []string{"bind", "rprivate", "nosuid", "nodev", "noexec", "ro"}},
		},
		Linux: &specs.Linux{
			CgroupsPath: in.CgroupsPath,
			Namespaces: []specs.LinuxNamespace{
				{Type: specs.PIDNamespace},
				{Type: specs.IPCNamespace},
				{Type: specs.UTSNamespace},
				{Type: specs.MountNamespace},
				{Type: specs.NetworkNamespace, Path: in.NetnsPath},
				{Type: specs.CgroupNamespace},
			},
			Resources: resources(in.Resources),
			MaskedPaths: []string{
				"/proc/acpi", "/proc/asound", "/proc/kcore", "/proc/keys", "/proc/latency_stats",
				"/proc/timer_list", "/proc/timer_stats", "/proc/sched_debug", "/sys/firmware",
				"/proc/scsi", "/sys/devices/virtual/powercap",
			},
			ReadonlyPaths: []string{
				"/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger",
			},
			Seccomp: seccompProfile(),
		},
	}
	s.Mounts = append(s.Mounts, volumeMounts(in.Volumes)...)
	return s
}

// volumeMounts are the OCI mounts of host volumes: non-recursive binds
// (mounts beneath the host path stay hidden), never suid or device files.
func volumeMounts(vols []runtime.Mount) []specs.Mount {
	var out []specs.Mount
	for _, v := range vols {
		opts := []string{"bind", "rprivate", "nosuid", "nodev"}
		if v.ReadOnly {
			opts = append(opts, "ro")
		} else {
			opts = append(opts, "rw")
		}
		out = append(out, specs.Mount{Destination: v.Destination, Type: "bind", Source: v.Source, Options: opts})
	}
	return out
}

func resources(r runtime.Resources) *specs.LinuxResources {
	lr := &specs.LinuxResources{
		// Deny every device; runc and crun add the standard ones
		// (null, zero, full, random, urandom, tty, ptmx, pts).
		Devices: []specs.LinuxDeviceCgroup{{Allow: false, Access: "rwm"}},
	}
	if r.CPUMillis > 0 {
		quota := r.CPUMillis * cpuPeriod / 1000
		period := uint64(cpuPeriod)
		lr.CPU = &specs.LinuxCPU{Quota: &quota, Period: &period}
	}
	if r.MemoryBytes > 0 {
		limit := r.MemoryBytes
		lr.Memory = &specs.LinuxMemory{Limit: &limit}
	}
	if r.PidsLimit > 0 {
		limit := r.PidsLimit
		lr.Pids = &specs.LinuxPids{Limit: &limit}
	}
	return lr
}

// seccompProfile is a deny-list: everything is allowed except syscalls
// that reach outside the sandbox (kernel modules, clocks, mounts, other
// namespaces, keyrings, BPF/perf, swap, reboot, io_uring). Unprivileged user
// namespaces are refused because they re-grant capabilities.
func seccompProfile() *specs.LinuxSeccomp {
	denied := []string{
		"mount", "umount", "umount2", "move_mount", "open_tree", "fsopen", "fsconfig", "fsmount", "fspick", "mount_setattr",
		"pivot_root",
		"kexec_load", "kexec_file_load", "init_module", "finit_module", "delete_module", "create_module",
		"reboot", "swapon", "swapoff", "bpf", "perf_event_open", "lookup_dcookie",
		"add_key", "request_key", "keyctl",
		"setns", "open_by_handle_at", "name_to_handle_at",
		"clock_settime", "settimeofday", "stime", "adjtimex", "clock_adjtime",
		"iopl", "ioperm", "acct", "quotactl", "quotactl_fd", "userfaultfd",
		"nfsservctl", "uselib", "vhangup", "syslog", "get_kernel_syms", "query_module",
		// io_uring reaches large parts of the kernel outside seccomp's
		// view (the ring's operations are not syscalls) and has been the
		// source of many local privilege escalations; Docker's default
		// profile refuses it too (found by the escape suite).
		"io_uring_setup", "io_uring_enter", "io_uring_register",
	}
	eperm := uint(unix.EPERM)
	enosys := uint(unix.ENOSYS)
	newUser := uint64(unix.CLONE_NEWUSER)
	return &specs.LinuxSeccomp{
		DefaultAction: specs.ActAllow,
		Architectures: seccompArches(),
		Syscalls: []specs.LinuxSyscall{
			{Names: denied, Action: specs.ActErrno, ErrnoRet: &eperm},
			{
				Names: []string{"unshare", "clone"}, Action: specs.ActErrno, ErrnoRet: &eperm,
				Args: []specs.LinuxSeccompArg{{Index: 0, Value: newUser, ValueTwo: newUser, Op: specs.OpMaskedEqual}},
			},
			// clone3 passes its flags in memory, where seccomp cannot look;
			// ENOSYS makes libc fall back to clone, which is filtered above.
			{Names: []string{"clone3"}, Action: specs.ActErrno, ErrnoRet: &enosys},
		},
	}
}

func seccompArches() []specs.Arch {
	switch goruntime.GOARCH {
	case "amd64":
		return []specs.Arch{specs.ArchX86_64, specs.ArchX86, specs.ArchX32}
	case "arm64":
		return []specs.Arch{specs.ArchAARCH64, specs.ArchARM}
	default:
		return nil
	}
}

// processEnv merges the image environment with the spec environment (the
// spec wins) and adds a default PATH.
func processEnv(img []string, extra map[string]string) []string {
	var out []string
	index := map[string]int{}
	set := func(kv string) {
		k, _, _ := strings.Cut(kv, "=")
		if i, ok := index[k]; ok {
			out[i] = kv
			return
		}
		index[k] = len(out)
		out = append(out, kv)
	}
	for _, kv := range img {
		set(kv)
	}
	for _, k := range slices.Sorted(maps.Keys(extra)) {
		set(k + "=" + extra[k])
	}
	if _, ok := index["PATH"]; !ok {
		out = append(out, defaultPath)
	}
	return out
}

// processArgs is the agent command line followed by the user entrypoint.
func processArgs(spec runtime.Spec, cfg image.Config) []string {
	user := spec.Entrypoint
	if len(user) == 0 {
		user = append(slices.Clone(cfg.Entrypoint), cfg.Cmd...)
	}
	return agentproto.Args(user)
}

// nofile is the sandbox's open-files limit: 65536, or the host's hard limit
// if that is lower (raising it needs CAP_SYS_RESOURCE, which the runtime
// may no longer hold when it applies the limit).
func nofile() specs.POSIXRlimit {
	n := uint64(65536)
	var rl unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &rl); err == nil && rl.Max < n {
		n = rl.Max
	}
	return specs.POSIXRlimit{Type: "RLIMIT_NOFILE", Hard: n, Soft: n}
}

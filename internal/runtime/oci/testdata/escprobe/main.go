// Command escprobe runs one sandbox-escape attempt from inside a sandbox
// for the escape suite (internal/runtime/oci/escape_test.go). Build it
// static (CGO_ENABLED=0); the suite puts it at /escprobe in an image layer.
//
//	escprobe <attack> [args...]
//
// Every attempt prints one line per step: "BLOCKED <step>: <error>" when
// the kernel (or gVisor) refused it, "ALLOWED <step>: <detail>" when it
// went through. The suite decides which ALLOWED lines are escapes (some
// steps, like chroot inside the sandbox or sethostname in the sandbox's
// UTS namespace, are harmless when allowed). Attempts that would change
// the host if they succeeded are written so that success is harmless:
// sysctls are written back with their current value, sysrq gets 'h'
// (print help), modules are garbage, devices are opened read-only,
// packets are never sent, and cgroup writes only aim at the sandbox's own
// cgroup (the suite checks and undoes them on the host). Lines starting
// with "INFO" only describe what the probe sees, for the log.
package main

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: escprobe <attack> [args...]")
		os.Exit(2)
	}
	args := os.Args[2:]
	arg := func(i int) string {
		if i < len(args) {
			return args[i]
		}
		return ""
	}
	switch os.Args[1] {
	case "hostfs":
		hostfs(arg(0), arg(1))
	case "procsys":
		procsys()
	case "sysfs":
		sysfs()
	case "devices":
		devices()
	case "mount":
		mounts()
	case "module":
		module()
	case "ptrace":
		ptrace(arg(0))
	case "rawsock":
		rawsock()
	case "forkbomb":
		forkbomb(arg(0))
	case "sleep":
		time.Sleep(time.Hour)
	case "membomb":
		membomb(arg(0))
	case "clock":
		clock()
	case "hostname":
		hostname(arg(0))
	case "chroot":
		chroot(arg(0), arg(1))
	case "proc1root":
		proc1root(arg(0), arg(1))
	case "nsescape":
		nsescape()
	default:
		fmt.Fprintln(os.Stderr, "unknown attack", os.Args[1])
		os.Exit(2)
	}
}

func report(step string, err error, detail string) {
	if err != nil {
		fmt.Printf("BLOCKED %s: %v\n", step, err)
		return
	}
	fmt.Printf("ALLOWED %s: %s\n", step, detail)
}

// tryRead reports whether path holds secret (a host canary leaking in).
func tryRead(step, path, secret string) {
	data, err := os.ReadFile(path)
	if err == nil && !strings.Contains(string(data), secret) {
		err = fmt.Errorf("read %d bytes without the secret (a sandbox-local file)", len(data))
	}
	report(step, err, "host canary content read")
}

// tryWrite writes junk to path only if path is the host canary (holds
// secret); a sandbox-local file of the same name is left alone.
func tryWrite(step, path, secret string) {
	data, err := os.ReadFile(path)
	if err == nil && !strings.Contains(string(data), secret) {
		err = fmt.Errorf("not the host canary")
	}
	if err == nil {
		err = os.WriteFile(path, []byte("escaped"), 0o644)
	}
	report(step, err, "host canary overwritten")
}

// hostfs tries to reach a host file by its host path and through every
// /proc root link.
func hostfs(path, secret string) {
	tryRead("read-host-path", path, secret)
	tryWrite("write-host-path", path, secret)
	for _, p := range []string{"/proc/1/root", "/proc/self/root", "/proc/self/cwd", "/proc/1/cwd"} {
		tryRead("read-via-"+p, filepath.Join(p, path), secret)
	}
	// Walk the whole visible tree (without crossing into /proc and /sys)
	// looking for the canary's name anywhere.
	name := filepath.Base(path)
	found := ""
	filepath.WalkDir("/", func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return nil
		}
		if d.IsDir() && (p == "/proc" || p == "/sys" || p == "/dev") {
			return filepath.SkipDir
		}
		if d.Name() == name {
			if data, err := os.ReadFile(p); err == nil && strings.Contains(string(data), secret) {
				found = p
			}
		}
		return nil
	})
	var err error
	if found == "" {
		err = fmt.Errorf("canary %s not found anywhere in the sandbox tree", name)
	}
	report("find-canary", err, "found at "+found)
}

// writeSame writes a file's current content back to it, so that success
// changes nothing.
func writeSame(step, path string) {
	cur, err := os.ReadFile(path)
	if err == nil {
		var f *os.File
		f, err = os.OpenFile(path, os.O_WRONLY, 0)
		if err == nil {
			_, err = f.Write(cur)
			if cerr := f.Close(); err == nil {
				err = cerr
			}
		}
	}
	report(step, err, "wrote "+strconv.Quote(strings.TrimSpace(string(cur))))
}

func procsys() {
	for _, p := range []string{
		"/proc/sys/kernel/core_pattern",
		"/proc/sys/kernel/modprobe",
		"/proc/sys/vm/overcommit_memory",
		"/proc/sys/kernel/panic",
		"/proc/sys/fs/binfmt_misc/status",
	} {
		writeSame("write-"+p, p)
	}
	f, err := os.OpenFile("/proc/sysrq-trigger", os.O_WRONLY, 0)
	if err == nil {
		_, err = f.Write([]byte("h")) // 'h' only prints help to the kernel log
		f.Close()
	}
	report("write-/proc/sysrq-trigger", err, "sysrq accepted")
	// /proc/kcore and /proc/kmsg expose kernel memory and log.
	for _, p := range []string{"/proc/kcore", "/proc/kmsg", "/proc/keys", "/proc/timer_list"} {
		err := readSome(p)
		report("read-"+p, err, "readable")
	}
}

// readSome opens path read-only and reads one byte, with a timeout (kmsg
// blocks when empty).
func readSome(path string) error {
	f, err := os.OpenFile(path, os.O_RDONLY|unix.O_NONBLOCK, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	buf := make([]byte, 1)
	n, err := f.Read(buf)
	if n == 0 && err == nil {
		return fmt.Errorf("empty")
	}
	if n == 0 {
		return err
	}
	return nil
}

// markerMemLimit is the memory.limit_in_bytes the sysfs attack writes
// (1 PiB), so the suite can tell on the host whether the write landed.
const markerMemLimit = "1125899906842624"

// readValue returns a file's trimmed content, or the read error.
func readValue(path string) string {
	data, err := os.ReadFile(path)
	if err != nil {
		return "(" + err.Error() + ")"
	}
	return strconv.Quote(strings.TrimSpace(string(data)))
}

// cgroupInfo prints which cgroups the sandbox sees: its /proc/self/cgroup,
// the mounts at /sys/fs/cgroup and the limits it reads there, so the log
// shows whether they are the host's (compare the host's values the suite
// logs) or the Sentry's own cgroupfs under gVisor.
func cgroupInfo() {
	data, err := os.ReadFile("/proc/self/cgroup")
	fmt.Printf("INFO /proc/self/cgroup: %s\n", oneLine(data, err))
	mi, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		fmt.Printf("INFO mountinfo: %v\n", err)
	}
	for line := range strings.SplitSeq(string(mi), "\n") {
		if f := strings.Fields(line); len(f) > 4 && strings.HasPrefix(f[4], "/sys/fs/cgroup") {
			fmt.Printf("INFO mount: %s\n", line)
		}
	}
	var st unix.Statfs_t
	if err := unix.Statfs("/sys/fs/cgroup/pids", &st); err == nil {
		fmt.Printf("INFO statfs /sys/fs/cgroup/pids: type %#x flags %#x\n", st.Type, st.Flags)
	}
	fmt.Printf("INFO sandbox reads pids.max=%s memory.limit_in_bytes=%s\n",
		readValue("/sys/fs/cgroup/pids/pids.max"), readValue("/sys/fs/cgroup/memory/memory.limit_in_bytes"))
}

// oneLine joins a file's lines with "; " (or returns the read error).
func oneLine(data []byte, err error) string {
	if err != nil {
		return err.Error()
	}
	return strings.Join(strings.Split(strings.TrimSpace(string(data)), "\n"), "; ")
}

func sysfs() {
	cgroupInfo()
	for _, p := range []string{
		"/sys/kernel/uevent_helper",
		"/sys/kernel/mm/transparent_hugepage/enabled",
		"/sys/module/printk/parameters/time",
		"/sys/fs/cgroup/pids/pids.max",
		"/sys/fs/cgroup/memory/memory.limit_in_bytes",
		"/sys/fs/cgroup/cgroup.procs",
	} {
		if _, err := os.Stat(p); os.IsNotExist(err) {
			continue
		}
		writeSame("write-"+p, p)
	}
	// Raising our own pids limit would defeat the fork bomb guard (the
	// suite checks the host's pids.max afterwards).
	const pidsMax = "/sys/fs/cgroup/pids/pids.max"
	if _, err := os.Stat(pidsMax); err == nil {
		err := os.WriteFile(pidsMax, []byte("max"), 0)
		if err != nil {
			// gVisor's cgroupfs (2026) refuses "max" (it compares its whole
			// scratch page, not the bytes written); try the numeric
			// maximum (4M, Linux's PID_MAX_LIMIT) too.
			if os.WriteFile(pidsMax, []byte("4194304"), 0) == nil {
				err = nil
			}
		}
		report("raise-pids.max", err, "pids limit lifted; the sandbox now reads "+readValue(pidsMax))
	}
	// A value the host can recognize: a 1 PiB limit is no limit on any
	// host. It is left in place (as are the raised pids.max and the child
	// cgroup), so that the suite's host-side check sees a write that
	// landed; the suite undoes it there.
	const memLimit = "/sys/fs/cgroup/memory/memory.limit_in_bytes"
	if _, err := os.Stat(memLimit); err == nil {
		err := os.WriteFile(memLimit, []byte(markerMemLimit), 0)
		report("set-memory.limit", err, "memory limit set; the sandbox now reads "+readValue(memLimit))
	}
	err := os.Mkdir("/sys/fs/cgroup/pids/escape", 0o755)
	report("mkdir-cgroup", err, "created a child cgroup")
}

// devices tries to create and open host block/char devices.
func devices() {
	type dev struct {
		name         string
		major, minor uint32
		char         bool
	}
	hostRoot := os.Getenv("HOST_ROOT_DEV") // "major:minor" of the host root disk
	devs := []dev{{"mem", 1, 1, true}, {"kmem", 1, 2, true}, {"port", 1, 4, true}, {"kmsg", 1, 11, true}, {"sda", 8, 0, false}}
	if maj, min, ok := strings.Cut(hostRoot, ":"); ok {
		a, _ := strconv.Atoi(maj)
		b, _ := strconv.Atoi(min)
		devs = append(devs, dev{"hostroot", uint32(a), uint32(b), false})
	}
	dir, _ := os.MkdirTemp("/tmp", "devs")
	for _, d := range devs {
		mode := uint32(unix.S_IFBLK)
		if d.char {
			mode = unix.S_IFCHR
		}
		p := filepath.Join(dir, d.name)
		err := unix.Mknod(p, mode|0o600, int(unix.Mkdev(d.major, d.minor)))
		report("mknod-"+d.name, err, "device node created")
		if err == nil {
			report("open-mknod-"+d.name, readSome(p), "device readable")
		}
	}
	// Nodes shipped in the image (the suite's layer has /devnodes/*):
	// creating them needs no capability, so only the device cgroup (or
	// gVisor) stands between them and the host device.
	ents, _ := os.ReadDir("/devnodes")
	for _, e := range ents {
		p := filepath.Join("/devnodes", e.Name())
		report("open-image-node-"+e.Name(), readSome(p), "device readable")
		f, err := os.OpenFile(p, os.O_WRONLY, 0)
		if err == nil {
			f.Close() // never write
		}
		report("open-image-node-"+e.Name()+"-wronly", err, "device writable")
	}
	for _, p := range []string{"/dev/mem", "/dev/kmsg", "/dev/sda", "/dev/vda", "/dev/nvme0n1", "/dev/kvm", "/dev/fuse", "/dev/net/tun"} {
		report("open-"+p, readSome(p), "readable")
	}
}

func mounts() {
	os.MkdirAll("/tmp/mnt", 0o755)
	report("mount-tmpfs", unix.Mount("tmpfs", "/tmp/mnt", "tmpfs", 0, "size=1m"), "tmpfs mounted")
	report("remount-proc-rw", unix.Mount("", "/proc", "", unix.MS_REMOUNT, ""), "proc remounted")
	report("remount-proc-sys-rw", unix.Mount("", "/proc/sys", "", unix.MS_REMOUNT|unix.MS_BIND, ""), "/proc/sys remounted rw")
	report("remount-sys-rw", unix.Mount("", "/sys", "", unix.MS_REMOUNT, ""), "sysfs remounted rw")
	report("bind-root", unix.Mount("/", "/tmp/mnt", "", unix.MS_BIND|unix.MS_REC, ""), "bind mounted /")
	report("mount-new-proc", unix.Mount("proc", "/tmp/mnt", "proc", 0, ""), "proc mounted")
	report("mount-cgroup", unix.Mount("cgroup", "/tmp/mnt", "cgroup", 0, "pids"), "cgroup mounted")
	report("umount-proc-mask", unix.Unmount("/proc/kcore", unix.MNT_DETACH), "mask over /proc/kcore removed")
	_, err := unix.Fsopen("tmpfs", 0)
	report("fsopen", err, "fsopen works")
	_, err = unix.OpenTree(unix.AT_FDCWD, "/", unix.OPEN_TREE_CLONE)
	report("open_tree", err, "open_tree works")
	// busybox mount as the user would run it.
	out, err := exec.Command("/bin/mount", "-t", "tmpfs", "tmpfs", "/tmp/mnt").CombinedOutput()
	if err != nil {
		err = fmt.Errorf("%v: %s", err, bytes.TrimSpace(out))
	}
	report("busybox-mount", err, "mounted")
}

func module() {
	f, err := os.CreateTemp("/tmp", "mod*.ko")
	if err == nil {
		f.WriteString("not an ELF module")
		f.Seek(0, 0)
		err = unix.FinitModule(int(f.Fd()), "", 0)
		f.Close()
	}
	// EPERM is the refusal; ENOEXEC or EINVAL would mean the permission
	// check passed and only the garbage module was rejected.
	report("finit_module", permOnly(err), "permission check passed")
	report("init_module", permOnly(unix.InitModule([]byte("garbage"), "")), "permission check passed")
	report("delete_module", permOnly(unix.DeleteModule("moat_no_such_module", 0)), "permission check passed")
	out, err := exec.Command("/sbin/insmod", "/tmp/nonexistent.ko").CombinedOutput()
	if err == nil {
		err = nil
	} else {
		err = fmt.Errorf("%v: %s", err, bytes.TrimSpace(out))
	}
	report("busybox-insmod", err, "insmod ran")
	report("kexec_load", permOnly(kexecLoad()), "permission check passed")
}

func kexecLoad() error {
	_, _, e := unix.Syscall6(unix.SYS_KEXEC_LOAD, 0, 0, 0, 0, 0, 0)
	if e != 0 {
		return e
	}
	return nil
}

// permOnly turns "the kernel looked at the argument and refused it" into
// nil (the capability check passed) and keeps EPERM/EACCES/ENOSYS.
func permOnly(err error) error {
	switch err {
	case unix.EPERM, unix.EACCES, unix.ENOSYS:
		return err
	}
	return nil
}

func ptrace(pidArg string) {
	pid, _ := strconv.Atoi(pidArg)
	runtime.LockOSThread()
	err := unix.PtraceAttach(pid)
	if err == nil {
		unix.PtraceDetach(pid)
	}
	report("ptrace-attach-host-pid", err, "attached to "+pidArg)
	err = unix.PtraceSeize(pid)
	if err == nil {
		unix.PtraceDetach(pid)
	}
	report("ptrace-seize-host-pid", err, "seized "+pidArg)
	_, err = os.Stat("/proc/" + pidArg + "/mem")
	if err == nil {
		// The PID may exist inside the sandbox's namespace; only the
		// test process's own cmdline marks it as the host process.
		data, _ := os.ReadFile("/proc/" + pidArg + "/cmdline")
		if !strings.Contains(string(data), ".test") {
			err = fmt.Errorf("pid %s in the sandbox is not the host test process", pidArg)
		}
	}
	report("see-host-pid", err, "host process visible")
	buf := make([]byte, 8)
	_, err = unix.ProcessVMReadv(pid, []unix.Iovec{{Base: &buf[0], Len: 8}}, []unix.RemoteIovec{{Base: 0x400000, Len: 8}}, 0)
	if err == unix.EFAULT {
		err = nil // the permission check passed
	}
	report("process_vm_readv-host-pid", err, "read host memory")
	report("kill-0-host-pid", unix.Kill(pid, 0), "signal permission")
	fd, err := unix.PidfdOpen(pid, 0)
	if err == nil {
		unix.Close(fd)
	}
	report("pidfd_open-host-pid", err, "pidfd")
}

func rawsock() {
	const ethPAll = 0x0300 // htons(ETH_P_ALL)
	for _, s := range []struct {
		name           string
		domain, typ, p int
	}{
		{"AF_PACKET-SOCK_RAW", unix.AF_PACKET, unix.SOCK_RAW, ethPAll},
		{"AF_PACKET-SOCK_DGRAM", unix.AF_PACKET, unix.SOCK_DGRAM, ethPAll},
		{"AF_INET-SOCK_RAW-ICMP", unix.AF_INET, unix.SOCK_RAW, unix.IPPROTO_ICMP},
		{"AF_INET-SOCK_RAW-RAW", unix.AF_INET, unix.SOCK_RAW, unix.IPPROTO_RAW},
		{"AF_INET6-SOCK_RAW", unix.AF_INET6, unix.SOCK_RAW, unix.IPPROTO_ICMPV6},
	} {
		fd, err := unix.Socket(s.domain, s.typ, s.p)
		if err == nil {
			unix.Close(fd) // opened only: nothing is ever sent
		}
		report("socket-"+s.name, err, "raw socket opened")
	}
}

// forkbomb starts children until fork fails or cap is reached, then
// prints the count and leaves them running (the suite checks the host
// and deletes the sandbox with them in it).
func forkbomb(capArg string) {
	limit, _ := strconv.Atoi(capArg)
	if limit == 0 {
		limit = 100000
	}
	n := 0
	var last error
	for n < limit {
		cmd := exec.Command("/escprobe", "sleep")
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
		if err := cmd.Start(); err != nil {
			last = err
			break
		}
		n++
	}
	fmt.Printf("FORKED %d\n", n)
	if n >= limit {
		report("fork-until-limit", nil, fmt.Sprintf("reached the probe's own cap of %d without a refusal", n))
		return
	}
	report("fork-until-limit", last, "")
}

// membomb allocates and touches memory in 4 MiB steps up to maxMiB.
func membomb(maxArg string) {
	maxMiB, _ := strconv.Atoi(maxArg)
	var keep [][]byte
	for i := 0; i*4 < maxMiB; i++ {
		b := make([]byte, 4<<20)
		for j := 0; j < len(b); j += 4096 {
			b[j] = 1
		}
		keep = append(keep, b)
		if i%16 == 0 {
			fmt.Printf("ALLOC %d MiB\n", (i+1)*4)
		}
	}
	report("membomb", nil, fmt.Sprintf("allocated %d MiB without being killed", len(keep)*4))
}

func clock() {
	now := time.Now()
	tv := unix.NsecToTimeval(now.Add(365 * 24 * time.Hour).UnixNano())
	report("settimeofday", unix.Settimeofday(&tv), "clock set")
	ts := unix.NsecToTimespec(now.Add(365 * 24 * time.Hour).UnixNano())
	report("clock_settime", unix.ClockSettime(unix.CLOCK_REALTIME, &ts), "clock set")
	var tx unix.Timex
	tx.Modes = 0x0001 // ADJ_OFFSET
	tx.Offset = 1
	_, err := unix.Adjtimex(&tx)
	report("adjtimex", err, "clock adjusted")
	// busybox date exits 0 even when it cannot set the clock: judge by
	// the clock itself.
	out, _ := exec.Command("/bin/date", "-s", "2030-01-01 00:00:00").CombinedOutput()
	err = nil
	if time.Now().Year() < 2030 {
		err = fmt.Errorf("clock unchanged: %s", bytes.TrimSpace(out))
	}
	report("busybox-date-s", err, "date set")
	// Undo if anything went through.
	if time.Since(now) > time.Hour || time.Since(now) < -time.Hour {
		tv := unix.NsecToTimeval(now.UnixNano())
		unix.Settimeofday(&tv)
	}
}

func hostname(name string) {
	report("sethostname", unix.Sethostname([]byte(name)), "hostname set in the sandbox UTS namespace")
	var u unix.Utsname
	unix.Uname(&u)
	fmt.Printf("UNAME %s\n", unix.ByteSliceToString(u.Nodename[:]))
	report("setdomainname", unix.Setdomainname([]byte(name)), "domainname set")
}

// chroot runs the classic chroot-breakout (chroot into a subdirectory,
// then chdir("..") past it) and checks where it lands; pivot_root and
// the namespace-entering calls are tried too.
//
// Where it lands decides: under runc and crun the sandbox root is the root
// of the mount namespace, so leaving it (escape-left-sandbox-root) can
// only mean reaching the host's tree. gVisor mounts the container rootfs
// over an empty read-only tmpfs of the Sentry's (the mount namespace root,
// runsc/boot/vfs.go createMountNamespace), so there chdir("..") may land
// on that placeholder: out of the sandbox root, yet on nothing. Hence
// breakout-root-has-entries: whatever the process lands on must be empty,
// and read-host-path-after-breakout: the host canary must stay out of
// reach.
func chroot(path, secret string) {
	os.MkdirAll("/tmp/jail", 0o755)
	// Opened before the breakout, so that its mountinfo stays readable
	// where /proc is not mounted.
	proc, perr := os.Open("/proc/self")
	err := unix.Chroot("/tmp/jail")
	report("chroot-subdir", err, "chroot allowed (inside the sandbox root)")
	if err == nil {
		for range 64 {
			unix.Chdir("..")
		}
		err = unix.Chroot(".")
		report("chroot-dotdot", err, "chroot(.) after chdir(..)")
		_, serr := os.Stat("/escprobe")
		left := serr != nil
		if left {
			fmt.Printf("ALLOWED escape-left-sandbox-root: /escprobe not visible after the breakout\n")
		} else {
			fmt.Printf("BLOCKED escape-left-sandbox-root: still in the sandbox root\n")
		}
		var names []string
		ents, rerr := os.ReadDir("/")
		for _, e := range ents {
			names = append(names, e.Name())
		}
		var st unix.Statfs_t
		unix.Statfs("/", &st)
		where := fmt.Sprintf("statfs type %#x flags %#x", st.Type, st.Flags)
		fmt.Printf("INFO root after the breakout: %s; entries %q (%v)\n", where, names, rerr)
		if perr == nil {
			mi, err := unix.Openat(int(proc.Fd()), "mountinfo", unix.O_RDONLY, 0)
			if err == nil {
				f := os.NewFile(uintptr(mi), "mountinfo")
				data, err := io.ReadAll(f)
				f.Close()
				fmt.Printf("INFO mountinfo after the breakout: %s\n", oneLine(data, err))
			}
		}
		switch {
		case !left:
			err = fmt.Errorf("still in the sandbox root")
		case rerr != nil:
			err = fmt.Errorf("cannot list the new root: %w", rerr)
		case len(names) == 0:
			err = fmt.Errorf("landed on an empty directory (%s)", where)
		default:
			err = nil
		}
		report("breakout-root-has-entries", err, fmt.Sprintf("landed on %q (%s)", names, where))
		tryRead("read-host-path-after-breakout", path, secret)
	}
	os.MkdirAll("/tmp/newroot/old", 0o755)
	report("pivot_root", unix.PivotRoot("/tmp/newroot", "/tmp/newroot/old"), "pivot_root allowed")
}

func proc1root(path, secret string) {
	data, _ := os.ReadFile("/proc/1/cmdline")
	cmd := strings.ReplaceAll(string(data), "\x00", " ")
	var err error
	if strings.Contains(cmd, "/.moat/moat") || strings.Contains(cmd, "execd") {
		err = fmt.Errorf("pid 1 is the sandbox agent (%s)", strings.TrimSpace(cmd))
	}
	report("pid1-is-host-init", err, "pid 1 = "+cmd)
	tryRead("read-/proc/1/root-host-path", filepath.Join("/proc/1/root", path), secret)
	// Every visible process: is any of them outside our root?
	ents, _ := os.ReadDir("/proc")
	outside := ""
	for _, e := range ents {
		if _, err := strconv.Atoi(e.Name()); err != nil {
			continue
		}
		if _, err := os.Stat(filepath.Join("/proc", e.Name(), "root", "escprobe")); err != nil && !os.IsPermission(err) {
			if _, err := os.Stat(filepath.Join("/proc", e.Name())); err == nil {
				outside += e.Name() + " "
			}
		}
	}
	err = nil
	if outside == "" {
		err = fmt.Errorf("every visible process shares the sandbox root")
	}
	report("process-with-foreign-root", err, outside)
}

// nsescape tries the namespace and handle syscalls that lead outside.
func nsescape() {
	report("unshare-user", unix.Unshare(unix.CLONE_NEWUSER), "user namespace created")
	report("unshare-mount", unix.Unshare(unix.CLONE_NEWNS), "mount namespace created")
	fd, err := unix.Open("/proc/1/ns/mnt", unix.O_RDONLY, 0)
	if err == nil {
		err = unix.Setns(fd, unix.CLONE_NEWNS)
		unix.Close(fd)
	}
	report("setns", err, "setns allowed")
	_, _, err = unix.NameToHandleAt(unix.AT_FDCWD, "/", 0)
	report("name_to_handle_at", err, "handle obtained")
	// Shocker (CVE-2014-3519): open_by_handle_at with a guessed handle of
	// the host's root inode.
	root := unix.NewFileHandle(1, []byte{2, 0, 0, 0, 0, 0, 0, 0})
	_, err = unix.OpenByHandleAt(unix.AT_FDCWD, root, unix.O_RDONLY)
	report("open_by_handle_at", permOnly(err), "permission check passed")
	_, _, e := unix.Syscall(unix.SYS_BPF, 0, 0, 0)
	report("bpf", permOnly(errnoErr(e)), "permission check passed")
	_, _, e = unix.Syscall(unix.SYS_KEYCTL, 0, 0, 0)
	report("keyctl", permOnly(errnoErr(e)), "permission check passed")
	attr := unix.PerfEventAttr{Type: unix.PERF_TYPE_SOFTWARE, Config: unix.PERF_COUNT_SW_CPU_CLOCK}
	pfd, err := unix.PerfEventOpen(&attr, -1, 0, -1, 0)
	if err == nil {
		unix.Close(pfd)
	}
	report("perf_event_open-all-pids", err, "system-wide perf event")
	// io_uring: a large kernel attack surface (many local privilege
	// escalations since 5.1); an fd would mean the ring is usable.
	var params [120]byte
	ufd, _, e := unix.Syscall(unix.SYS_IO_URING_SETUP, 1, uintptr(unsafe.Pointer(&params[0])), 0)
	if e == 0 {
		unix.Close(int(ufd))
	}
	report("io_uring_setup", errnoErr(e), "io_uring instance created")
}

func errnoErr(e unix.Errno) error {
	if e == 0 {
		return nil
	}
	return e
}

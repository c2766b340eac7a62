// Package guest boots the stock Debian 12 guest (scripts/build-guest.sh:
// Debian's 6.1 kernel, cgroup v2 unified under systemd) under QEMU's
// software emulation for tests that need a host unlike the one they run
// on. Each boot writes to its own qcow2 overlay, so the cached image stays
// clean. The host talks to the guest through a virtio-9p share: files
// put there appear under /mnt/host, and Run drops a shell script in its
// cmd/ directory that the guest's moat-guest-agent runs as root, writing
// back its output and exit code. The guest's only network is QEMU's
// user-mode net with no route out; Forward ports reach it from loopback.
package guest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/moat-sandbox/moat/internal/testutil"
)

// RequireEnv turns a guest that cannot be booted (no image, no QEMU) from
// a skip into a failure; `make test` sets it after building the image.
const RequireEnv = "MOAT_REQUIRE_GUEST"

// MountPoint is where the guest sees the share.
const MountPoint = "/mnt/host"

// Options tune Boot; zero values take the defaults.
type Options struct {
	// CPUs and MemoryMiB size the guest (default 2 and 3072).
	CPUs, MemoryMiB int
	// Forward lists guest TCP ports to reach from the host (Addr).
	Forward []int
	// BootTimeout bounds the boot to the agent's readiness (default 8 min:
	// a boot takes 75-130 s under TCG on an idle 2-core machine).
	BootTimeout time.Duration
}

// VM is one running guest.
type VM struct {
	// Share is the host side of the 9p share (the guest's MountPoint).
	Share string

	dir    string
	cmd    *exec.Cmd
	exited chan struct{}
	stderr *strings.Builder
	addrs  map[int]string
	seq    atomic.Int64
}

// ImageDir returns the directory scripts/build-guest.sh builds the image
// into ($MOAT_GUEST_DIR overrides it), or an error naming what is missing.
func ImageDir(t testing.TB) (string, error) {
	t.Helper()
	dir := os.Getenv("MOAT_GUEST_DIR")
	if dir == "" {
		out, err := exec.Command("bash", filepath.Join(testutil.RepoRoot(t), "scripts", "build-guest.sh"), "--print-dir").Output()
		if err != nil {
			return "", fmt.Errorf("build-guest.sh --print-dir: %v", err)
		}
		dir = strings.TrimSpace(string(out))
	}
	for _, f := range []string{"vmlinuz", "initrd.img", "disk.img"} {
		if _, err := os.Stat(filepath.Join(dir, f)); err != nil {
			return "", fmt.Errorf("guest image not built (make deps-guest): %v", err)
		}
	}
	for _, b := range []string{"qemu-system-x86_64", "qemu-img"} {
		if _, err := exec.LookPath(b); err != nil {
			return "", fmt.Errorf("%s not installed (make deps-guest): %v", b, err)
		}
	}
	return dir, nil
}

// Boot starts a guest and waits until it runs commands; it is shut down
// and its overlay removed when t ends. Without an image or QEMU the test
// is skipped, or fails when RequireEnv is set.
func Boot(t testing.TB, opts Options) *VM {
	t.Helper()
	testutil.SkipShort(t, "boots a QEMU guest")
	img, err := ImageDir(t)
	if err != nil {
		if os.Getenv(RequireEnv) != "" {
			t.Fatal(err)
		}
		t.Skip(err)
	}
	if opts.CPUs == 0 {
		opts.CPUs = 2
	}
	if opts.MemoryMiB == 0 {
		opts.MemoryMiB = 3072
	}
	if opts.BootTimeout == 0 {
		opts.BootTimeout = 8 * time.Minute
	}
	// A forwarded port is picked free and then given to QEMU, so another
	// process may take it in between: QEMU then fails at once, and the
	// boot is tried again with other ports.
	for try := 1; ; try++ {
		v, err := start(t, img, opts)
		if err == nil {
			if err = v.waitReady(opts.BootTimeout); err == nil {
				return v
			}
		}
		if v != nil {
			v.Close()
			if try < 3 && strings.Contains(v.stderr.String(), "host forwarding") {
				continue
			}
			// On a busy host, under emulation, the kernel's check of the
			// IO-APIC timer can miss its window and panic ("IO-APIC +
			// timer doesn't work"), or the initrd give up waiting for the
			// disk; the next boot passes.
			if tail := v.SerialTail(4000); try < 3 && (strings.Contains(tail, "Kernel panic") ||
				strings.Contains(tail, "Gave up waiting for root")) {
				t.Logf("guest kernel panicked during boot, booting again:\n%s", v.SerialTail(1500))
				continue
			}
			t.Logf("serial console (tail):\n%s", v.SerialTail(4000))
		}
		t.Fatalf("boot guest: %v", err)
	}
}

func start(t testing.TB, img string, opts Options) (*VM, error) {
	dir := t.TempDir()
	v := &VM{Share: filepath.Join(dir, "share"), dir: dir, exited: make(chan struct{}), stderr: &strings.Builder{}, addrs: map[int]string{}}
	if err := os.MkdirAll(filepath.Join(v.Share, "cmd"), 0o755); err != nil {
		return nil, err
	}
	overlay := filepath.Join(dir, "run.qcow2")
	if out, err := exec.Command("qemu-img", "create", "-q", "-f", "qcow2", "-F", "raw", "-b", filepath.Join(img, "disk.img"), overlay).CombinedOutput(); err != nil {
		return nil, fmt.Errorf("qemu-img create: %v: %s", err, out)
	}
	netdev := "user,id=net0,restrict=on"
	for _, p := range opts.Forward {
		hp, err := freePort()
		if err != nil {
			return nil, err
		}
		v.addrs[p] = net.JoinHostPort("127.0.0.1", strconv.Itoa(hp))
		netdev += fmt.Sprintf(",hostfwd=tcp:127.0.0.1:%d-:%d", hp, p)
	}
	args := []string{
		"-nodefaults", "-display", "none", "-no-reboot",
		"-accel", "tcg,thread=multi", "-cpu", "max",
		"-smp", strconv.Itoa(opts.CPUs), "-m", strconv.Itoa(opts.MemoryMiB),
		"-kernel", filepath.Join(img, "vmlinuz"), "-initrd", filepath.Join(img, "initrd.img"),
		"-append", "root=/dev/vda rw console=ttyS0,115200 panic=-1",
		// The overlay is thrown away after the boot: no flushes needed.
		"-drive", "file=" + overlay + ",if=virtio,format=qcow2,cache=unsafe",
		"-virtfs", "local,path=" + v.Share + ",mount_tag=host0,security_model=none,id=host0",
		"-netdev", netdev, "-device", "virtio-net-pci,netdev=net0",
		"-device", "virtio-rng-pci",
		"-serial", "file:" + filepath.Join(dir, "serial.log"), "-monitor", "none",
	}
	v.cmd = exec.Command("qemu-system-x86_64", args...)
	v.cmd.Stderr = v.stderr
	// Its own process group, and killed with the test process even when
	// that dies without cleaning up (a go test timeout).
	v.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := v.cmd.Start(); err != nil {
		return nil, err
	}
	go func() { v.cmd.Wait(); close(v.exited) }()
	t.Cleanup(v.Close)
	return v, nil
}

// freePort returns a loopback TCP port nothing listens on now.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

func (v *VM) waitReady(timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		if _, err := os.Stat(filepath.Join(v.Share, "ready")); err == nil {
			return nil
		}
		select {
		case <-v.exited:
			return fmt.Errorf("qemu exited during boot: %v: %s", v.cmd.ProcessState, strings.TrimSpace(v.stderr.String()))
		case <-time.After(200 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("guest not ready within %s", timeout)
		}
	}
}

// Addr returns the host address (127.0.0.1:PORT) forwarded to the guest's
// TCP port p, which must be one of Options.Forward.
func (v *VM) Addr(p int) string {
	a, ok := v.addrs[p]
	if !ok {
		panic(fmt.Sprintf("guest port %d is not forwarded", p))
	}
	return a
}

// Result is what a command did in the guest.
type Result struct {
	Stdout, Stderr string
	Code           int
}

// Run runs script with bash in the guest, as root in /root, and returns
// its output and exit code once it exits. An error means the command's
// outcome is unknown (ctx ended, the guest died); the script may still
// run in the guest then.
func (v *VM) Run(ctx context.Context, script string) (Result, error) {
	id := filepath.Join(v.Share, "cmd", strconv.FormatInt(v.seq.Add(1), 10))
	defer func() {
		for _, s := range []string{".sh", ".run", ".out", ".err", ".rc"} {
			os.Remove(id + s)
		}
	}()
	if err := os.WriteFile(id+".tmp", []byte(script), 0o644); err != nil {
		return Result{}, err
	}
	if err := os.Rename(id+".tmp", id+".sh"); err != nil {
		return Result{}, err
	}
	for {
		if b, err := os.ReadFile(id + ".rc"); err == nil {
			code, err := strconv.Atoi(strings.TrimSpace(string(b)))
			if err != nil {
				return Result{}, fmt.Errorf("exit code %q: %v", b, err)
			}
			out, _ := os.ReadFile(id + ".out")
			errOut, _ := os.ReadFile(id + ".err")
			return Result{Stdout: string(out), Stderr: string(errOut), Code: code}, nil
		}
		select {
		case <-ctx.Done():
			return Result{}, ctx.Err()
		case <-v.exited:
			return Result{}, errors.New("guest exited")
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// MustRun runs script (Run) with a timeout and fails t unless it exits 0;
// it returns the script's standard output.
func (v *VM) MustRun(t testing.TB, timeout time.Duration, script string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	r, err := v.Run(ctx, script)
	if err != nil {
		t.Fatalf("guest: %s: %v", script, err)
	}
	if r.Code != 0 {
		t.Fatalf("guest: %s: exit %d\nstdout: %s\nstderr: %s", script, r.Code, r.Stdout, r.Stderr)
	}
	return r.Stdout
}

// CopyIn copies the file or directory src into the share as name and
// returns its path in the guest.
func (v *VM) CopyIn(t testing.TB, src, name string) string {
	t.Helper()
	dst := filepath.Join(v.Share, name)
	if out, err := exec.Command("cp", "-a", "--", src, dst).CombinedOutput(); err != nil {
		t.Fatalf("copy %s into the guest: %v: %s", src, err, out)
	}
	return MountPoint + "/" + name
}

// SerialTail returns the last n bytes of the guest's serial console (the
// kernel's and systemd's messages).
func (v *VM) SerialTail(n int) string {
	b, _ := os.ReadFile(filepath.Join(v.dir, "serial.log"))
	if len(b) > n {
		b = b[len(b)-n:]
	}
	return string(b)
}

// Close stops the guest (its disk is a throw-away overlay, so QEMU is just
// told to quit) and waits for it; the overlay goes with t's TempDir.
func (v *VM) Close() {
	select {
	case <-v.exited:
		return
	default:
	}
	syscall.Kill(-v.cmd.Process.Pid, syscall.SIGTERM)
	select {
	case <-v.exited:
	case <-time.After(10 * time.Second):
		syscall.Kill(-v.cmd.Process.Pid, syscall.SIGKILL)
		<-v.exited
	}
}

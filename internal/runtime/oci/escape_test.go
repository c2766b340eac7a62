package oci

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/moat-sandbox/moat/internal/agentproto"
	"github.com/moat-sandbox/moat/internal/errdefs"
	"github.com/moat-sandbox/moat/internal/runtime"
	"github.com/moat-sandbox/moat/internal/runtime/runtimetest"
	"github.com/moat-sandbox/moat/internal/testutil"
)

// escImage is the busybox image with the escape probe layer on top.
const escImage = "local/escape:test"

var (
	probeOnce sync.Once
	probeDir  string
	probeErr  error
)

// probeLayer returns an image layer holding /escprobe (the static probe
// of testdata/escprobe) and /devnodes, device nodes of host devices
// (/dev/mem, /dev/kmsg, the host's root disk) as an image could ship them.
func probeLayer(t *testing.T) string {
	t.Helper()
	probeOnce.Do(func() {
		dir, err := os.MkdirTemp("", "moat-escprobe-")
		if err != nil {
			probeErr = err
			return
		}
		os.Chmod(dir, 0o755)
		probeDir = dir
		cmd := exec.Command("go", "build", "-o", filepath.Join(dir, "escprobe"), "./internal/runtime/oci/testdata/escprobe")
		cmd.Dir = testutil.RepoRoot(t)
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			probeErr = fmt.Errorf("build escprobe: %v\n%s", err, out)
			return
		}
		nodes := filepath.Join(dir, "devnodes")
		os.Mkdir(nodes, 0o755)
		var st unix.Stat_t
		unix.Stat("/", &st)
		for name, d := range map[string]struct {
			mode uint32
			dev  uint64
		}{
			"mem":      {unix.S_IFCHR, unix.Mkdev(1, 1)},
			"kmsg":     {unix.S_IFCHR, unix.Mkdev(1, 11)},
			"hostroot": {unix.S_IFBLK, st.Dev},
		} {
			if err := unix.Mknod(filepath.Join(nodes, name), d.mode|0o666, int(d.dev)); err != nil {
				probeErr = fmt.Errorf("mknod %s: %w", name, err)
				return
			}
		}
	})
	if probeErr != nil {
		t.Fatal(probeErr)
	}
	return probeDir
}

// hostRootDev is "major:minor" of the device holding the host's /.
func hostRootDev() string {
	var st unix.Stat_t
	unix.Stat("/", &st)
	return fmt.Sprintf("%d:%d", unix.Major(st.Dev), unix.Minor(st.Dev))
}

// agentResult is the outcome of one POST /command.
type agentResult struct {
	Out  string // stdout and stderr lines
	Code int    // exit code; -1 if the stream ended without one
	Err  string // error event value, if any
}

// agentRun runs command through the sandbox agent's POST /command.
func agentRun(t *testing.T, ctx context.Context, r *Runtime, id, command string, timeout time.Duration) agentResult {
	t.Helper()
	ep, err := r.Endpoint(ctx, id, agentproto.Port)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := json.Marshal(map[string]any{"command": command, "timeout": timeout.Milliseconds()})
	ctx, cancel := context.WithTimeout(ctx, timeout+10*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+ep+"/command", bytes.NewReader(body))
	req.Header.Set("X-EXECD-ACCESS-TOKEN", runtimetest.Token)
	req.Header.Set("Content-Type", "application/json")
	client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	defer client.CloseIdleConnections()
	resp, err := client.Do(req)
	if err != nil {
		t.Fatalf("POST /command %q: %v", command, err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("POST /command %q: %s %s", command, resp.Status, data)
	}
	res := agentResult{Code: -1}
	var out strings.Builder
	for frame := range strings.SplitSeq(string(data), "\n\n") {
		if strings.TrimSpace(frame) == "" {
			continue
		}
		var ev struct {
			Type  string `json:"type"`
			Text  string `json:"text"`
			Error *struct {
				EValue    string   `json:"evalue"`
				Traceback []string `json:"traceback"`
			} `json:"error"`
		}
		if json.Unmarshal([]byte(frame), &ev) != nil {
			continue
		}
		switch ev.Type {
		case "stdout", "stderr":
			out.WriteString(ev.Text + "\n")
		case "execution_complete":
			res.Code = 0
		case "error":
			if ev.Error != nil {
				res.Err = ev.Error.EValue + " " + strings.Join(ev.Error.Traceback, " ")
				if n, err := strconv.Atoi(ev.Error.EValue); err == nil {
					res.Code = n
				}
			}
		}
	}
	res.Out = out.String()
	if err != nil && res.Code == -1 {
		res.Err += " (read: " + err.Error() + ")"
	}
	return res
}

// probeLines returns the ALLOWED and BLOCKED steps of a probe run.
func probeLines(out string) (allowed, blocked []string) {
	for line := range strings.SplitSeq(out, "\n") {
		switch {
		case strings.HasPrefix(line, "ALLOWED "):
			allowed = append(allowed, strings.TrimPrefix(line, "ALLOWED "))
		case strings.HasPrefix(line, "BLOCKED "):
			blocked = append(blocked, strings.TrimPrefix(line, "BLOCKED "))
		}
	}
	return allowed, blocked
}

func stepName(line string) string {
	name, _, _ := strings.Cut(line, ":")
	return name
}

// escEnv is what the attacks of one tier share.
type escEnv struct {
	r       *Runtime
	class   string
	id      string // the shared sandbox
	canary  string // host path of the canary file
	secret  string // its content
	hostPid int
}

// attack is one row of the escape suite.
type attack struct {
	name string
	// cmd is the shell command run in the sandbox.
	cmd func(e *escEnv) string
	// harmless lists the probe steps allowed to succeed: they only act
	// inside the sandbox (the check function proves it where it matters).
	harmless []string
	// harmlessIn adds per-tier harmless steps (see docs/SECURITY.md).
	harmlessIn map[string][]string
	// res, if set, gives the attack a sandbox of its own with these limits.
	res *runtime.Resources
	// resIn overrides res per tier.
	resIn map[string]*runtime.Resources
	// before runs on the host before the attack; its result goes to check.
	before func(t *testing.T, e *escEnv) any
	// check asserts that the host is unchanged.
	check func(t *testing.T, e *escEnv, res agentResult, before any)
	// noProbeLines: the output is not probe lines (membomb, forkbomb).
	noProbeLines bool
	timeout      time.Duration
}

func readTrim(t *testing.T, path string) string {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(data))
}

// cgroupFile is a file of the shared sandbox's cgroup in hierarchy ctrl
// (the unified one on a v2 host).
func (e *escEnv) cgroupFile(ctrl, file string) string {
	return filepath.Join(cgroupDir(ctrl, e.r.cgroupPath(e.id)), file)
}

// cgroupValue reads a value of the shared sandbox's cgroup by its v1 name
// (see the package's cgroupValue).
func (e *escEnv) cgroupValue(t *testing.T, v1name string) string {
	return cgroupValue(t, e.r.cgroupPath(e.id), v1name)
}

var attacks = []attack{
	{
		name: "host-filesystem",
		cmd:  func(e *escEnv) string { return fmt.Sprintf("/escprobe hostfs %s %s", e.canary, e.secret) },
		check: func(t *testing.T, e *escEnv, _ agentResult, _ any) {
			if got := readTrim(t, e.canary); got != e.secret {
				t.Errorf("host canary changed to %q", got)
			}
		},
	},
	{
		name: "proc-sys-and-sysrq",
		cmd:  func(*escEnv) string { return "/escprobe procsys" },
		before: func(t *testing.T, _ *escEnv) any {
			return readTrim(t, "/proc/sys/kernel/core_pattern")
		},
		check: func(t *testing.T, _ *escEnv, _ agentResult, before any) {
			if got := readTrim(t, "/proc/sys/kernel/core_pattern"); got != before.(string) {
				t.Errorf("host core_pattern changed: %q -> %q", before, got)
			}
		},
	},
	{
		name: "sys-and-cgroup-writes",
		cmd:  func(*escEnv) string { return "/escprobe sysfs" },
		// Current runsc (not 20221219) mounts the Sentry's own cgroupfs at
		// /sys/fs/cgroup: a read-only tmpfs with a writable bind of the
		// container's cgroup of each controller over it (runsc/boot/vfs.go
		// mountCgroupSubmounts), the spec's "ro" only reaching the tmpfs.
		// The Sentry keeps those files in memory and never writes a host
		// cgroup (pkg/sentry/fsimpl/cgroupfs makes no host calls); the probe
		// shows a gVisor-only "job" controller, pids.max "max" where the host
		// has escPids, and the host's RAM as memory limit. The check below
		// proves the writes did not reach the host: the probe leaves its
		// values (pids.max 4194304, memory limit 1 PiB, a child cgroup) in
		// place, and the host's files must not show them.
		harmlessIn: map[string][]string{"runsc": {
			"write-/sys/fs/cgroup/pids/pids.max", "write-/sys/fs/cgroup/memory/memory.limit_in_bytes",
			"raise-pids.max", "set-memory.limit", "mkdir-cgroup",
		}},
		before: func(t *testing.T, e *escEnv) any {
			return e.cgroupValue(t, "memory.limit_in_bytes")
		},
		check: func(t *testing.T, e *escEnv, _ agentResult, before any) {
			t.Logf("host: pids.max %s, memory limit %s", e.cgroupValue(t, "pids.max"), before)
			want := escPids
			if e.r.kinds[e.class] == runscKind {
				want += runscPidsHeadroom // the Sentry's own threads
			}
			if got := e.cgroupValue(t, "pids.max"); got != strconv.Itoa(want) {
				t.Errorf("sandbox pids.max on the host = %s, want %d", got, want)
			}
			if got := e.cgroupValue(t, "memory.limit_in_bytes"); got != before.(string) {
				t.Errorf("sandbox memory limit on the host: %s -> %s (the probe writes %s)", before, got, escMarkerMemLimit)
			}
			if _, err := os.Stat(e.cgroupFile("pids", "escape")); err == nil {
				t.Errorf("sandbox created a cgroup on the host")
				os.Remove(e.cgroupFile("pids", "escape"))
			}
		},
	},
	{
		name: "devices",
		cmd:  func(*escEnv) string { return "HOST_ROOT_DEV=" + hostRootDev() + " /escprobe devices" },
		// gVisor lets mknod create nodes in its own VFS, but they resolve
		// to gVisor's device table, never to a host device: opening them
		// fails with ENXIO (asserted by the open-mknod-* steps). Its
		// /dev/kmsg (1,11) is the Sentry's emulated log.
		harmlessIn: map[string][]string{"runsc": {
			"mknod-mem", "mknod-kmem", "mknod-port", "mknod-kmsg", "mknod-sda", "mknod-hostroot",
			"open-image-node-kmsg-wronly",
		}},
	},
	{
		name: "mount",
		cmd:  func(*escEnv) string { return "/escprobe mount" },
	},
	{
		name: "kernel-modules",
		cmd:  func(*escEnv) string { return "/escprobe module" },
	},
	{
		name: "ptrace-host-process",
		cmd:  func(e *escEnv) string { return fmt.Sprintf("/escprobe ptrace %d", e.hostPid) },
		check: func(t *testing.T, _ *escEnv, _ agentResult, _ any) {
			status := readTrim(t, "/proc/self/status")
			if !strings.Contains(status, "TracerPid:\t0\n") {
				t.Errorf("test process is traced:\n%s", status)
			}
		},
	},
	{
		name: "raw-sockets",
		cmd:  func(*escEnv) string { return "/escprobe rawsock" },
	},
	{
		name: "clock",
		cmd:  func(*escEnv) string { return "/escprobe clock" },
		before: func(*testing.T, *escEnv) any {
			return time.Now() // wall and monotonic readings
		},
		check: func(t *testing.T, _ *escEnv, _ agentResult, before any) {
			b := before.(time.Time)
			mono := time.Since(b)                       // monotonic
			wall := time.Now().Round(0).Sub(b.Round(0)) // wall clock
			if d := wall - mono; d > 2*time.Second || d < -2*time.Second {
				t.Errorf("host wall clock moved by %v during the attack", d)
			}
		},
	},
	{
		name:     "hostname",
		cmd:      func(*escEnv) string { return "/escprobe hostname escaped-host" },
		harmless: []string{"sethostname", "setdomainname"},
		before: func(t *testing.T, _ *escEnv) any {
			h, _ := os.Hostname()
			return h
		},
		check: func(t *testing.T, _ *escEnv, res agentResult, before any) {
			if h, _ := os.Hostname(); h != before.(string) {
				t.Errorf("host hostname changed: %q -> %q", before, h)
				unix.Sethostname([]byte(before.(string)))
			}
			if strings.Contains(res.Out, "ALLOWED sethostname") && !strings.Contains(res.Out, "UNAME escaped-host") {
				t.Errorf("sethostname succeeded but the sandbox name did not change:\n%s", res.Out)
			}
		},
	},
	{
		name:     "chroot-and-pivot",
		cmd:      func(e *escEnv) string { return fmt.Sprintf("/escprobe chroot %s %s", e.canary, e.secret) },
		harmless: []string{"chroot-subdir", "chroot-dotdot"},
		// Current runsc mounts the container rootfs over an empty read-only
		// tmpfs, the root of the Sentry's mount namespace (runsc/boot/vfs.go
		// createMountNamespace). The breakout's chdir("..") stops there:
		// outside the sandbox root, but on that placeholder (the probe logs
		// a tmpfs, read-only, no entries; mountinfo "/ / ro - tmpfs"), which
		// holds nothing of the host. breakout-root-has-entries (the landing
		// root must be empty) and read-host-path-after-breakout (the host
		// canary) stay escapes on every tier.
		harmlessIn: map[string][]string{"runsc": {"escape-left-sandbox-root"}},
	},
	{
		name: "proc-1-root",
		cmd:  func(e *escEnv) string { return fmt.Sprintf("/escprobe proc1root %s %s", e.canary, e.secret) },
	},
	{
		name: "namespaces-and-handles",
		cmd:  func(*escEnv) string { return "/escprobe nsescape" },
		// The Sentry grants a new mount namespace of its own (mounts in it
		// are still refused, see the mount attack).
		harmlessIn: map[string][]string{"runsc": {"unshare-mount"}},
	},
	{
		name: "fork-bomb",
		res:  &runtime.Resources{PidsLimit: 64},
		// The Sentry, gofer and ptrace stubs need host tasks of their own:
		// below ~256 runsc does not reliably start.
		resIn:        map[string]*runtime.Resources{"runsc": {PidsLimit: escPids}},
		noProbeLines: true,
		cmd:          func(*escEnv) string { return "/escprobe forkbomb 2000" },
		// runsc: the request hangs until this timeout (see check).
		check: func(t *testing.T, e *escEnv, res agentResult, _ any) {
			n := -1
			if i := strings.Index(res.Out, "FORKED"); i >= 0 {
				fmt.Sscanf(res.Out[i:], "FORKED %d", &n)
			}
			st, _ := e.r.Status(context.Background(), e.id)
			t.Logf("pids.current after the bomb: %s; sandbox %s %s", e.cgroupValue(t, "pids.current"), st.State, st.Message)
			if e.class == "runsc" && st.State == runtime.StateStopped {
				// The Sentry cannot create the host threads and stub
				// processes it needs beyond the limit and the whole
				// sandbox stops: contained, but not survivable.
				t.Logf("runsc: the sandbox was stopped as a whole by the pids limit")
			} else if limit, _ := strconv.Atoi(e.cgroupValue(t, "pids.max")); n < 0 || n >= limit ||
				!strings.Contains(res.Out, "BLOCKED fork-until-limit") {
				t.Errorf("forked %d processes with a pids limit of %d:\n%s", n, limit, res.Out)
			}
			// The host still forks.
			start := time.Now()
			if out, err := exec.Command("true").CombinedOutput(); err != nil {
				t.Errorf("host cannot fork during the bomb: %v %s", err, out)
			}
			t.Logf("sandbox forked %d; host fork+exec took %v", n, time.Since(start))
		},
		timeout: 10 * time.Second,
	},
	{
		name:         "memory-bomb",
		res:          &runtime.Resources{MemoryBytes: 64 << 20},
		noProbeLines: true,
		cmd:          func(*escEnv) string { return "/escprobe membomb 1024" },
		check: func(t *testing.T, e *escEnv, res agentResult, _ any) {
			if strings.Contains(res.Out, "ALLOWED membomb") || res.Code == 0 {
				t.Errorf("1 GiB allocated under a 64 MiB limit (code %d):\n%s", res.Code, res.Out)
			}
			failcnt := e.cgroupValue(t, "memory.failcnt")
			if n, _ := strconv.Atoi(failcnt); n == 0 {
				t.Errorf("memory.failcnt = %q: the limit was never hit", failcnt)
			}
			t.Logf("membomb: code %d err %q, last output %q", res.Code, res.Err, lastLine(res.Out))
			st, _ := e.r.Status(context.Background(), e.id)
			if e.class == "runsc" && st.State == runtime.StateStopped {
				// The application's memory is the Sentry's: the cgroup OOM
				// killer stops the sandbox as a whole. Contained, not
				// survivable.
				t.Logf("runsc: the sandbox was OOM-killed as a whole")
				return
			}
			// Only the bomb died: the sandbox's agent still serves.
			if err := runtimetest.PingAgent(context.Background(), e.r, e.id, 5*time.Second); err != nil {
				t.Errorf("sandbox agent gone after the OOM kill: %v", err)
			}
			if lim := e.cgroupValue(t, "memory.limit_in_bytes"); lim != strconv.Itoa(64<<20) {
				t.Errorf("memory limit = %s", lim)
			}
			// Under host memory pressure sandboxes are the OOM killer's
			// first choice.
			if adj := readTrim(t, fmt.Sprintf("/proc/%d/oom_score_adj", st.Pid)); adj != strconv.Itoa(sandboxOOMScoreAdj) {
				t.Errorf("oom_score_adj of the sandbox init = %s, want %d", adj, sandboxOOMScoreAdj)
			}
		},
		// runsc: the request hangs until this timeout (see check).
		timeout: 15 * time.Second,
	},
	{
		name:         "disk-fill",
		res:          &runtime.Resources{DiskBytes: escDisk},
		noProbeLines: true,
		cmd: func(*escEnv) string {
			return "dd if=/dev/zero of=/fill bs=1M count=256 2>&1; echo DD=$?; sync; ls -l /fill; " +
				"echo more > /more 2>&1 || echo FULL; rm /fill; echo fine > /after && cat /after"
		},
		before: func(t *testing.T, e *escEnv) any {
			var st unix.Statfs_t
			unix.Statfs(e.r.cfg.Root, &st)
			return int64(st.Bavail) * st.Bsize
		},
		check: func(t *testing.T, e *escEnv, res agentResult, before any) {
			if !strings.Contains(res.Out, "No space left") || strings.Contains(res.Out, "DD=0") {
				t.Errorf("dd of 256 MiB under a %d MiB quota did not hit ENOSPC:\n%s", escDisk>>20, res.Out)
			}
			if !strings.Contains(res.Out, "fine") {
				t.Errorf("sandbox unusable after the disk was freed:\n%s", res.Out)
			}
			// The host holds at most the quota for this sandbox.
			var st unix.Stat_t
			if err := unix.Stat(filepath.Join(e.r.sandboxDir(e.id), diskImage), &st); err != nil {
				t.Fatal(err)
			}
			if used := st.Blocks * 512; used > escDisk {
				t.Errorf("disk image uses %d bytes on the host, quota %d", used, escDisk)
			}
			var fs unix.Statfs_t
			unix.Statfs(e.r.cfg.Root, &fs)
			if drop := before.(int64) - int64(fs.Bavail)*fs.Bsize; drop > 2*escDisk {
				t.Errorf("host free space dropped by %d bytes during the fill (quota %d)", drop, escDisk)
			}
		},
	},
}

// escMarkerMemLimit is the memory.limit_in_bytes the probe's sysfs
// attack writes (markerMemLimit in testdata/escprobe): 1 PiB.
const escMarkerMemLimit = "1125899906842624"

// escDisk is the disk quota of the disk-fill attack.
const escDisk = 64 << 20

func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return lines[len(lines)-1]
}

// escPids is the pids limit of the shared sandbox.
const escPids = 256

// TestEscape is the escape suite: every attack of the table, on every
// installed runtime tier, must be refused, and the host must be
// unchanged. See docs/SECURITY.md for the results.
func TestEscape(t *testing.T) {
	testutil.RequiresRoot(t)
	for _, class := range availableClasses(t) {
		t.Run(class, func(t *testing.T) {
			env := newEnv(t, class, nil)
			env.images.layers[escImage] = []string{testutil.BusyboxRootfs(t), probeLayer(t)}
			r := env.open(t)
			ctx := context.Background()
			secret := fmt.Sprintf("moat-canary-%d", time.Now().UnixNano())
			canary := filepath.Join(t.TempDir(), "moat-escape-canary")
			if err := os.WriteFile(canary, []byte(secret), 0o644); err != nil {
				t.Fatal(err)
			}
			e := &escEnv{r: r, class: class, canary: canary, secret: secret, hostPid: os.Getpid()}
			e.id = escSandbox(t, ctx, r, runtime.Resources{PidsLimit: escPids})
			defer assertOneMountNamespace(t)
			for _, a := range attacks {
				t.Run(a.name, func(t *testing.T) {
					ae := *e
					lim := a.res
					if l, ok := a.resIn[class]; ok {
						lim = l
					}
					if lim != nil {
						ae.id = escSandbox(t, ctx, r, *lim)
					}
					var before any
					if a.before != nil {
						before = a.before(t, &ae)
					}
					timeout := a.timeout
					if timeout == 0 {
						timeout = 30 * time.Second
					}
					res := agentRun(t, ctx, r, ae.id, a.cmd(&ae), timeout)
					t.Logf("%s/%s (exit %d):\n%s", class, a.name, res.Code, res.Out)
					if !a.noProbeLines {
						allowed, blocked := probeLines(res.Out)
						if len(allowed)+len(blocked) == 0 || res.Code != 0 {
							t.Fatalf("probe did not run (exit %d, %s):\n%s", res.Code, res.Err, res.Out)
						}
						for _, l := range allowed {
							if !slices.Contains(a.harmless, stepName(l)) && !slices.Contains(a.harmlessIn[class], stepName(l)) {
								t.Errorf("ESCAPE: %s", l)
							}
						}
					}
					if a.check != nil {
						a.check(t, &ae, res, before)
					}
					// The host's own view is intact and the sandbox still serves.
					runtimetest.WaitAgent(t, ctx, r, e.id, 10*time.Second)
					if lim != nil {
						if err := r.Delete(ctx, ae.id); err != nil {
							t.Fatalf("Delete after %s: %v", a.name, err)
						}
						assertNoLeaks(t, r, ae.id)
					}
				})
			}
		})
	}
}

// assertOneMountNamespace checks that every thread of the test process is
// in the host mount namespace: a thread parked in runscStart's private
// namespace would pin copies of sandbox mounts and loop devices.
func assertOneMountNamespace(t *testing.T) {
	t.Helper()
	want, err := os.Readlink("/proc/thread-self/ns/mnt")
	if err != nil {
		t.Fatal(err)
	}
	tasks, _ := os.ReadDir("/proc/self/task")
	for _, task := range tasks {
		if got, err := os.Readlink("/proc/self/task/" + task.Name() + "/ns/mnt"); err == nil && got != want {
			t.Errorf("thread %s is in mount namespace %s, not the host's %s", task.Name(), got, want)
		}
	}
}

// escSandbox creates a sandbox of the probe image and waits for its agent.
func escSandbox(t *testing.T, ctx context.Context, r *Runtime, res runtime.Resources) string {
	t.Helper()
	id := runtimetest.NewID("esc")
	if _, err := r.Create(ctx, runtime.Spec{ID: id, Image: escImage, AgentToken: runtimetest.Token, Resources: res}); err != nil {
		t.Fatal(err)
	}
	runtimetest.WaitAgent(t, ctx, r, id, 20*time.Second)
	return id
}

// TestHostVolumes checks host volumes on every tier: a read-write bind
// is shared with the host, a read-only one refuses writes, and mounts
// beneath a host path stay hidden (the bind is not recursive).
func TestHostVolumes(t *testing.T) {
	testutil.RequiresRoot(t)
	for _, class := range availableClasses(t) {
		t.Run(class, func(t *testing.T) {
			r := newEnv(t, class, nil).open(t)
			ctx := context.Background()
			host := t.TempDir()
			rw, ro := filepath.Join(host, "rw"), filepath.Join(host, "ro")
			sub := filepath.Join(ro, "sub")
			for _, d := range []string{rw, sub} {
				if err := os.MkdirAll(d, 0o755); err != nil {
					t.Fatal(err)
				}
			}
			os.WriteFile(filepath.Join(ro, "hello"), []byte("from-host"), 0o644)
			if err := unix.Mount("tmpfs", sub, "tmpfs", 0, "size=1m"); err != nil {
				t.Fatal(err)
			}
			defer unix.Unmount(sub, unix.MNT_DETACH)
			os.WriteFile(filepath.Join(sub, "hidden"), []byte("submount"), 0o644)

			id := runtimetest.NewID("vol")
			_, err := r.Create(ctx, runtime.Spec{ID: id, Image: testImage, AgentToken: runtimetest.Token, Mounts: []runtime.Mount{
				{Source: rw, Destination: "/work/rw"},
				{Source: ro, Destination: "/work/ro", ReadOnly: true},
			}})
			if err != nil {
				t.Fatal(err)
			}
			runtimetest.WaitAgent(t, ctx, r, id, 20*time.Second)
			res := agentRun(t, ctx, r, id, "cat /work/ro/hello; echo; "+
				"echo x > /work/ro/new 2>&1 && echo RO-WRITABLE; "+
				"ls /work/ro/sub; cat /work/ro/sub/hidden 2>/dev/null && echo SUBMOUNT-VISIBLE; "+
				"echo from-sandbox > /work/rw/out && echo RW-OK", 20*time.Second)
			t.Logf("%s", res.Out)
			if !strings.Contains(res.Out, "from-host") {
				t.Errorf("read-only volume content not visible:\n%s", res.Out)
			}
			if strings.Contains(res.Out, "RO-WRITABLE") || exists(filepath.Join(ro, "new")) {
				t.Errorf("write to a read-only volume succeeded:\n%s", res.Out)
			}
			if strings.Contains(res.Out, "SUBMOUNT-VISIBLE") {
				t.Errorf("a mount beneath the host path is visible in the sandbox:\n%s", res.Out)
			}
			if data, _ := os.ReadFile(filepath.Join(rw, "out")); string(data) != "from-sandbox\n" || !strings.Contains(res.Out, "RW-OK") {
				t.Errorf("read-write volume: host sees %q:\n%s", data, res.Out)
			}
			if err := r.Delete(ctx, id); err != nil {
				t.Fatal(err)
			}
			assertNoLeaks(t, r, id)
			if data, _ := os.ReadFile(filepath.Join(ro, "hello")); string(data) != "from-host" {
				t.Errorf("host file changed after delete: %q", data)
			}
		})
	}
}

// TestDiskQuotaRollback checks that a create failing after the quota
// filesystem is mounted leaves no mount or loop device, and that a quota
// below the minimum is refused.
func TestDiskQuotaRollback(t *testing.T) {
	e := newEnv(t, "runc", map[string]string{"runc": "runc", "broken": "false"})
	r := e.open(t)
	ctx := context.Background()
	id := runtimetest.NewID("diskrb")
	_, err := r.Create(ctx, runtime.Spec{ID: id, Image: testImage, Class: "broken", Resources: runtime.Resources{DiskBytes: 32 << 20}})
	if !errors.Is(err, errdefs.ErrInternal) {
		t.Fatalf("Create with a failing runtime = %v", err)
	}
	assertNoLeaks(t, r, id)
	if _, err := r.Create(ctx, runtime.Spec{ID: id, Image: testImage, Resources: runtime.Resources{DiskBytes: 1 << 20}}); !errdefs.IsInvalidArgument(err) {
		t.Fatalf("Create with a 1 MiB quota = %v", err)
	}
	assertNoLeaks(t, r, id)
}

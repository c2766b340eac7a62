package oci

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"go.uber.org/goleak"
	"golang.org/x/sys/unix"

	"github.com/moat-sandbox/moat/internal/egress/egresstest"
	"github.com/moat-sandbox/moat/internal/errdefs"
	"github.com/moat-sandbox/moat/internal/image"
	"github.com/moat-sandbox/moat/internal/network"
	"github.com/moat-sandbox/moat/internal/runtime"
	"github.com/moat-sandbox/moat/internal/runtime/runtimetest"
	"github.com/moat-sandbox/moat/internal/testutil"
	"github.com/moat-sandbox/moat/internal/testutil/testnet"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.IgnoreTopFunction("os/signal.signal_recv"))
}

// testImage is the reference the fake image store serves.
const testImage = "local/busybox:test"

// fakeImages serves the busybox rootfs as a one-layer image.
type fakeImages struct{ layers map[string][]string }

func (f fakeImages) Pin(id string, layers []string) error { return nil }
func (f fakeImages) Unpin(id string)                      {}

func (f fakeImages) Rootfs(ctx context.Context, id, ref string) (Rootfs, error) {
	layers, ok := f.layers[ref]
	if !ok {
		return Rootfs{}, fmt.Errorf("image %q: %w", ref, errdefs.ErrNotFound)
	}
	return Rootfs{Layers: layers, Config: image.Config{
		Env:        []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin", "IMAGE_ENV=1"},
		Cmd:        []string{"sleep", "3600"},
		WorkingDir: "/workspace",
	}}, nil
}

// testEnv is one backend configuration with its own state, bridge and
// subnet, torn down (with a leak check) at the end of the test.
type testEnv struct {
	cfg    Config
	images fakeImages
	lease  *testnet.Net
}

func newEnv(t testing.TB, class string, classes map[string]string) *testEnv {
	t.Helper()
	testutil.RequiresRoot(t)
	dir := t.TempDir()
	n := testnet.New(t, testnet.Bits(24))
	n.Own(dir)
	e := &testEnv{
		lease: n,
		cfg: Config{
			Root:         filepath.Join(dir, "root"),
			RunRoot:      filepath.Join(dir, "run"),
			DefaultClass: class,
			Classes:      classes,
			AgentPath:    runtimetest.AgentBinary(t),
			Subreaper:    true,
			CgroupParent: n.CgroupParent,
			Network: network.Config{
				Bridge: n.Name,
				Subnet: n.Subnet,
			},
		},
		images: fakeImages{layers: map[string][]string{
			testImage:       {testutil.BusyboxRootfs(t)},
			"local/missing": {filepath.Join(dir, "no-such-layer")},
		}},
	}
	t.Cleanup(func() {
		if l, err := netlink.LinkByName(e.cfg.Network.Bridge); err == nil {
			netlink.LinkDel(l)
		}
		bins, _ := filepath.Glob(filepath.Join(e.cfg.RunRoot, "bin", "*"))
		for _, b := range bins {
			if err := unmountAll(b); err != nil {
				t.Error(err)
			}
		}
	})
	return e
}

// open starts a backend instance over the env's state.
func (e *testEnv) open(t testing.TB) *Runtime {
	t.Helper()
	r, err := New(context.Background(), e.cfg, Deps{Images: e.images})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx := context.Background()
		list, _ := r.List(ctx)
		for _, st := range list {
			if err := r.Delete(ctx, st.ID); err != nil {
				t.Errorf("cleanup: Delete(%s): %v", st.ID, err)
			}
		}
		r.Close()
	})
	return r
}

// availableClasses returns the runtime classes on PATH; one that
// testutil.RequireRuntimesEnv names and is missing fails t.
func availableClasses(t *testing.T) []string {
	var out []string
	for _, c := range []string{"runc", "crun", "runsc"} {
		if _, err := exec.LookPath(c); err == nil {
			out = append(out, c)
		} else if testutil.RuntimeRequired(c) {
			t.Fatalf("%s not installed and required by %s", c, testutil.RequireRuntimesEnv)
		}
	}
	return out
}

func TestConformance(t *testing.T) {
	testutil.RequiresRoot(t)
	for _, class := range availableClasses(t) {
		t.Run(class, func(t *testing.T) {
			envs := map[runtime.Runtime]*testEnv{}
			var mu sync.Mutex
			runtimetest.Run(t, func(t *testing.T) runtime.Runtime {
				e := newEnv(t, class, nil)
				r := e.open(t)
				mu.Lock()
				envs[r] = e
				mu.Unlock()
				return r
			}, runtimetest.Options{
				Image: testImage,
				Class: class,
				Reopen: func(t *testing.T, rt runtime.Runtime) runtime.Runtime {
					mu.Lock()
					e := envs[rt]
					mu.Unlock()
					return e.open(t)
				},
				Egress: func(t *testing.T, rt runtime.Runtime) runtimetest.EgressHarness {
					mu.Lock()
					e := envs[rt]
					mu.Unlock()
					netm := rt.(*Runtime).net.(*network.Manager)
					return egresstest.New(t, e.lease, egresstest.Network{Bridge: netm.Bridge(), Subnet: netm.Subnet(), Gateway: netm.Gateway(),
						NetnsPath: func(_ context.Context, id string) (string, error) { return netm.NetnsPath(id), nil }})
				},
			})
		})
	}
}

// assertNoLeaks checks that nothing of id is left on the host.
func assertNoLeaks(t *testing.T, r *Runtime, id string) {
	t.Helper()
	mi, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.SplitSeq(string(mi), "\n") {
		if strings.Contains(line, r.sandboxDir(id)+"/") || strings.Contains(line, filepath.Join(r.cfg.Network.NetnsDir, id)) {
			t.Errorf("mount left behind: %s", line)
		}
	}
	for _, p := range []string{
		r.sandboxDir(id),
		filepath.Join(r.cfg.Network.NetnsDir, id),
		filepath.Join(r.cfg.Network.StateDir, "attachments", id+".json"),
	} {
		if _, err := os.Stat(p); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s left behind (stat err %v)", p, err)
		}
	}
	for class := range r.classes {
		// runc and crun keep a directory <id>, runsc files <id>_sandbox:*.
		if left, _ := filepath.Glob(filepath.Join(r.stateRoot(class), id+"*")); len(left) > 0 {
			t.Errorf("%s state of %s left behind: %v", class, id, left)
		}
	}
	ips, _ := os.ReadDir(filepath.Join(r.cfg.Network.StateDir, "ips"))
	for _, e := range ips {
		data, _ := os.ReadFile(filepath.Join(r.cfg.Network.StateDir, "ips", e.Name()))
		if string(data) == id {
			t.Errorf("address %s still allocated", e.Name())
		}
	}
	if !testnet.LinkGone(network.HostVethName(id), 10*time.Second) {
		t.Errorf("veth of %s left behind", id)
	}
	if dirs := cgroupDirs(r.cgroupPath(id)); len(dirs) > 0 {
		t.Errorf("cgroups left behind: %v", dirs)
	}
	// Loop devices of a disk quota (see disk.go).
	backing, _ := filepath.Glob("/sys/block/loop*/loop/backing_file")
	for _, b := range backing {
		if data, err := os.ReadFile(b); err == nil && strings.HasPrefix(string(data), r.sandboxDir(id)+"/") {
			t.Errorf("loop device left behind: %s -> %s", b, strings.TrimSpace(string(data)))
		}
	}
}

func TestLimitsAndNoLeaks(t *testing.T) {
	for _, class := range availableClasses(t) {
		t.Run(class, func(t *testing.T) {
			r := newEnv(t, class, nil).open(t)
			ctx := context.Background()
			id := runtimetest.NewID("limits")
			_, err := r.Create(ctx, runtime.Spec{
				ID: id, Image: testImage, AgentToken: runtimetest.Token,
				Resources: runtime.Resources{CPUMillis: 500, MemoryBytes: 256 << 20, PidsLimit: 128},
			})
			if err != nil {
				t.Fatal(err)
			}
			runtimetest.WaitAgent(t, ctx, r, id, 10*time.Second)
			cg := r.cgroupPath(id)
			pids := "128"
			if r.kinds[class] == runscKind {
				pids = strconv.Itoa(128 + runscPidsHeadroom) // the Sentry's own threads
			}
			for file, want := range map[string]string{
				"cpu.cfs_quota_us":      "50000",
				"cpu.cfs_period_us":     "100000",
				"memory.limit_in_bytes": "268435456",
				"pids.max":              pids,
			} {
				if got := cgroupValue(t, cg, file); got != want {
					t.Errorf("%s (v1 name) = %s, want %s", file, got, want)
				}
			}
			// The bundle carries the security settings.
			var spec struct {
				Process struct {
					Args            []string `json:"args"`
					Env             []string `json:"env"`
					Cwd             string   `json:"cwd"`
					NoNewPrivileges bool     `json:"noNewPrivileges"`
				} `json:"process"`
			}
			data, _ := os.ReadFile(filepath.Join(r.sandboxDir(id), "bundle", "config.json"))
			if err := json.Unmarshal(data, &spec); err != nil {
				t.Fatal(err)
			}
			wantArgs := []string{"/.moat/moat-agent", "--config", "/.moat/agent.json", "--", "sleep", "3600"}
			if !slices.Equal(spec.Process.Args, wantArgs) || !spec.Process.NoNewPrivileges || spec.Process.Cwd != "/workspace" {
				t.Errorf("process = %+v", spec.Process)
			}
			if !slices.Contains(spec.Process.Env, "IMAGE_ENV=1") {
				t.Errorf("env %v lacks the image env", spec.Process.Env)
			}
			state, _ := os.ReadFile(filepath.Join(r.sandboxDir(id), "state.json"))
			if strings.Contains(string(state), runtimetest.Token) {
				t.Errorf("state.json contains the agent token")
			}

			if err := r.Delete(ctx, id); err != nil {
				t.Fatal(err)
			}
			assertNoLeaks(t, r, id)
		})
	}
}

func TestRollback(t *testing.T) {
	e := newEnv(t, "runc", map[string]string{"runc": "runc", "broken": "false"})
	r := e.open(t)
	ctx := context.Background()
	for i, tc := range []struct {
		name string
		spec runtime.Spec
		want error
	}{
		{"unknown image", runtime.Spec{Image: "local/nope"}, errdefs.ErrNotFound},
		{"missing layer dir", runtime.Spec{Image: "local/missing"}, errdefs.ErrFailedPrecondition},
		// Fails after the mount and the network are set up.
		{"runtime fails", runtime.Spec{Image: testImage, Class: "broken"}, errdefs.ErrInternal},
	} {
		id := runtimetest.NewID("rb")
		tc.spec.ID = id
		if _, err := r.Create(ctx, tc.spec); !errors.Is(err, tc.want) {
			t.Errorf("%d %s: Create = %v, want %v", i, tc.name, err, tc.want)
		}
		assertNoLeaks(t, r, id)
		if _, err := r.Status(ctx, id); !errdefs.IsNotFound(err) {
			t.Errorf("%d %s: Status after failed Create = %v", i, tc.name, err)
		}
	}
}

func TestRecoverHalfCreated(t *testing.T) {
	e := newEnv(t, "crun", nil)
	if _, err := exec.LookPath("crun"); err != nil {
		e.cfg.DefaultClass = "runc"
	}
	r := e.open(t)
	ctx := context.Background()
	live := runtimetest.NewID("live")
	half := runtimetest.NewID("half")
	for _, id := range []string{live, half} {
		if _, err := r.Create(ctx, runtime.Spec{ID: id, Image: testImage}); err != nil {
			t.Fatal(err)
		}
	}
	// Simulate a server killed in the middle of creating `half`.
	rec, err := r.readRecord(half)
	if err != nil {
		t.Fatal(err)
	}
	rec.Complete = false
	if err := r.writeRecord(half, rec); err != nil {
		t.Fatal(err)
	}
	// And a leftover directory without any record.
	bare := runtimetest.NewID("bare")
	os.MkdirAll(filepath.Join(r.sandboxDir(bare), "rootfs"), 0o700)

	r2 := e.open(t)
	assertNoLeaks(t, r2, half)
	assertNoLeaks(t, r2, bare)
	st, err := r2.Status(ctx, live)
	if err != nil || st.State != runtime.StateRunning {
		t.Fatalf("live sandbox after recovery: %+v, %v", st, err)
	}
	runtimetest.WaitAgent(t, ctx, r2, live, 10*time.Second)
	if err := r2.Delete(ctx, live); err != nil {
		t.Fatal(err)
	}
	assertNoLeaks(t, r2, live)
}

func TestExitCode(t *testing.T) {
	r := newEnv(t, "runc", nil).open(t)
	ctx := context.Background()
	id := runtimetest.NewID("exit")
	if _, err := r.Create(ctx, runtime.Spec{ID: id, Image: testImage}); err != nil {
		t.Fatal(err)
	}
	runtimetest.WaitAgent(t, ctx, r, id, 10*time.Second)
	if err := r.Stop(ctx, id, 0); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		st, err := r.Status(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		if st.State == runtime.StateStopped && st.ExitCode == 137 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("status %+v, want stopped with exit code 137", st)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func benchmarkCreate(b *testing.B, class string) {
	if _, err := exec.LookPath(class); err != nil {
		b.Skipf("%s not installed", class)
	}
	e := newEnv(b, class, nil)
	deps := Deps{Images: e.images}
	if os.Getenv("MOAT_BENCH_DEBUG") == "1" {
		deps.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	r, err := New(context.Background(), e.cfg, deps)
	if err != nil {
		b.Fatal(err)
	}
	defer r.Close()
	runtimetest.BenchmarkCreate(b, r, testImage)
}

// BenchmarkCreateRunc measures Create until the agent answers /ping.
func BenchmarkCreateRunc(b *testing.B) { benchmarkCreate(b, "runc") }

// BenchmarkCreateCrun measures Create until the agent answers /ping.
func BenchmarkCreateCrun(b *testing.B) { benchmarkCreate(b, "crun") }

// BenchmarkCreateRunsc measures Create until the agent answers /ping.
func BenchmarkCreateRunsc(b *testing.B) { benchmarkCreate(b, "runsc") }

// TestRunsc checks what is specific to the gVisor class: netstack (not
// the host network stack) serves the sandbox, the /proc/sys/net/core
// mask of runscStart stays out of the host's view, and a paused sandbox
// is deleted without leftovers (runsc state files included).
func TestRunsc(t *testing.T) {
	testutil.LookRuntime(t, "runsc")
	r := newEnv(t, "runsc", nil).open(t)
	if r.kinds["runsc"] != runscKind {
		t.Fatalf("kind of class runsc = %q", r.kinds["runsc"])
	}
	ctx := context.Background()
	id := runtimetest.NewID("gvisor")
	if _, err := r.Create(ctx, runtime.Spec{ID: id, Image: testImage, AgentToken: runtimetest.Token}); err != nil {
		t.Fatal(err)
	}
	runtimetest.WaitAgent(t, ctx, r, id, 10*time.Second)

	// netstack takes the address off the veth inside the namespace; with
	// the host stack (--network=host) it would still be there.
	ns, err := netns.GetFromPath(filepath.Join(r.cfg.Network.NetnsDir, id))
	if err != nil {
		t.Fatal(err)
	}
	h, err := netlink.NewHandleAt(ns)
	ns.Close()
	if err != nil {
		t.Fatal(err)
	}
	links, err := h.LinkList()
	if err != nil {
		h.Close()
		t.Fatal(err)
	}
	for _, l := range links {
		addrs, _ := h.AddrList(l, netlink.FAMILY_V4)
		for _, a := range addrs {
			if !a.IP.IsLoopback() {
				t.Errorf("address %s still on %s in the sandbox netns: netstack is not in use", a.IPNet, l.Attrs().Name)
			}
		}
	}
	h.Close()
	if _, err := os.Stat("/proc/sys/net/core/rmem_default"); err != nil {
		t.Errorf("host view of /proc/sys/net/core changed: %v", err)
	}

	// The runsc helpers we adopt as a subreaper when the sandbox dies.
	st, err := r.Status(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	helpers := append(descendants(st.Pid), runscGoferPid(r.stateRoot("runsc"), id))
	if len(helpers) < 2 {
		t.Fatalf("runsc helpers of %d = %v, want the gofer and ptrace stubs", st.Pid, helpers)
	}

	if err := r.Pause(ctx, id); err != nil {
		t.Fatal(err)
	}
	runtimetest.WaitState(t, ctx, r, id, runtime.StatePaused, 5*time.Second)
	if err := r.Delete(ctx, id); err != nil {
		t.Fatal(err)
	}
	assertNoLeaks(t, r, id)
	// They must be reaped, not left as zombies.
	deadline := time.Now().Add(3 * time.Second)
	for {
		var left []int
		for _, pid := range helpers {
			if ps, ok := readProcStat(pid); ok && ps.state == 'Z' && ps.ppid == os.Getpid() {
				left = append(left, pid)
			}
		}
		if len(left) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("zombie runsc helpers left: %v", left)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestListDuringCreate: a create that completes while List runs must not
// make List report its sandbox as stopped. List used to ask runc before
// reading the records, so a create finishing in between looked "stopped"
// and the liveness check deleted the live sandbox (the chaos test's
// "agent exited (code 0)"). The hook lets the create finish right after
// List asked runc.
func TestListDuringCreate(t *testing.T) {
	r := newEnv(t, "runc", nil).open(t)
	ctx := context.Background()
	first := runtimetest.NewID("listrace")
	if _, err := r.Create(ctx, runtime.Spec{ID: first, Image: testImage, AgentToken: runtimetest.Token}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Delete(ctx, first) })
	id := runtimetest.NewID("listrace")
	created := make(chan error, 1)
	go func() {
		_, err := r.Create(ctx, runtime.Spec{ID: id, Image: testImage, AgentToken: runtimetest.Token})
		created <- err
	}()
	t.Cleanup(func() { r.Delete(ctx, id) })
	// Wait until the create has written its (incomplete) record.
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(time.Millisecond) {
		if _, err := r.readRecord(id); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the create wrote no record")
		}
	}
	var createErr error
	r.afterRuncList = func() { createErr = <-created }
	sts, err := r.List(ctx)
	r.afterRuncList = nil
	if err != nil || createErr != nil {
		t.Fatalf("List: %v; Create: %v", err, createErr)
	}
	for _, st := range sts {
		if st.ID == id && st.State != runtime.StateCreating && st.State != runtime.StateRunning {
			t.Fatalf("List reports %s, whose create completed during the List, as %s (%s)", id, st.State, st.Message)
		}
		if st.ID == first && st.State != runtime.StateRunning {
			t.Fatalf("List reports %s as %s", first, st.State)
		}
	}
	if st, err := r.Status(ctx, id); err != nil || st.State != runtime.StateRunning {
		t.Fatalf("Status after the create: %+v %v", st, err)
	}
}

// TestReapsInheritedOrphans: the server, as subreaper, reaps every orphan
// it inherits, not only the sandbox inits it tracks: a grandchild whose
// parent exited becomes its child and, once dead, must not stay a zombie.
func TestReapsInheritedOrphans(t *testing.T) {
	newEnv(t, "runc", nil).open(t) // the test process is now the subreaper
	out, err := exec.Command("sh", "-c", "sleep 0.3 >/dev/null 2>&1 & echo $!").Output()
	if err != nil {
		t.Fatal(err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(out)))
	if err != nil {
		t.Fatalf("orphan pid %q", out)
	}
	if st, ok := readProcStat(pid); !ok || st.ppid != os.Getpid() {
		t.Fatalf("the orphan %d was not inherited by the subreaper (%+v, %v)", pid, st, ok)
	}
	deadline := time.Now().Add(30 * time.Second)
	var st procStat
	for {
		var ok bool
		if st, ok = readProcStat(pid); !ok || st.ppid != os.Getpid() {
			break // reaped (or the pid is another process's now)
		}
		if time.Now().After(deadline) {
			first := firstZombieChild()
			fst, _ := readProcStat(first)
			var ws unix.WaitStatus
			got, werr := unix.Wait4(first, &ws, unix.WNOHANG, nil)
			t.Fatalf("orphan %d still %c as the subreaper's child after 30 s (self %d; first zombie child: %d %+v %q; wait4: %d %v)", pid, st.state, os.Getpid(), first, fst, procComm(first), got, werr)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

package docker

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/moby/moby/client"
	"go.uber.org/goleak"

	"github.com/moat-sandbox/moat/internal/agentproto"
	"github.com/moat-sandbox/moat/internal/egress/egresstest"
	"github.com/moat-sandbox/moat/internal/errdefs"
	"github.com/moat-sandbox/moat/internal/image"
	"github.com/moat-sandbox/moat/internal/runtime"
	"github.com/moat-sandbox/moat/internal/runtime/runtimetest"
	"github.com/moat-sandbox/moat/internal/testutil"
	"github.com/moat-sandbox/moat/internal/testutil/localregistry"
	"github.com/moat-sandbox/moat/internal/testutil/testnet"
)

func TestMain(m *testing.M) {
	code := m.Run()
	testutil.RemoveBuilt()
	if code == 0 {
		if err := goleak.Find(goleak.IgnoreTopFunction("os/signal.signal_recv")); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.Exit(code)
}

var (
	setupOnce sync.Once
	setupErr  error
)

// requireDocker makes the daemon usable (scripts/docker-setup.sh) and
// fails the test if it cannot: the docker backend is never skipped.
func requireDocker(t testing.TB) {
	t.Helper()
	testutil.RequiresRoot(t)
	setupOnce.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, "bash", filepath.Join(testutil.RepoRoot(t), "scripts", "docker-setup.sh"))
		if out, err := cmd.CombinedOutput(); err != nil {
			setupErr = fmt.Errorf("scripts/docker-setup.sh: %v\n%s", err, out)
		}
	})
	if setupErr != nil {
		t.Fatalf("docker is not usable: %v", setupErr)
	}
}

// importBusybox loads testutil.BusyboxRootfs into the daemon (`docker
// import`) under a fresh name, removed when the test ends.
func importBusybox(t testing.TB) string {
	t.Helper()
	requireDocker(t)
	ctx := context.Background()
	cli, err := client.New(client.WithHost(DefaultHost))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	ref := fmt.Sprintf("moat-test/busybox:%08x", rand.Uint32())
	pr, pw := io.Pipe()
	go func() {
		data, err := localregistry.TarDir(testutil.BusyboxRootfs(t))
		if err == nil {
			_, err = pw.Write(data)
		}
		pw.CloseWithError(err)
	}()
	res, err := cli.ImageImport(ctx, client.ImageImportSource{Source: pr, SourceName: "-"}, ref, client.ImageImportOptions{
		Changes: []string{
			`CMD ["sleep", "3600"]`,
			`ENV PATH=/usr/sbin:/usr/bin:/sbin:/bin IMAGE_ENV=1`,
			`WORKDIR /workspace`,
		},
	})
	if err != nil {
		pr.CloseWithError(err)
		t.Fatalf("docker import: %v", err)
	}
	_, err = io.Copy(io.Discard, res)
	res.Close()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if _, err := cli.ImageRemove(context.Background(), ref, client.ImageRemoveOptions{Force: true, PruneChildren: true}); err != nil {
			t.Errorf("remove image %s: %v", ref, err)
		}
	})
	return ref
}

// testEnv is one backend configuration with its own network, scope and
// state directory, torn down (with a leak check) at the end of the test.
type testEnv struct {
	cfg   Config
	image string
	lease *testnet.Net
}

// newEnv makes an env; img "" imports a fresh busybox image for it.
func newEnv(t testing.TB, img string) *testEnv {
	t.Helper()
	requireDocker(t)
	if img == "" {
		img = importBusybox(t)
	}
	// The lease gives a subnet no host route overlaps; its cleanup
	// reports (and removes) the network's bridge and its tables should
	// the test leave them.
	n := testnet.New(t, testnet.Bits(24))
	n.OwnLink(BridgeName(n.Name))
	e := &testEnv{
		lease: n,
		image: img,
		cfg: Config{
			Network:   n.Name,
			Subnet:    n.Subnet.String(),
			AgentPath: runtimetest.AgentBinary(t),
			StateDir:  t.TempDir(),
			Scope:     fmt.Sprintf("test-%08x", rand.Uint32()),
		},
	}
	t.Cleanup(func() {
		ctx := context.Background()
		cli, err := client.New(client.WithHost(DefaultHost))
		if err != nil {
			t.Error(err)
			return
		}
		defer cli.Close()
		f := make(client.Filters).Add("label", LabelScope+"="+e.cfg.Scope)
		if res, err := cli.ContainerList(ctx, client.ContainerListOptions{All: true, Filters: f}); err != nil {
			t.Error(err)
		} else if len(res.Items) > 0 {
			t.Errorf("%d containers left behind", len(res.Items))
			for _, c := range res.Items {
				cli.ContainerRemove(ctx, c.ID, client.ContainerRemoveOptions{Force: true})
			}
		}
		if _, err := cli.NetworkRemove(ctx, e.cfg.Network, client.NetworkRemoveOptions{}); err != nil && !strings.Contains(err.Error(), "not found") {
			t.Errorf("remove network: %v", err)
		}
	})
	return e
}

// open starts a backend instance over the env's state.
func (e *testEnv) open(t testing.TB) *Runtime {
	t.Helper()
	r, err := New(context.Background(), e.cfg, Deps{})
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

func TestConformance(t *testing.T) {
	envs := map[runtime.Runtime]*testEnv{}
	var mu sync.Mutex
	img := importBusybox(t)
	runtimetest.Run(t, func(t *testing.T) runtime.Runtime {
		e := newEnv(t, img)
		r := e.open(t)
		mu.Lock()
		envs[r] = e
		mu.Unlock()
		return r
	}, runtimetest.Options{
		Image: img,
		Class: Class,
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
			r := rt.(*Runtime)
			return egresstest.New(t, e.lease, egresstest.Network{Bridge: r.Bridge(), Subnet: r.Subnet(), Gateway: r.Gateway(), NetnsPath: r.NetnsPath})
		},
		// Docker's storage drivers give no disk quota on most filesystems.
		NoDiskQuota: true,
	})
}

// assertNoLeaks checks that nothing of id is left: no container, no
// agent.json.
func assertNoLeaks(t *testing.T, r *Runtime, id string) {
	t.Helper()
	ctx := context.Background()
	if _, err := r.cli.ContainerInspect(ctx, containerName(id), client.ContainerInspectOptions{}); err == nil {
		t.Errorf("container %s left behind", containerName(id))
	}
	f := make(client.Filters).Add("label", LabelSandbox+"="+id)
	if res, err := r.cli.ContainerList(ctx, client.ContainerListOptions{All: true, Filters: f}); err != nil || len(res.Items) != 0 {
		t.Errorf("containers labelled %s: %v (err %v)", id, res.Items, err)
	}
	if _, err := os.Stat(r.agentConfPath(id)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("agent.json of %s left behind (stat err %v)", id, err)
	}
	if entries, _ := os.ReadDir(r.cfg.StateDir); len(entries) > 0 {
		for _, e := range entries {
			if strings.HasPrefix(e.Name(), id) {
				t.Errorf("state file %s left behind", e.Name())
			}
		}
	}
}

func TestLimitsAndNoLeaks(t *testing.T) {
	e := newEnv(t, "")
	r := e.open(t)
	ctx := context.Background()
	id := runtimetest.NewID("limits")
	_, err := r.Create(ctx, runtime.Spec{
		ID: id, Image: e.image, AgentToken: runtimetest.Token,
		Env:       map[string]string{"FOO": "bar"},
		Resources: runtime.Resources{CPUMillis: 500, MemoryBytes: 256 << 20, PidsLimit: 128},
	})
	if err != nil {
		t.Fatal(err)
	}
	runtimetest.WaitAgent(t, ctx, r, id, 10*time.Second)
	res, err := r.cli.ContainerInspect(ctx, containerName(id), client.ContainerInspectOptions{})
	if err != nil {
		t.Fatal(err)
	}
	c, hc := res.Container, res.Container.HostConfig
	if hc.NanoCPUs != 500_000_000 || hc.Memory != 256<<20 || hc.PidsLimit == nil || *hc.PidsLimit != 128 {
		t.Errorf("limits: NanoCPUs %d, Memory %d, PidsLimit %v", hc.NanoCPUs, hc.Memory, hc.PidsLimit)
	}
	if !slices.Equal(hc.CapDrop, []string{"ALL"}) {
		t.Errorf("CapDrop = %v", hc.CapDrop)
	}
	if got := slices.Sorted(slices.Values(hc.CapAdd)); !slices.Equal(got, slices.Sorted(slices.Values(keepCaps))) {
		t.Errorf("CapAdd = %v, want %v", got, keepCaps)
	}
	if !slices.Contains(hc.SecurityOpt, "no-new-privileges") || hc.Init == nil || *hc.Init {
		t.Errorf("SecurityOpt %v, Init %v", hc.SecurityOpt, hc.Init)
	}
	wantArgs := []string{"--config", "/.moat/agent.json", "--", "sleep", "3600"}
	if c.Path != agentproto.BinPath || !slices.Equal(c.Args, wantArgs) {
		t.Errorf("process = %s %v", c.Path, c.Args)
	}
	if !slices.Contains(c.Config.Env, "IMAGE_ENV=1") || !slices.Contains(c.Config.Env, "FOO=bar") {
		t.Errorf("env %v lacks the image or spec env", c.Config.Env)
	}
	if c.Config.WorkingDir != "/workspace" {
		t.Errorf("working dir %q", c.Config.WorkingDir)
	}
	ro := map[string]bool{}
	for _, m := range c.Mounts {
		ro[m.Destination] = !m.RW
	}
	if !ro[agentproto.BinPath] || !ro[agentproto.ConfigPath] {
		t.Errorf("agent mounts not read-only: %+v", c.Mounts)
	}
	if strings.Contains(string(res.Raw), runtimetest.Token) {
		t.Error("container config contains the agent token")
	}
	// The kernel sees the limits (cgroup v1, cgroupfs driver).
	for file, want := range map[string]string{
		"cpu/docker/" + c.ID + "/cpu.cfs_quota_us":         "50000",
		"memory/docker/" + c.ID + "/memory.limit_in_bytes": "268435456",
		"pids/docker/" + c.ID + "/pids.max":                "128",
	} {
		data, err := os.ReadFile("/sys/fs/cgroup/" + file)
		if err != nil {
			t.Errorf("read %s: %v", file, err)
			continue
		}
		if got := strings.TrimSpace(string(data)); got != want {
			t.Errorf("%s = %s, want %s", file, got, want)
		}
	}
	// The network is internal: the sandbox has no route off the bridge.
	n, err := r.cli.NetworkInspect(ctx, e.cfg.Network, client.NetworkInspectOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if !n.Network.Internal {
		t.Error("network is not internal")
	}
	if err := r.Delete(ctx, id); err != nil {
		t.Fatal(err)
	}
	assertNoLeaks(t, r, id)
}

func TestReadoptPaused(t *testing.T) {
	e := newEnv(t, "")
	r := e.open(t)
	ctx := context.Background()
	id := runtimetest.NewID("adopt")
	created, err := r.Create(ctx, runtime.Spec{ID: id, Image: e.image, AgentToken: runtimetest.Token,
		Labels: map[string]string{"owner": "me", "a/b": "c=d"}})
	if err != nil {
		t.Fatal(err)
	}
	runtimetest.WaitAgent(t, ctx, r, id, 10*time.Second)
	if err := r.Pause(ctx, id); err != nil {
		t.Fatal(err)
	}
	r.Close()

	r2 := e.open(t)
	list, err := r2.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(list) != 1 {
		t.Fatalf("List = %+v, want one sandbox", list)
	}
	st := list[0]
	if st.ID != id || st.State != runtime.StatePaused || st.IP != created.IP || st.Class != Class ||
		!st.CreatedAt.Equal(created.CreatedAt) || st.Labels["owner"] != "me" || st.Labels["a/b"] != "c=d" || st.Pid == 0 {
		t.Errorf("re-adopted %+v, created %+v", st, created)
	}
	if err := r2.Resume(ctx, id); err != nil {
		t.Fatal(err)
	}
	runtimetest.WaitAgent(t, ctx, r2, id, 10*time.Second)
	// A paused sandbox stops promptly too.
	if err := r2.Pause(ctx, id); err != nil {
		t.Fatal(err)
	}
	if err := r2.Stop(ctx, id, time.Second); err != nil {
		t.Fatal(err)
	}
	if st, err := r2.Status(ctx, id); err != nil || st.State != runtime.StateStopped {
		t.Errorf("after Stop of paused: %+v, %v", st, err)
	}
	if err := r2.Delete(ctx, id); err != nil {
		t.Fatal(err)
	}
	assertNoLeaks(t, r2, id)
}

func TestExitCode(t *testing.T) {
	e := newEnv(t, "")
	r := e.open(t)
	ctx := context.Background()
	id := runtimetest.NewID("exit")
	if _, err := r.Create(ctx, runtime.Spec{ID: id, Image: e.image}); err != nil {
		t.Fatal(err)
	}
	runtimetest.WaitAgent(t, ctx, r, id, 10*time.Second)
	if err := r.Stop(ctx, id, 0); err != nil {
		t.Fatal(err)
	}
	st, err := r.Status(ctx, id)
	if err != nil || st.State != runtime.StateStopped || st.ExitCode != 137 {
		t.Errorf("status %+v (%v), want stopped with exit code 137", st, err)
	}
	if _, err := r.Endpoint(ctx, id, agentproto.Port); !errdefs.IsFailedPrecondition(err) {
		t.Errorf("Endpoint of stopped = %v, want ErrFailedPrecondition", err)
	}
}

func TestRollback(t *testing.T) {
	e := newEnv(t, "")
	broken := e.cfg
	broken.Runtime = "no-such-runtime"
	rb, err := New(context.Background(), broken, Deps{})
	if err != nil {
		t.Fatal(err)
	}
	defer rb.Close()
	r := e.open(t)
	ctx := context.Background()
	for i, tc := range []struct {
		name string
		rt   *Runtime
		spec runtime.Spec
		want error
	}{
		{"unknown image", r, runtime.Spec{Image: "moat-test/no-such-image:latest"}, errdefs.ErrNotFound},
		{"daemon rejects runtime", rb, runtime.Spec{Image: e.image}, errdefs.ErrInvalidArgument},
		// Fails at start, after the container has been created.
		{"start fails", r, runtime.Spec{Image: e.image, WorkingDir: "/bin/busybox"}, nil},
	} {
		id := runtimetest.NewID("rb")
		tc.spec.ID = id
		if _, err := tc.rt.Create(ctx, tc.spec); err == nil || tc.want != nil && !errors.Is(err, tc.want) {
			t.Errorf("%d %s: Create = %v, want %v", i, tc.name, err, tc.want)
		}
		assertNoLeaks(t, r, id)
		if _, err := r.Status(ctx, id); !errdefs.IsNotFound(err) {
			t.Errorf("%d %s: Status after failed Create = %v", i, tc.name, err)
		}
	}
}

func TestScopes(t *testing.T) {
	e := newEnv(t, "")
	r := e.open(t)
	other := e.cfg
	other.Scope += "-other"
	r2, err := New(context.Background(), other, Deps{})
	if err != nil {
		t.Fatal(err)
	}
	defer r2.Close()
	ctx := context.Background()
	id := runtimetest.NewID("scope")
	if _, err := r.Create(ctx, runtime.Spec{ID: id, Image: e.image}); err != nil {
		t.Fatal(err)
	}
	if list, err := r2.List(ctx); err != nil || len(list) != 0 {
		t.Errorf("other scope lists %v (%v)", list, err)
	}
	if _, err := r2.Status(ctx, id); !errdefs.IsNotFound(err) {
		t.Errorf("other scope Status = %v", err)
	}
	if err := r2.Delete(ctx, id); err != nil {
		t.Fatal(err)
	}
	if st, err := r.Status(ctx, id); err != nil || st.State != runtime.StateRunning {
		t.Errorf("Delete from another scope touched the sandbox: %+v, %v", st, err)
	}
}

func TestEnsureImage(t *testing.T) {
	e := newEnv(t, "")
	r := e.open(t)
	ctx := context.Background()
	img, err := r.EnsureImage(ctx, e.image, nil)
	if err != nil {
		t.Fatal(err)
	}
	if img.Name != e.image || !strings.HasPrefix(img.ID, "sha256:") || len(img.Layers) != 1 ||
		!slices.Equal(img.Config.Cmd, []string{"sleep", "3600"}) || img.Config.WorkingDir != "/workspace" ||
		!slices.Contains(img.Config.Env, "IMAGE_ENV=1") {
		t.Errorf("EnsureImage = %+v", img)
	}
	// A pull from a registry that is not there (loopback, closed port).
	_, err = r.EnsureImage(ctx, "127.0.0.1:1/moat/nothing:latest", &image.Auth{Username: "u", Password: "p"})
	if !errors.Is(err, errdefs.ErrUnavailable) {
		t.Errorf("EnsureImage of an unreachable registry = %v, want ErrUnavailable", err)
	}
	if _, err := r.EnsureImage(ctx, "Not A Reference", nil); !errdefs.IsInvalidArgument(err) {
		t.Errorf("EnsureImage(bad ref) = %v, want ErrInvalidArgument", err)
	}
}

// TestContainment checks that a sandbox cannot open connections to the
// host (the rule of scripts/docker-setup.sh), while the host reaches it.
func TestContainment(t *testing.T) {
	e := newEnv(t, "")
	r := e.open(t)
	ctx := context.Background()
	n, err := r.cli.NetworkInspect(ctx, e.cfg.Network, client.NetworkInspectOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got := n.Network.Options[optBridgeName]; got != BridgeName(e.cfg.Network) {
		t.Fatalf("bridge name %q, want %q", got, BridgeName(e.cfg.Network))
	}
	// The host's address on the bridge, i.e. the sandboxes' gateway.
	br, err := net.InterfaceByName(BridgeName(e.cfg.Network))
	if err != nil {
		t.Fatal(err)
	}
	addrs, err := br.Addrs()
	if err != nil || len(addrs) == 0 {
		t.Fatalf("bridge addresses: %v, %v", addrs, err)
	}
	gw := addrs[0].(*net.IPNet).IP.String()
	l, err := net.Listen("tcp4", net.JoinHostPort(gw, "0"))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	accepted := make(chan struct{}, 1)
	go func() {
		if c, err := l.Accept(); err == nil {
			c.Close()
			accepted <- struct{}{}
		}
	}()
	id := runtimetest.NewID("contain")
	_, port, _ := net.SplitHostPort(l.Addr().String())
	if _, err := r.Create(ctx, runtime.Spec{ID: id, Image: e.image, AgentToken: runtimetest.Token,
		Entrypoint: []string{"sh", "-c", "while :; do echo x | nc -w 1 " + gw + " " + port + "; sleep 0.2; done"}}); err != nil {
		t.Fatal(err)
	}
	runtimetest.WaitAgent(t, ctx, r, id, 10*time.Second)
	select {
	case <-accepted:
		t.Error("the sandbox connected to the host")
	case <-time.After(3 * time.Second):
	}
}

func TestNewUnavailable(t *testing.T) {
	dir := t.TempDir()
	_, err := New(context.Background(), Config{
		Host: "unix://" + filepath.Join(dir, "no.sock"), StateDir: dir, AgentPath: runtimetest.AgentBinary(t),
	}, Deps{})
	if !errors.Is(err, errdefs.ErrUnavailable) && !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Errorf("New with no daemon = %v, want ErrUnavailable", err)
	}
}

// BenchmarkCreateDocker measures Create until the agent answers /ping.
func BenchmarkCreateDocker(b *testing.B) {
	e := newEnv(b, "")
	deps := Deps{}
	if os.Getenv("MOAT_BENCH_DEBUG") == "1" {
		deps.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	r, err := New(context.Background(), e.cfg, deps)
	if err != nil {
		b.Fatal(err)
	}
	defer r.Close()
	runtimetest.BenchmarkCreate(b, r, e.image)
}

// TestDualStack: with Subnet6 the network is dual-stack and a sandbox has
// a global IPv6 address from it, reachable from the host.
func TestDualStack(t *testing.T) {
	e := newEnv(t, "")
	e.cfg.Subnet6 = e.lease.Subnet6.String()
	r := e.open(t)
	if r.Subnet6() != e.lease.Subnet6 || !r.Gateway6().IsValid() {
		t.Fatalf("network IPv6 %s gateway %s, want %s", r.Subnet6(), r.Gateway6(), e.lease.Subnet6)
	}
	// Before any container (the bridge has no carrier): the gateway
	// address is usable at once (the server's credential proxy listens
	// on it), and the bridge takes no router advertisements or redirects.
	ln, err := net.Listen("tcp", net.JoinHostPort(r.Gateway6().String(), "0"))
	if err != nil {
		br, _ := exec.Command("ip", "-6", "addr", "show", "dev", r.Bridge()).CombinedOutput()
		t.Fatalf("listen on the IPv6 gateway of a portless bridge: %v\n%s", err, br)
	}
	ln.Close()
	for _, k := range []string{"accept_ra", "accept_redirects"} {
		if b, err := os.ReadFile("/proc/sys/net/ipv6/conf/" + r.Bridge() + "/" + k); err != nil || strings.TrimSpace(string(b)) != "0" {
			t.Errorf("bridge %s: %s=%q (%v), want 0", r.Bridge(), k, b, err)
		}
	}
	// A second backend instance over the network (a server restart) finds
	// it ready as it is.
	e.open(t)
	ctx := context.Background()
	id := runtimetest.NewID("dual")
	if _, err := r.Create(ctx, runtime.Spec{ID: id, Image: e.image, AgentToken: runtimetest.Token}); err != nil {
		t.Fatal(err)
	}
	runtimetest.WaitAgent(t, ctx, r, id, 20*time.Second)
	ip6 := r.IP6(ctx, id)
	if !e.lease.Subnet6.Contains(ip6) {
		t.Fatalf("sandbox IPv6 %s not in %s", ip6, e.lease.Subnet6)
	}
	out, code, err := runtimetest.Exec(ctx, r, id, "ip -6 addr show dev eth0 scope global")
	if err != nil || code != 0 || !strings.Contains(out, ip6.String()) {
		t.Fatalf("eth0 IPv6: exit %d %v: %q", code, err, out)
	}
	c, err := net.DialTimeout("tcp", net.JoinHostPort(ip6.String(), "44772"), 5*time.Second)
	if err != nil {
		br, _ := exec.Command("ip", "-6", "addr", "show", "dev", r.Bridge()).CombinedOutput()
		nb, _ := exec.Command("ip", "-6", "neigh").CombinedOutput()
		sb, _, _ := runtimetest.Exec(ctx, r, id, "ip -6 addr; ip -6 route; cat /proc/sys/net/ipv6/conf/eth0/disable_ipv6")
		t.Fatalf("host -> sandbox over IPv6: %v\nbridge: %s\nneigh: %s\nsandbox: %s", err, br, nb, sb)
	}
	c.Close()
}

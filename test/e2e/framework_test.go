package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/moat-sandbox/moat/internal/egress/nettest"
	"github.com/moat-sandbox/moat/internal/egress/nft"
	"github.com/moat-sandbox/moat/internal/network"
	"github.com/moat-sandbox/moat/internal/runtime/docker"
	moatserver "github.com/moat-sandbox/moat/internal/server"
	"github.com/moat-sandbox/moat/internal/testutil"
	"github.com/moat-sandbox/moat/internal/testutil/localregistry"
	"github.com/moat-sandbox/moat/internal/testutil/testnet"
)

// startRegistry serves an in-process OCI registry on loopback holding a
// busybox image built from the host's busybox-static, and returns its
// reference.
func startRegistry(t *testing.T) string {
	t.Helper()
	reg, err := localregistry.Start()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { reg.Close() })
	ref, err := reg.PushDir(context.Background(), testutil.BusyboxRootfs(t), "e2e/busybox:1",
		[]string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin", "FROM_IMAGE=yes"})
	if err != nil {
		t.Fatal(err)
	}
	return ref
}

// server is one `moat serve` process under test.
type server struct {
	t       *testing.T
	bin     string
	root    string
	runRoot string
	addr    string
	key     string
	// net is the test network leased for the server: its bridge name,
	// IPv4 subnet, IPv6 prefix (passed with --subnet6 by the tests that
	// want dual-stack sandboxes) and outside-link addresses.
	net    *testnet.Net
	bridge string
	// cgroupParent is passed as --cgroup-parent (the lease's, so its
	// cleanup sweeps the sandboxes' cgroups); "" omits the flag.
	cgroupParent string
	cmd          *exec.Cmd
	exited       chan struct{} // closed when cmd has exited (and been waited for)
	// afterStop run at cleanup once the server has stopped (e.g. removing
	// what a server keeps on purpose outside the lease's names).
	afterStop []func()
	docker    bool     // prepareDocker has run
	lastArgs  []string // the extra arguments of the last start
	started   bool     // start has succeeded once: s.addr is known to clients
	logf      *os.File
	check     serverCheck // see servercheck_test.go
}

func freePort(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// newServer prepares (but does not start) a server with its own state
// dirs and a leased test network (bridge, subnet; see package testnet), so
// it cannot disturb a moat or another test on the same host. Everything
// the server made is removed at cleanup, even after a crash of the test.
func newServer(t *testing.T) *server {
	t.Helper()
	testutil.RequiresRoot(t)
	// TempDir before the lease: cleanups run last-in first-out, so the
	// lease's sweep unmounts what a killed server left under dir before
	// TempDir's removal.
	dir := t.TempDir()
	n := testnet.New(t)
	n.Own(dir)
	s := &server{t: t, bin: testutil.MoatBinary(t), root: filepath.Join(dir, "root"), runRoot: filepath.Join(dir, "run"),
		addr: freePort(t), key: "e2e-key-0123456789", net: n, bridge: n.Name, cgroupParent: n.CgroupParent}
	lf, err := os.Create(filepath.Join(dir, "server.log"))
	if err != nil {
		t.Fatal(err)
	}
	s.logf = lf
	// Sandbox IPs are reused across tests: a keep-alive connection to a
	// sandbox of an earlier test must never be reused for a new one.
	dropIdleConns(t)
	t.Cleanup(func() {
		s.deleteAll()
		s.stop()
		for _, f := range s.afterStop {
			f()
		}
		s.verify()
		lf.Close()
		if t.Failed() {
			b, _ := os.ReadFile(lf.Name())
			t.Logf("server log:\n%s", tail(string(b), 6000))
		}
	})
	return s
}

func tail(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}

func (s *server) start(extra ...string) {
	s.t.Helper()
	for attempt := 1; ; attempt++ {
		err := s.tryStart(extra...)
		if err == nil {
			s.started = true
			return
		}
		// freePort's port is free only when it is picked: on a busy host
		// another process may bind it before the server does. Until the
		// server first runs nothing knows its address, so it gets another.
		if !s.started && attempt < 3 && s.lostPort() {
			s.t.Logf("%s was taken before the server bound it: another port", s.addr)
			s.addr = freePort(s.t)
			continue
		}
		s.t.Fatalf("%v (server log below)", err)
	}
}

// lostPort reports whether the server's log says its listen address was
// in use.
func (s *server) lostPort() bool {
	b, err := os.ReadFile(s.logf.Name())
	return err == nil && strings.Contains(string(b), "listen tcp "+s.addr+": bind: address already in use")
}

// tryStart starts the server and waits until it is healthy; it returns an
// error if the server exits during start-up (or hangs).
func (s *server) tryStart(extra ...string) error {
	s.t.Helper()
	args := []string{"serve", "--root", s.root, "--run-root", s.runRoot, "--listen", s.addr,
		"--bridge", s.bridge, "--subnet", s.net.Subnet.String(), "--log-level", "debug",
		// Tests pull only from their loopback registry: a typo in an image
		// name must not reach out to a public registry.
		"--allow-registry", "loopback"}
	if s.cgroupParent != "" {
		args = append(args, "--cgroup-parent", s.cgroupParent)
	}
	s.lastArgs = extra
	if dockerRuntime(extra) && !s.docker {
		s.prepareDocker()
	}
	s.cmd = exec.Command(s.bin, append(args, extra...)...)
	s.cmd.Env = append(os.Environ(), "MOAT_API_KEY="+s.key, s.net.Env())
	s.cmd.Stdout, s.cmd.Stderr = s.logf, s.logf
	s.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := s.cmd.Start(); err != nil {
		s.t.Fatal(err)
	}
	cmd, exited := s.cmd, make(chan struct{})
	s.exited = exited
	go func() { cmd.Wait(); close(exited) }()
	// A server that cannot start exits at once (say, its subnet is taken):
	// that fails the test now, with the server's log, instead of after the
	// health deadline. The deadline itself only bounds a server that hangs.
	hc := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	start := time.Now()
	for {
		select {
		case <-exited:
			s.cmd = nil
			return fmt.Errorf("server exited during start-up after %s: %v", time.Since(start).Round(time.Millisecond), cmd.ProcessState)
		default:
		}
		resp, err := hc.Get("http://" + s.addr + "/health")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				return nil
			}
		}
		if time.Since(start) > 2*time.Minute {
			return fmt.Errorf("server did not become healthy within %s", time.Since(start).Round(time.Second))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// deleteAll removes every pool and sandbox of a running server, so a
// failed test leaves nothing behind either.
func (s *server) deleteAll() {
	if s.cmd == nil {
		return
	}
	var pools struct {
		Items []struct{ Name, Tenant string }
	}
	if code, b, _ := s.do("GET", "/v1/pools", nil); code == 200 {
		json.Unmarshal(b, &pools)
	}
	for _, p := range pools.Items {
		// Pool names are per tenant: the server key (an admin) names
		// another tenant's pool in that tenant.
		s.do("DELETE", "/v1/pools/"+p.Name, nil, "X-Moat-Tenant", p.Tenant)
	}
	var list struct{ Items []struct{ ID string } }
	if code, b, _ := s.do("GET", "/v1/sandboxes?pageSize=1000", nil); code == 200 {
		json.Unmarshal(b, &list)
	}
	for _, sb := range list.Items {
		s.do("DELETE", "/v1/sandboxes/"+sb.ID, nil)
	}
}

// kill9 kills the server with SIGKILL, as a crash would.
func (s *server) kill9() {
	if s.cmd == nil || s.cmd.Process == nil {
		return
	}
	s.scrape5xx()
	s.cmd.Process.Signal(syscall.SIGKILL)
	<-s.exited
	s.cmd = nil
}

// stop shuts the server down gracefully.
func (s *server) stop() {
	if s.cmd == nil || s.cmd.Process == nil {
		return
	}
	s.scrape5xx()
	s.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-s.exited:
	case <-time.After(20 * time.Second):
		s.cmd.Process.Kill()
		<-s.exited
	}
	s.cmd = nil
}

// do sends an API request; body may be nil, a []byte, or a value to marshal.
func (s *server) do(method, path string, body any, hdr ...string) (int, []byte, http.Header) {
	s.t.Helper()
	var r io.Reader
	switch b := body.(type) {
	case nil:
	case []byte:
		r = bytes.NewReader(b)
	default:
		j, _ := json.Marshal(b)
		r = bytes.NewReader(j)
	}
	req, _ := http.NewRequest(method, "http://"+s.addr+path, r)
	req.Header.Set("OPEN-SANDBOX-API-KEY", s.key)
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		if hdr[i+1] == "" {
			req.Header.Del(hdr[i])
		} else {
			req.Header.Set(hdr[i], hdr[i+1])
		}
	}
	resp, err := (&http.Client{Timeout: 60 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}).Do(req)
	if err != nil {
		s.t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	out, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, out, resp.Header
}

func (s *server) mustJSON(code int, method, path string, body any, into any) {
	s.t.Helper()
	got, out, _ := s.do(method, path, body)
	if got != code {
		s.t.Fatalf("%s %s: status %d, want %d: %s", method, path, got, code, out)
	}
	if into != nil {
		if err := json.Unmarshal(out, into); err != nil {
			s.t.Fatalf("%s %s: decode %s: %v", method, path, out, err)
		}
	}
}

// event is one execd stream event.
type event struct {
	Type          string `json:"type"`
	Text          string `json:"text"`
	ExecutionTime *int64 `json:"execution_time"`
	Error         *struct {
		Ename, Evalue string
		Traceback     []string
	} `json:"error"`
}

// runCommand runs a foreground command through the agent at base (an
// http:// URL) and returns the decoded events.
func runCommand(t *testing.T, base string, hdr map[string]string, command string) []event {
	t.Helper()
	body, _ := json.Marshal(map[string]any{"command": command})
	req, _ := http.NewRequestWithContext(context.Background(), "POST", base+"/command", bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	// No keep-alive: sandbox addresses are reused after deletes (and across
	// server crashes in the chaos test), and an idle connection to a
	// deleted sandbox must never carry a command for its successor.
	hc := &http.Client{Timeout: 60 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatalf("POST /command: %v", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("POST /command: status %d: %s", resp.StatusCode, b)
	}
	if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "text/event-stream") {
		t.Fatalf("content type %q", ct)
	}
	var evs []event
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := strings.TrimPrefix(sc.Text(), "data: ")
		if line == "" {
			continue
		}
		var e event
		if err := json.Unmarshal([]byte(line), &e); err != nil {
			t.Fatalf("bad event %q: %v", line, err)
		}
		if e.Type != "ping" {
			evs = append(evs, e)
		}
	}
	return evs
}

// stdoutOf joins the stdout events.
func stdoutOf(evs []event) string {
	var lines []string
	for _, e := range evs {
		if e.Type == "stdout" {
			lines = append(lines, e.Text)
		}
	}
	return strings.Join(lines, "\n")
}

func assertCompleted(t *testing.T, evs []event) {
	t.Helper()
	if len(evs) < 2 || evs[0].Type != "init" || len(evs[0].Text) != 32 {
		t.Fatalf("stream does not start with init and a 32-hex id: %+v", evs)
	}
	last := evs[len(evs)-1]
	if last.Type != "execution_complete" || last.ExecutionTime == nil {
		t.Fatalf("stream does not end with execution_complete: %+v", evs)
	}
}

// outside is a fake "outside" host: a netns of the test's own linked to
// the host by a veth, reached by sandboxes through the host's NAT; nothing
// leaves the machine.
type outside struct {
	ns     string // netns path
	host   string // host end of the link (IPv4)
	a, b   string // its IPv4 addresses; a serves nettest.Banner on port 7000
	a6, b6 string // its IPv6 addresses (dual only), both serving the banner on 7000
}

// outsideHost makes an outside host with addresses from n's outside
// ranges (see testnet.Net.Outside). With dual it is also reachable over
// IPv6: the host end forwards IPv6 (network.EnableForwarding6) so NAT66 replies are
// routed back to the bridge, the part of an uplink's configuration moat
// leaves to the operator.
func outsideHost(t *testing.T, n *testnet.Net, dual bool) outside {
	t.Helper()
	idx := n.Outside(0)
	name, veth := n.Netns("out"), n.Link("o")
	if dual {
		idx, name, veth = n.Outside(1), n.Netns("out6"), n.Link("o6")
	}
	o := outside{ns: "/run/netns/" + name, host: idx.Addr().Next().String(),
		a: idx.Addr().Next().Next().String(), b: idx.Addr().Next().Next().Next().String()}
	run := func(args ...string) {
		t.Helper()
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			t.Fatalf("ip %v: %v: %s", args, err, out)
		}
	}
	// The lease's cleanup removes the netns and the link even if the test
	// process dies; these run first when it does not.
	run("netns", "add", name)
	t.Cleanup(func() { exec.Command("ip", "netns", "del", name).Run() })
	run("link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", name)
	t.Cleanup(func() { exec.Command("ip", "link", "del", veth).Run() })
	run("addr", "add", o.host+"/29", "dev", veth)
	run("-n", name, "addr", "add", o.a+"/29", "dev", "eth0")
	run("-n", name, "addr", "add", o.b+"/29", "dev", "eth0")
	if dual {
		p6 := n.Outside6()
		h6 := p6.Addr().Next()
		o.a6, o.b6 = h6.Next().String(), h6.Next().Next().String()
		run("-6", "addr", "add", h6.String()+"/64", "dev", veth, "nodad")
		if fallback, err := network.EnableForwarding6(network.SysctlRoot, veth); err != nil {
			t.Fatalf("forwarding on the outside link: %v", err)
		} else if fallback {
			t.Logf("no force_forwarding on this kernel: net.ipv6.conf.all.forwarding turned on")
		}
		run("-n", name, "-6", "addr", "add", o.a6+"/64", "dev", "eth0", "nodad")
		run("-n", name, "-6", "addr", "add", o.b6+"/64", "dev", "eth0", "nodad")
	}
	run("link", "set", veth, "up")
	run("-n", name, "link", "set", "eth0", "up")
	run("-n", name, "link", "set", "lo", "up")
	nettest.ServeTCP(t, o.ns, net.JoinHostPort(o.a, "7000"))
	if dual {
		nettest.ServeTCP(t, o.ns, net.JoinHostPort(o.a6, "7000"))
		nettest.ServeTCP(t, o.ns, net.JoinHostPort(o.b6, "7000"))
	}
	return o
}

// dropIdleConns closes the test process's kept-alive HTTP connections: a
// sandbox address reused from an earlier test (or -count run) would
// otherwise get a pooled connection of a dead sandbox, which the new one
// resets.
func dropIdleConns(t *testing.T) {
	http.DefaultTransport.(*http.Transport).CloseIdleConnections()
	t.Cleanup(http.DefaultTransport.(*http.Transport).CloseIdleConnections)
}

// startDocker starts the server on the docker runtime.
func (s *server) startDocker(extra ...string) {
	s.t.Helper()
	s.start(append([]string{"--runtime", "docker"}, extra...)...)
}

// sandboxBridge is the host bridge of the server's sandboxes: the
// lease's, or on the docker runtime its network's.
func (s *server) sandboxBridge() string {
	if s.docker {
		return docker.BridgeName("moat-" + s.bridge)
	}
	return s.bridge
}

// dockerRuntime reports whether serve arguments choose the docker runtime.
func dockerRuntime(args []string) bool {
	for i, a := range args {
		if a == "--runtime=docker" || (a == "--runtime" && i+1 < len(args) && args[i+1] == "docker") {
			return true
		}
	}
	return false
}

// prepareDocker readies a server on the docker runtime (any start with
// --runtime docker): dockerd is set up (scripts/docker-setup.sh), and at
// cleanup the Docker network and the host and intercept tables of its
// bridge, which a server keeps on purpose (its containers outlive it),
// are removed. The bridge is the lease's (OwnLink): what is left of it is
// reported as a leak.
func (s *server) prepareDocker() {
	s.t.Helper()
	s.docker = true
	if out, err := exec.Command("bash", filepath.Join(testutil.RepoRoot(s.t), "scripts", "docker-setup.sh")).CombinedOutput(); err != nil {
		s.t.Fatalf("docker-setup.sh: %v\n%s", err, out)
	}
	network := "moat-" + s.bridge
	bridge := docker.BridgeName(network)
	s.net.OwnLink(bridge)
	rm := func() error {
		if out, err := exec.Command("/usr/bin/docker", "network", "rm", network).CombinedOutput(); err != nil && !strings.Contains(string(out), "No such network") && !strings.Contains(string(out), "not found") {
			return fmt.Errorf("docker network rm %s: %v: %s", network, err, out)
		}
		return nil
	}
	// A network of the lease's name is a crashed test's (the lease's sweep
	// took its bridge): the daemon still has it.
	if err := rm(); err != nil {
		s.t.Fatal(err)
	}
	s.afterStop = append(s.afterStop, func() {
		if err := rm(); err != nil {
			s.t.Error(err)
		}
		ctx := context.Background()
		for _, err := range []error{nft.RemoveHost(ctx, bridge), nft.RemoveIntercept(ctx, bridge)} {
			if err != nil {
				s.t.Errorf("docker network %s: %v", network, err)
			}
		}
	})
}

// getServed GETs url with the headers until the answer is not a 502 (the
// sandbox's server may still be starting; the proxy and gateway answer
// 502 until it listens), and returns the status and the trimmed body.
func getServed(client *http.Client, url string, hdr map[string]string) (int, string, error) {
	var resp *http.Response
	var err error
	for range 50 {
		req, _ := http.NewRequest("GET", url, nil)
		for k, v := range hdr {
			req.Header.Set(k, v)
		}
		if resp, err = client.Do(req); err == nil && resp.StatusCode != http.StatusBadGateway {
			break
		}
		if resp != nil {
			resp.Body.Close()
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, strings.TrimSpace(string(b)), nil
}

// hostService listens on network ("tcp", "tcp6") at addr on the host and
// answers every connection with banner: a service sandboxes must not
// reach. It returns the port; the listener is closed at the end of t.
func hostService(t *testing.T, network, addr, banner string) int {
	t.Helper()
	ln, err := net.Listen(network, addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			io.WriteString(c, banner)
			c.Close()
		}
	}()
	return ln.Addr().(*net.TCPAddr).Port
}

// createIdle creates a sandbox of image ref that idles (tail -f
// /dev/null), with networkPolicy np unless nil, and deletes it at the end
// of the test. It returns the sandbox ID.
func (s *server) createIdle(ref string, np any) string {
	s.t.Helper()
	body := map[string]any{"image": map[string]any{"uri": ref}, "entrypoint": []string{"tail", "-f", "/dev/null"}, "timeout": 600}
	if np != nil {
		body["networkPolicy"] = np
	}
	var c sandboxResp
	s.mustJSON(202, "POST", "/v1/sandboxes", body, &c)
	s.t.Cleanup(func() { s.do("DELETE", "/v1/sandboxes/"+c.ID, nil) })
	return c.ID
}

// probeOutside is the shell command that connects to a fake outside host's
// nettest.ServeTCP service on port 7000; reachedOutside tells from its
// output whether the connection got through.
func probeOutside(addr string) string { return "nc -w 2 " + addr + " 7000" }

func reachedOutside(out string) bool { return strings.Contains(out, nettest.Banner[:10]) }

// sandboxPorts returns the ports of the server's bridge that sandboxes
// hold, once those of deleted sandboxes had 10 s to go (their veths are
// deleted after the delete returns). The other ports are the server's
// spare networks (made ahead of creates): ports that are down, at most
// Config.NetworkSpares of them.
func sandboxPorts(t *testing.T, srv *server) []string {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		up, down := bridgePorts(srv.bridge)
		if len(up) == 0 || time.Now().After(deadline) {
			if max := moatserver.Default().NetworkSpares; len(down) > max {
				t.Errorf("bridge %s has %d ports down, more than the server's %d spares: %v", srv.bridge, len(down), max, down)
			}
			return up
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// bridgePorts lists the ports of bridge that are up and down.
func bridgePorts(bridge string) (up, down []string) {
	links, _ := os.ReadDir("/sys/class/net/" + bridge + "/brif")
	for _, l := range links {
		flags, err := os.ReadFile("/sys/class/net/" + l.Name() + "/flags")
		v, perr := strconv.ParseUint(strings.TrimSpace(string(flags)), 0, 32)
		if err == nil && perr == nil && v&syscall.IFF_UP == 0 {
			down = append(down, l.Name())
		} else {
			up = append(up, l.Name())
		}
	}
	return up, down
}

// TestServerStartPortTaken: a server whose picked port another process
// bound first starts on another one (start), and answers there.
func TestServerStartPortTaken(t *testing.T) {
	srv := newServer(t)
	l, err := net.Listen("tcp", srv.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	taken := srv.addr
	srv.start()
	if srv.addr == taken {
		t.Fatalf("the server kept the taken address %s", taken)
	}
	if code, _, _ := srv.do("GET", "/health", nil); code != 200 {
		t.Fatalf("health on %s: %d", srv.addr, code)
	}
}

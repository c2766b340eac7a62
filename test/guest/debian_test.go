// Package guest runs moat on a stock Debian 12 host, booted under QEMU
// (internal/testutil/guest): cgroup v2 unified under systemd and Debian's
// 6.1 kernel, a host the CI machine (cgroup v1) cannot be turned into.
package guest

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/moat-sandbox/moat/internal/testutil"
	"github.com/moat-sandbox/moat/internal/testutil/guest"
)

func TestMain(m *testing.M) { testutil.Main(m) }

const (
	apiPort = 8080
	apiKey  = "guest-key-0123456789"
)

// TestStockDebianHost starts moat under systemd in the guest, creates a
// sandbox with resource limits with each of crun and runc, and checks the
// limits in the sandbox's cgroup v2 files, a command run in it,
// pause/resume through cgroup.freeze, and that a delete leaves no cgroup,
// runtime state or process behind. A boot and each create are slow under
// software emulation, so the slice stays short.
func TestStockDebianHost(t *testing.T) {
	bin := testutil.MoatBinary(t)
	rootfs := testutil.BusyboxRootfs(t)
	agent := testutil.AgentBinary(t)
	conformance := buildTest(t, "./internal/runtime/oci")
	vm := guest.Boot(t, guest.Options{Forward: []int{apiPort}, BootTimeout: 15 * time.Minute})
	vm.CopyIn(t, bin, "moat")
	vm.CopyIn(t, rootfs, "busybox")
	vm.CopyIn(t, agent, "moat-agent")
	vm.CopyIn(t, conformance, "oci.test")

	if fs := strings.TrimSpace(vm.MustRun(t, time.Minute, "stat -f -c %T /sys/fs/cgroup")); fs != "cgroup2fs" {
		t.Fatalf("/sys/fs/cgroup is %q, want cgroup2fs (a unified cgroup v2 host)", fs)
	}
	vm.MustRun(t, time.Minute, "install -m 0755 /mnt/host/moat /usr/local/bin/moat")
	checkDoctor(t, vm)
	t.Run("conformance", func(t *testing.T) { runConformance(t, vm) })
	vm.MustRun(t, 3*time.Minute, `set -e
moat image import --root /var/lib/moat local/busybox /mnt/host/busybox >/dev/null
systemd-run --unit moat-serve -E MOAT_API_KEY=`+apiKey+` \
	/usr/local/bin/moat serve --runtime oci --allow-registry loopback --root /var/lib/moat --listen 0.0.0.0:8080`)
	t.Cleanup(func() {
		if t.Failed() {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			r, _ := vm.Run(ctx, "journalctl -u moat-serve --no-pager | tail -60")
			t.Logf("moat serve's journal:\n%s", r.Stdout)
		}
	})
	api := &client{t: t, base: "http://" + vm.Addr(apiPort), ids: new([]string)}
	api.waitHealthy(3 * time.Minute)
	ruleset := nftRuleset(t, vm)

	for _, class := range []string{"crun", "runc"} {
		t.Run(class, func(t *testing.T) {
			api := &client{t: t, base: api.base, ids: api.ids}
			id := api.create(map[string]any{
				"image":          map[string]any{"uri": "local/busybox"},
				"entrypoint":     []string{"tail", "-f", "/dev/null"},
				"timeout":        600,
				"resourceLimits": map[string]string{"cpu": "500m", "memory": "256Mi"},
				"extensions":     map[string]string{"moat.runtime": class},
			})

			if out := api.command(id, "echo hello $((6*7)) $(cat /proc/self/cgroup)"); out != "hello 42 0::/" {
				t.Fatalf("command output %q", out)
			}
			// The sandbox's own cgroup (<parent>/<id>) holds the limits.
			cg := fmt.Sprintf(`cg=$(find /sys/fs/cgroup -mindepth 1 -maxdepth 3 -type d -name '*%s*' | head -1); [ -n "$cg" ] || { echo no cgroup >&2; exit 1; }`, id)
			limits := strings.Fields(vm.MustRun(t, time.Minute, cg+`; cat $cg/memory.max $cg/pids.max $cg/cpu.max`))
			if want := []string{"268435456", "4096", "50000", "100000"}; strings.Join(limits, " ") != strings.Join(want, " ") {
				t.Fatalf("memory.max, pids.max, cpu.max: %q, want %q", limits, want)
			}

			api.json(202, "POST", "/v1/sandboxes/"+id+"/pause", nil, nil)
			if f := strings.TrimSpace(vm.MustRun(t, time.Minute, cg+`; cat $cg/cgroup.freeze; grep frozen $cg/cgroup.events`)); f != "1\nfrozen 1" {
				t.Fatalf("paused sandbox: cgroup.freeze, events %q", f)
			}
			api.json(202, "POST", "/v1/sandboxes/"+id+"/resume", nil, nil)
			if f := strings.TrimSpace(vm.MustRun(t, time.Minute, cg+`; cat $cg/cgroup.freeze`)); f != "0" {
				t.Fatalf("resumed sandbox: cgroup.freeze %q", f)
			}
			if out := api.command(id, "echo resumed"); out != "resumed" {
				t.Fatalf("command after resume: %q", out)
			}

			if code, body := api.do("DELETE", "/v1/sandboxes/"+id, nil); code != 204 {
				t.Fatalf("delete: %d %s", code, body)
			}
			// No cgroup, runtime state or process of the sandbox is left.
			left := vm.MustRun(t, time.Minute, fmt.Sprintf(`find /sys/fs/cgroup /run/crun /run/runc -name '*%s*' 2>/dev/null; ps -eo args | grep -F %s | grep -v grep; true`, id, id))
			if strings.TrimSpace(left) != "" {
				t.Fatalf("left behind by the delete:\n%s", left)
			}
			checkOOMReported(t, api, class)
		})
	}
	t.Run("slice", func(t *testing.T) { runSlice(t, vm, &client{t: t, base: api.base, ids: api.ids}) })
	checkNothingLeft(t, vm, api, ruleset)
	if os.Getenv(benchEnv) != "" {
		bench(t, vm)
	}
}

// benchEnv set makes TestStockDebianHost end with `moat-bench create` on
// crun in the guest (docs/BENCHMARKS.md); it prints figures and checks
// nothing, so CI leaves it out.
const benchEnv = "MOAT_GUEST_BENCH"

func bench(t *testing.T, vm *guest.VM) {
	vm.CopyIn(t, testutil.BenchBinary(t), "moat-bench")
	out := vm.MustRun(t, 20*time.Minute, `install -m 0755 /mnt/host/moat-bench /usr/local/bin/moat-bench
uptime; moat-bench create -n 20 --runtime-class crun 2>&1; uptime`)
	t.Logf("moat-bench create -n 20 --runtime-class crun in the guest:\n%s", out)
}

// checkOOMReported: a sandbox whose agent the OOM killer takes is Failed
// at once with the reason, read on cgroup v2 from memory.events.
func checkOOMReported(t *testing.T, api *client, class string) {
	id := api.create(map[string]any{
		"image":          map[string]any{"uri": "local/busybox"},
		"entrypoint":     []string{"tail", "-f", "/dev/null"},
		"timeout":        600,
		"resourceLimits": map[string]string{"memory": "64Mi"},
		"extensions":     map[string]string{"moat.runtime": class},
	})
	// The agent (PID 1) is the OOM killer's first choice; the stream ends
	// with the sandbox, so its answer is not checked here.
	body, _ := json.Marshal(map[string]any{"command": "echo 1000 >/proc/1/oom_score_adj; " +
		"for i in 1 2 3 4 5; do dd if=/dev/zero of=/dev/null bs=20M count=1000 & done; wait"})
	req, _ := http.NewRequest("POST", api.base+"/sandboxes/"+id+"/proxy/44772/command", bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-EXECD-ACCESS-TOKEN", apiKey)
	if resp, err := (&http.Client{Timeout: 2 * time.Minute}).Do(req); err == nil {
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	var got struct {
		Status struct{ State, Reason, Message string }
	}
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(time.Second) {
		api.json(200, "GET", "/v1/sandboxes/"+id, nil, &got)
		if got.Status.State == "Failed" || time.Now().After(deadline) {
			break
		}
	}
	if got.Status.State != "Failed" || got.Status.Reason != "SANDBOX_OOM_KILLED" {
		t.Fatalf("after the OOM kill: %+v, want Failed, SANDBOX_OOM_KILLED", got.Status)
	}
}

// checkDoctor: `moat doctor` on the stock host passes, finds cgroup v2
// with the cpu, memory and pids controllers delegated to the cgroup
// parent, the kernel features as Debian's modules, and runc and crun.
func checkDoctor(t *testing.T, vm *guest.VM) {
	t.Helper()
	out := vm.MustRun(t, 2*time.Minute, "moat doctor --runtime oci --root /var/lib/moat -o json")
	var rep struct {
		OK     bool
		Checks []struct{ Name, Status, Detail, Fix string }
	}
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("moat doctor -o json: %v\n%s", err, out)
	}
	status := map[string]string{}
	detail := map[string]string{}
	for _, c := range rep.Checks {
		status[c.Name], detail[c.Name] = c.Status, c.Detail
	}
	if !rep.OK || !strings.Contains(detail["cgroup"], "cgroup v2") {
		t.Fatalf("moat doctor in the guest: %s", out)
	}
	for _, name := range []string{"privileges", "cgroup.cpu", "cgroup.memory", "cgroup.pids", "kernel.overlayfs",
		"kernel.nftables", "kernel.veth", "kernel.bridge", "runtime.runc", "runtime.crun"} {
		if status[name] != "ok" {
			t.Errorf("moat doctor: %s is %q (%s), want ok", name, status[name], detail[name])
		}
	}
}

// client calls the API of the guest's moat through the forwarded port.
type client struct {
	t    *testing.T
	base string
	// ids are the sandboxes made through create, shared by the
	// clients of subtests.
	ids *[]string
}

func (c *client) do(method, path string, body any) (int, []byte) {
	c.t.Helper()
	var r io.Reader
	if body != nil {
		b, _ := json.Marshal(body)
		r = bytes.NewReader(b)
	}
	req, _ := http.NewRequest(method, c.base+path, r)
	req.Header.Set("OPEN-SANDBOX-API-KEY", apiKey)
	req.Header.Set("Content-Type", "application/json")
	hc := &http.Client{Timeout: 2 * time.Minute}
	resp, err := hc.Do(req)
	if err != nil {
		c.t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	out, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, out
}

func (c *client) json(code int, method, path string, body, into any) {
	c.t.Helper()
	got, out := c.do(method, path, body)
	if got != code {
		c.t.Fatalf("%s %s: status %d, want %d: %s", method, path, got, code, out)
	}
	if into != nil {
		if err := json.Unmarshal(out, into); err != nil {
			c.t.Fatalf("%s %s: decode %s: %v", method, path, out, err)
		}
	}
}

func (c *client) waitHealthy(timeout time.Duration) {
	c.t.Helper()
	hc := &http.Client{Timeout: 5 * time.Second}
	deadline := time.Now().Add(timeout)
	for {
		resp, err := hc.Get(c.base + "/health")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				return
			}
		}
		if time.Now().After(deadline) {
			c.t.Fatalf("moat serve in the guest not healthy within %s: %v", timeout, err)
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// command runs command in sandbox id through the server's proxy to its
// agent and returns its standard output.
func (c *client) command(id, command string) string {
	c.t.Helper()
	body, _ := json.Marshal(map[string]any{"command": command})
	req, _ := http.NewRequest("POST", c.base+"/sandboxes/"+id+"/proxy/44772/command", bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-EXECD-ACCESS-TOKEN", apiKey)
	resp, err := (&http.Client{Timeout: 2 * time.Minute}).Do(req)
	if err != nil {
		c.t.Fatalf("command: %v", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		b, _ := io.ReadAll(resp.Body)
		c.t.Fatalf("command: status %d: %s", resp.StatusCode, b)
	}
	var out []string
	var done bool
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		var e struct{ Type, Text string }
		if json.Unmarshal([]byte(strings.TrimPrefix(sc.Text(), "data: ")), &e) != nil {
			continue
		}
		switch e.Type {
		case "stdout":
			out = append(out, e.Text)
		case "execution_complete":
			done = true
		}
	}
	if !done {
		c.t.Fatalf("command %q: stream ended without execution_complete (stdout %q)", command, out)
	}
	return strings.Join(out, "\n")
}

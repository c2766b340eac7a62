package guest

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"mime/multipart"
	"net/http"
	"net/textproto"
	"strings"
	"testing"
	"time"

	"github.com/moat-sandbox/moat/internal/network"
	"github.com/moat-sandbox/moat/internal/testutil/guest"
)

// The fake outside host of the egress checks: a network namespace of the
// guest's own, routed from the guest, serving a page on outsidePort. No
// real address is ever reached (the guest has no route out anyway).
const (
	outsideAddr = "192.0.2.10"
	outsidePort = 7000
	outsidePage = "moat-outside-host"
)

// runSlice drives the API of the guest's moat serve (crun) beyond create,
// exec and pause: files up and down, the egress policy against a fake
// outside host, a snapshot and a sandbox created from it, a claim from a
// warm pool, and a restart of the systemd unit that the sandboxes
// survive.
func runSlice(t *testing.T, vm *guest.VM, api *client) {
	vm.MustRun(t, time.Minute, fmt.Sprintf(`set -e
ip netns add outside
ip link add moat-out type veth peer name eth0 netns outside
ip addr add 192.0.2.1/24 dev moat-out
ip link set moat-out up
ip -n outside addr add %[1]s/24 dev eth0
ip -n outside link set eth0 up
ip -n outside link set lo up
ip -n outside route add default via 192.0.2.1
mkdir -p /srv/outside && echo %[3]s >/srv/outside/index.html
systemd-run --unit outside-httpd ip netns exec outside busybox httpd -f -p %[1]s:%[2]d -h /srv/outside`, outsideAddr, outsidePort, outsidePage))
	t.Cleanup(func() {
		vm.MustRun(t, time.Minute, "systemctl stop outside-httpd; ip link del moat-out; ip netns del outside")
	})
	create := func(extra map[string]any) string {
		body := map[string]any{
			"image":      map[string]any{"uri": "local/busybox"},
			"entrypoint": []string{"tail", "-f", "/dev/null"},
			"timeout":    600,
			"extensions": map[string]string{"moat.runtime": "crun"},
		}
		for k, v := range extra {
			body[k] = v
		}
		return api.create(body)
	}

	// Files: a 1 MB upload comes back byte for byte and is seen inside.
	files := create(nil)
	payload := bytes.Repeat([]byte("moat-guest"), 100000)
	api.upload(files, "/workspace/dir/data.bin", payload)
	if back := api.download(files, "/workspace/dir/data.bin"); !bytes.Equal(back, payload) {
		t.Fatalf("download: %d bytes, want the %d uploaded", len(back), len(payload))
	}
	if out := api.command(files, "wc -c </workspace/dir/data.bin; echo state >/workspace/marker"); out != fmt.Sprint(len(payload)) {
		t.Fatalf("size seen inside the sandbox: %q", out)
	}

	// Egress: deny by default with the outside host allowed reaches it;
	// deny by default alone does not; no policy reaches it through NAT.
	probe := fmt.Sprintf("timeout 10 wget -q -O - http://%s:%d/ 2>&1; true", outsideAddr, outsidePort)
	allowed := create(map[string]any{"networkPolicy": map[string]any{"defaultAction": "deny",
		"egress": []map[string]string{{"action": "allow", "target": outsideAddr + "/32"}}}})
	denied := create(map[string]any{"networkPolicy": map[string]any{"defaultAction": "deny"}})
	if out := api.command(allowed, probe); out != outsidePage {
		t.Errorf("deny by default, outside host allowed: %q, want the page", out)
	}
	if out := api.command(denied, probe); strings.Contains(out, outsidePage) {
		t.Errorf("deny by default: the sandbox reached the outside host")
	}
	if out := api.command(files, probe); out != outsidePage {
		t.Errorf("no policy: %q, want the page", out)
	}

	// A snapshot of the files sandbox, and a sandbox created from it that
	// sees its files.
	var sn struct {
		ID     string
		Status struct{ State string }
	}
	api.json(202, "POST", "/v1/sandboxes/"+files+"/snapshots", map[string]any{"name": "guest"}, &sn)
	for deadline := time.Now().Add(2 * time.Minute); sn.Status.State != "Ready"; time.Sleep(time.Second) {
		if time.Now().After(deadline) {
			t.Fatalf("snapshot %s: %s, want Ready", sn.ID, sn.Status.State)
		}
		api.json(200, "GET", "/v1/snapshots/"+sn.ID, nil, &sn)
	}
	fork := api.create(map[string]any{"snapshotId": sn.ID, "timeout": 600})
	if out := api.command(fork, "cat /workspace/marker; wc -c </workspace/dir/data.bin"); out != fmt.Sprintf("state\n%d", len(payload)) {
		t.Fatalf("sandbox from the snapshot sees %q", out)
	}

	// A warm pool of one, and a claim from it.
	api.json(201, "POST", "/v1/pools", map[string]any{
		"name": "warm",
		"template": map[string]any{"image": map[string]string{"uri": "local/busybox"}, "entrypoint": []string{"tail", "-f", "/dev/null"},
			"extensions": map[string]string{"moat.runtime": "crun"}},
		"capacitySpec": map[string]int{"bufferMin": 1, "bufferMax": 1, "poolMin": 0, "poolMax": 2},
	}, nil)
	waitPool := func() {
		t.Helper()
		var p struct{ Status struct{ Available int } }
		for deadline := time.Now().Add(3 * time.Minute); p.Status.Available < 1; time.Sleep(time.Second) {
			if time.Now().After(deadline) {
				t.Fatalf("pool warm: %+v, want 1 available", p.Status)
			}
			api.json(200, "GET", "/v1/pools/warm", nil, &p)
		}
	}
	waitPool()
	// The claim applies env through the warm sandbox's agent with the
	// server's 2 s timeout for agent calls, which emulation on a busy
	// machine can exceed: the failed claim deletes that sandbox, the pool
	// refills, and the claim is tried again.
	var claim string
	for try := 1; claim == ""; try++ {
		body := map[string]any{"extensions": map[string]string{"poolRef": "warm"}, "env": map[string]string{"CLAIMED": "yes"}, "timeout": 600}
		code, out := api.do("POST", "/v1/sandboxes", body)
		if code == 503 && strings.Contains(string(out), "SANDBOX::CLAIM_FAILED") && try < 3 {
			t.Logf("claim %d: %s; again once the pool refilled", try, out)
			waitPool()
			continue
		}
		if code != 202 {
			t.Fatalf("claim: %d %s", code, out)
		}
		claim = api.adopt(out)
	}
	if out := api.command(claim, "echo claimed $CLAIMED"); out != "claimed yes" {
		t.Fatalf("claimed sandbox: %q", out)
	}

	// A restart of the unit: the sandboxes are still there, Running, with
	// their files, and the egress policy still holds.
	paused := create(nil)
	api.json(202, "POST", "/v1/sandboxes/"+paused+"/pause", nil, nil)
	vm.MustRun(t, 3*time.Minute, "systemctl restart moat-serve")
	api.waitHealthy(3 * time.Minute)
	for id, want := range map[string]string{files: "Running", fork: "Running", claim: "Running", allowed: "Running", paused: "Paused"} {
		var sb struct {
			Status struct{ State, Message string }
		}
		api.json(200, "GET", "/v1/sandboxes/"+id, nil, &sb)
		if sb.Status.State != want {
			t.Errorf("sandbox %s after the restart: %+v, want %s", id, sb.Status, want)
		}
	}
	if out := api.command(files, "cat /workspace/marker"); out != "state" {
		t.Errorf("after the restart the sandbox sees %q", out)
	}
	if out := api.command(denied, probe); strings.Contains(out, outsidePage) {
		t.Errorf("after the restart a deny-all sandbox reached the outside host")
	}
	if out := api.command(allowed, probe); out != outsidePage {
		t.Errorf("after the restart, outside host allowed: %q, want the page", out)
	}
	api.json(202, "POST", "/v1/sandboxes/"+paused+"/resume", nil, nil)
	if out := api.command(paused, "echo resumed"); out != "resumed" {
		t.Errorf("resumed after the restart: %q", out)
	}
	waitPool() // the pool is back, refilled

	if code, body := api.do("DELETE", "/v1/pools/warm", nil); code != 204 {
		t.Fatalf("delete pool: %d %s", code, body)
	}
	for _, id := range []string{fork, files, allowed, denied, claim, paused} {
		if code, body := api.do("DELETE", "/v1/sandboxes/"+id, nil); code != 204 {
			t.Fatalf("delete %s: %d %s", id, code, body)
		}
	}
	if code, body := api.do("DELETE", "/v1/snapshots/"+sn.ID, nil); code != 204 {
		t.Fatalf("delete snapshot: %d %s", code, body)
	}
}

// checkNothingLeft: once every sandbox is deleted (and the pool with its
// warm ones), no sandbox has a cgroup, netns, veth, mount, process, file
// under the server's directories (but its audit trail, kept by design) or
// a rule in the host's nft ruleset left.
// ruleset is `nft list ruleset` from before the first create.
func checkNothingLeft(t *testing.T, vm *guest.VM, api *client, ruleset string) {
	t.Helper()
	var list struct{ Pagination struct{ TotalItems int } }
	api.json(200, "GET", "/v1/sandboxes", nil, &list)
	if list.Pagination.TotalItems != 0 {
		t.Errorf("%d sandboxes listed after every delete", list.Pagination.TotalItems)
	}
	var veths []string
	for _, id := range *api.ids {
		veths = append(veths, network.HostVethName(id))
	}
	// One pass over each place: a find per sandbox is minutes under
	// emulation. The pool's warm sandboxes go a moment after its delete.
	script := fmt.Sprintf(`ids='%s' veths='%s'
for i in $(seq 60); do [ -z "$(find /sys/fs/cgroup/moat -mindepth 1 -type d)" ] && break; sleep 1; done
find /sys/fs/cgroup/moat -mindepth 1 -type d | sed 's/^/cgroup: /'
find /sys/fs/cgroup -maxdepth 4 -type d | grep -E "$ids" | sed 's/^/cgroup: /'
grep -E "$ids" /proc/self/mountinfo | sed 's/^/mount: /'
find /run/moat /var/lib/moat /run/crun /run/runc 2>/dev/null | grep -E "$ids" | grep -vE '^/var/lib/moat/audit/[a-z0-9]+[.]log([.]1)?$' | sed 's/^/file: /'
ip -o link | grep -E "$veths" | sed 's/^/veth: /'
ps -eo args | grep -E "$ids" | grep -v grep | sed 's/^/process: /'
true`, strings.Join(*api.ids, "|"), strings.Join(veths, "|"))
	if left := strings.TrimSpace(vm.MustRun(t, 5*time.Minute, script)); left != "" {
		t.Errorf("left behind by the deletes:\n%s", left)
	}
	if now := nftRuleset(t, vm); now != ruleset {
		t.Errorf("nft ruleset after every delete differs from before the first create:\nbefore:\n%s\nafter:\n%s", ruleset, now)
	}
}

// nftRuleset returns the guest's nft ruleset without its counters and
// with the port of the server's egress proxy (a new one per start of the
// server, so a restart changes it) masked.
func nftRuleset(t *testing.T, vm *guest.VM) string {
	t.Helper()
	return vm.MustRun(t, time.Minute, `nft list ruleset | sed -E 's/ counter packets [0-9]+ bytes [0-9]+//; s/(dnat ip6? to [^ ]+):[0-9]+/\1:PORT/'`)
}

// create creates a sandbox (202, Running) and returns its ID, recorded
// in c.ids and deleted when the test ends.
func (c *client) create(body map[string]any) string {
	c.t.Helper()
	code, out := c.do("POST", "/v1/sandboxes", body)
	if code != 202 {
		c.t.Fatalf("POST /v1/sandboxes: status %d, want 202: %s", code, out)
	}
	return c.adopt(out)
}

// adopt is create's handling of the 202 answer out.
func (c *client) adopt(out []byte) string {
	c.t.Helper()
	var sb struct {
		ID     string
		Status struct{ State, Message string }
	}
	if err := json.Unmarshal(out, &sb); err != nil || sb.Status.State != "Running" {
		c.t.Fatalf("create: %s (%v)", out, err)
	}
	*c.ids = append(*c.ids, sb.ID)
	id := sb.ID
	c.t.Cleanup(func() { c.do("DELETE", "/v1/sandboxes/"+id, nil) })
	return id
}

// agentRequest is a request to sandbox id's agent through the server's
// proxy.
func (c *client) agentRequest(method, id, path, contentType string, body io.Reader) []byte {
	c.t.Helper()
	req, _ := http.NewRequest(method, c.base+"/sandboxes/"+id+"/proxy/44772"+path, body)
	req.Header.Set("X-EXECD-ACCESS-TOKEN", apiKey)
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	resp, err := (&http.Client{Timeout: 2 * time.Minute}).Do(req)
	if err != nil {
		c.t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 {
		c.t.Fatalf("%s %s: status %d: %s", method, path, resp.StatusCode, b)
	}
	return b
}

// upload puts data at path in sandbox id (the OpenSandbox SDKs'
// multipart shape).
func (c *client) upload(id, path string, data []byte) {
	c.t.Helper()
	var buf bytes.Buffer
	mw := multipart.NewWriter(&buf)
	h := textproto.MIMEHeader{}
	h.Set("Content-Disposition", `form-data; name="metadata"; filename="metadata"`)
	h.Set("Content-Type", "application/json")
	pw, _ := mw.CreatePart(h)
	json.NewEncoder(pw).Encode(map[string]any{"path": path, "mode": 644})
	fw, _ := mw.CreateFormFile("file", "data")
	fw.Write(data)
	mw.Close()
	c.agentRequest("POST", id, "/files/upload", mw.FormDataContentType(), &buf)
}

func (c *client) download(id, path string) []byte {
	c.t.Helper()
	return c.agentRequest("GET", id, "/files/download?path="+path, "", nil)
}

// Package e2e drives a real `moat serve` process (native OCI runtime) over
// HTTP, black-box. The tests need root; CI runs them as root.
package e2e

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"mime/multipart"
	"net/http"
	"net/textproto"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/moat-sandbox/moat/internal/network"
	"github.com/moat-sandbox/moat/internal/testutil/testnet"
)

type sandboxResp struct {
	ID     string `json:"id"`
	Status struct {
		State, Reason, Message string
	} `json:"status"`
	Metadata   map[string]string     `json:"metadata"`
	Entrypoint []string              `json:"entrypoint"`
	ExpiresAt  string                `json:"expiresAt"`
	CreatedAt  string                `json:"createdAt"`
	Image      *struct{ URI string } `json:"image"`
}

type endpointResp struct {
	Endpoint string            `json:"endpoint"`
	Headers  map[string]string `json:"headers"`
}

func TestSandboxLifecycle(t *testing.T) {
	srv := newServer(t)
	ref := startRegistry(t)
	srv.start()

	for _, class := range []string{"runc", "crun"} {
		t.Run(class, func(t *testing.T) {
			lifecycleRoundTrip(t, srv, ref, class)
		})
	}
}

// lifecycleRoundTrip drives one sandbox through create, agent commands,
// files, endpoints, the server proxy, pause/resume and delete. class is the
// moat.runtime extension; "kubernetes" names the kubernetes runtime, which
// has no runtime classes (its pause is moat node's freeze).
func lifecycleRoundTrip(t *testing.T, srv *server, ref, class string) {
	var created sandboxResp
	create := map[string]any{
		"image":          map[string]any{"uri": ref},
		"entrypoint":     []string{"tail", "-f", "/dev/null"},
		"timeout":        600,
		"env":            map[string]string{"GREETING": "hello-env"},
		"metadata":       map[string]string{"team": "e2e", "class": class},
		"resourceLimits": map[string]string{"cpu": "500m", "memory": "256Mi"},
	}
	if class != "kubernetes" {
		create["extensions"] = map[string]string{"moat.runtime": class}
	}
	srv.mustJSON(202, "POST", "/v1/sandboxes", create, &created)
	if created.Status.State != "Running" || created.ID == "" || created.ExpiresAt == "" {
		t.Fatalf("create returned %+v", created)
	}
	id := created.ID

	var got sandboxResp
	srv.mustJSON(200, "GET", "/v1/sandboxes/"+id, nil, &got)
	if got.Status.State != "Running" || got.Metadata["team"] != "e2e" || got.Image == nil || got.Image.URI != ref {
		t.Fatalf("get returned %+v", got)
	}

	var ep endpointResp
	srv.mustJSON(200, "GET", fmt.Sprintf("/v1/sandboxes/%s/endpoints/44772", id), nil, &ep)
	if ep.Headers["X-EXECD-ACCESS-TOKEN"] == "" {
		t.Fatalf("endpoint has no agent token: %+v", ep)
	}
	base := "http://" + ep.Endpoint

	// The agent refuses requests without its token.
	resp, err := http.Get(base + "/ping")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 401 {
		t.Fatalf("ping without token: %d, want 401", resp.StatusCode)
	}

	evs := runCommand(t, base, ep.Headers, "echo hello; echo $GREETING $FROM_IMAGE")
	assertCompleted(t, evs)
	if out := stdoutOf(evs); out != "hello\nhello-env yes" {
		t.Fatalf("stdout %q", out)
	}

	// Upload then download a file (multipart shape of the OpenSandbox SDKs).
	payload := bytes.Repeat([]byte("moat-file-"), 100000)
	uploadFile(t, base, ep.Headers, "/workspace/dir/data.bin", payload)
	req, _ := http.NewRequest("GET", base+"/files/download?path=/workspace/dir/data.bin", nil)
	for k, v := range ep.Headers {
		req.Header.Set(k, v)
	}
	resp, err = http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	back, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !bytes.Equal(back, payload) {
		t.Fatalf("download: status %d, %d bytes, want %d", resp.StatusCode, len(back), len(payload))
	}
	evs = runCommand(t, base, ep.Headers, "wc -c < /workspace/dir/data.bin")
	if out := strings.TrimSpace(stdoutOf(evs)); out != fmt.Sprint(len(payload)) {
		t.Fatalf("size seen inside the sandbox: %q", out)
	}

	// The same agent through the server proxy, presenting the API key as
	// the agent token (what the SDKs do with use_server_proxy).
	var pep endpointResp
	srv.mustJSON(200, "GET", fmt.Sprintf("/v1/sandboxes/%s/endpoints/44772?use_server_proxy=true", id), nil, &pep)
	if !strings.HasSuffix(pep.Endpoint, "/sandboxes/"+id+"/proxy/44772") {
		t.Fatalf("proxy endpoint %q", pep.Endpoint)
	}
	evs = runCommand(t, "http://"+pep.Endpoint, map[string]string{"X-EXECD-ACCESS-TOKEN": srv.key}, "echo via-proxy")
	assertCompleted(t, evs)
	if out := stdoutOf(evs); out != "via-proxy" {
		t.Fatalf("proxy stdout %q", out)
	}

	// Pause is synchronous: Paused on return. Resume likewise.
	srv.mustJSON(202, "POST", "/v1/sandboxes/"+id+"/pause", nil, nil)
	srv.mustJSON(200, "GET", "/v1/sandboxes/"+id, nil, &got)
	if got.Status.State != "Paused" {
		t.Fatalf("after pause: %s", got.Status.State)
	}
	if code, body, _ := srv.do("POST", "/v1/sandboxes/"+id+"/pause", nil); code != 409 || !strings.Contains(string(body), `"code"`) {
		t.Fatalf("pause of a paused sandbox: %d %s", code, body)
	}
	srv.mustJSON(202, "POST", "/v1/sandboxes/"+id+"/resume", nil, nil)
	srv.mustJSON(200, "GET", "/v1/sandboxes/"+id, nil, &got)
	if got.Status.State != "Running" {
		t.Fatalf("after resume: %s", got.Status.State)
	}
	evs = runCommand(t, base, ep.Headers, "echo resumed")
	if stdoutOf(evs) != "resumed" {
		t.Fatalf("after resume: %+v", evs)
	}
	if class == "kubernetes" {
		// No host resources to check for leaks: the pod is the sandbox.
		if code, body, _ := srv.do("DELETE", "/v1/sandboxes/"+id, nil); code != 204 {
			t.Fatalf("delete: %d %s", code, body)
		}
		if code, body, _ := srv.do("GET", "/v1/sandboxes/"+id, nil); code != 404 || !strings.Contains(string(body), "SANDBOX::NOT_FOUND") {
			t.Fatalf("get after delete: %d %s", code, body)
		}
		return
	}

	// Delete frees everything.
	if code, body, _ := srv.do("DELETE", "/v1/sandboxes/"+id, nil); code != 204 {
		t.Fatalf("delete: %d %s", code, body)
	}
	if code, body, _ := srv.do("GET", "/v1/sandboxes/"+id, nil); code != 404 || !strings.Contains(string(body), "SANDBOX::NOT_FOUND") {
		t.Fatalf("get after delete: %d %s", code, body)
	}
	assertNoLeaks(t, srv, id)
}

func uploadFile(t *testing.T, base string, hdr map[string]string, path string, data []byte) {
	t.Helper()
	var buf bytes.Buffer
	mw := multipart.NewWriter(&buf)
	h := textproto.MIMEHeader{}
	h.Set("Content-Disposition", `form-data; name="metadata"; filename="metadata"`)
	h.Set("Content-Type", "application/json")
	pw, _ := mw.CreatePart(h)
	json.NewEncoder(pw).Encode(map[string]any{"path": path, "mode": 644})
	fw, _ := mw.CreateFormFile("file", filepath.Base(path))
	fw.Write(data)
	mw.Close()
	req, _ := http.NewRequest("POST", base+"/files/upload", &buf)
	req.Header.Set("Content-Type", mw.FormDataContentType())
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("upload: %d %s", resp.StatusCode, b)
	}
}

// assertNoLeaks checks that nothing of sandbox id is left on the host:
// mounts, network namespace, veth, address, cgroups, runtime state, files.
func assertNoLeaks(t *testing.T, srv *server, id string) {
	t.Helper()
	mi, _ := os.ReadFile("/proc/self/mountinfo")
	for _, line := range strings.Split(string(mi), "\n") {
		if strings.Contains(line, id) {
			t.Errorf("mount left behind: %s", line)
		}
	}
	// The sandbox's audit trail outlives it by design (--audit-retention):
	// <root>/audit/<id>.log and its older half <id>.log.1.
	trail := filepath.Join(srv.root, "audit", id+".log")
	for _, dir := range []string{srv.root, srv.runRoot} {
		filepath.Walk(dir, func(p string, info os.FileInfo, err error) error {
			if err == nil && strings.Contains(filepath.Base(p), id) && p != trail && p != trail+".1" {
				t.Errorf("file left behind: %s", p)
			}
			return nil
		})
	}
	// The sandbox's cgroup under the server's --cgroup-parent: one per
	// controller on v1, one in the unified hierarchy on v2.
	cg, _ := filepath.Glob("/sys/fs/cgroup/*" + srv.cgroupParent + "/" + id + "*")
	cg2, _ := filepath.Glob("/sys/fs/cgroup" + srv.cgroupParent + "/" + id + "*")
	if len(cg)+len(cg2) > 0 {
		t.Errorf("cgroups left behind: %v %v", cg, cg2)
	}
	if !testnet.LinkGone(network.HostVethName(id), 10*time.Second) {
		t.Errorf("veth %s left behind", network.HostVethName(id))
	}
}

func TestRestartReadoptsAndReaps(t *testing.T) {
	srv := newServer(t)
	ref := startRegistry(t)
	srv.start()
	create := func() string {
		var c sandboxResp
		srv.mustJSON(202, "POST", "/v1/sandboxes", map[string]any{
			"image": map[string]any{"uri": ref}, "entrypoint": []string{"tail", "-f", "/dev/null"}, "timeout": 600,
		}, &c)
		return c.ID
	}
	keep, paused := create(), create()
	srv.mustJSON(202, "POST", "/v1/sandboxes/"+paused+"/pause", nil, nil)
	var ep endpointResp
	srv.mustJSON(200, "GET", "/v1/sandboxes/"+keep+"/endpoints/44772", nil, &ep)
	runCommand(t, "http://"+ep.Endpoint, ep.Headers, "echo state > /tmp/marker")

	srv.kill9()
	srv.start()

	var got sandboxResp
	srv.mustJSON(200, "GET", "/v1/sandboxes/"+keep, nil, &got)
	if got.Status.State != "Running" {
		t.Fatalf("after restart: %+v", got.Status)
	}
	srv.mustJSON(200, "GET", "/v1/sandboxes/"+paused, nil, &got)
	if got.Status.State != "Paused" {
		t.Fatalf("paused sandbox after restart: %+v", got.Status)
	}
	// The very same sandbox (its files are still there), agent reachable.
	evs := runCommand(t, "http://"+ep.Endpoint, ep.Headers, "cat /tmp/marker")
	if stdoutOf(evs) != "state" {
		t.Fatalf("adopted sandbox lost state: %+v", evs)
	}
	srv.mustJSON(202, "POST", "/v1/sandboxes/"+paused+"/resume", nil, nil)

	// A new sandbox after restart must not reuse a live address.
	third := create()
	var ep3 endpointResp
	srv.mustJSON(200, "GET", "/v1/sandboxes/"+third+"/endpoints/44772", nil, &ep3)
	if ep3.Endpoint == ep.Endpoint {
		t.Fatalf("address %s handed out twice", ep.Endpoint)
	}

	var list struct {
		Items      []sandboxResp            `json:"items"`
		Pagination struct{ TotalItems int } `json:"pagination"`
	}
	srv.mustJSON(200, "GET", "/v1/sandboxes?state=running", nil, &list)
	if list.Pagination.TotalItems != 3 {
		t.Fatalf("running after restart: %d, want 3", list.Pagination.TotalItems)
	}
	for _, id := range []string{keep, paused, third} {
		if code, body, _ := srv.do("DELETE", "/v1/sandboxes/"+id, nil); code != 204 {
			t.Fatalf("delete %s: %d %s", id, code, body)
		}
		assertNoLeaks(t, srv, id)
	}
}

func TestAPIErrors(t *testing.T) {
	srv := newServer(t)
	ref := startRegistry(t)
	srv.start()
	cases := []struct {
		name, method, path string
		body               any
		hdr                []string
		code               int
		errCode            string
	}{
		{"no api key", "GET", "/v1/sandboxes", nil, []string{"OPEN-SANDBOX-API-KEY", ""}, 401, "MISSING_API_KEY"},
		{"wrong api key", "GET", "/sandboxes", nil, []string{"OPEN-SANDBOX-API-KEY", "nope"}, 401, "INVALID_API_KEY"},
		{"unknown sandbox", "GET", "/v1/sandboxes/does-not-exist", nil, nil, 404, "SANDBOX::NOT_FOUND"},
		{"delete unknown", "DELETE", "/v1/sandboxes/does-not-exist", nil, nil, 404, "SANDBOX::NOT_FOUND"},
		{"bad json", "POST", "/v1/sandboxes", []byte("{"), nil, 400, "SANDBOX::INVALID_PARAMETER"},
		{"no image", "POST", "/v1/sandboxes", map[string]any{"entrypoint": []string{"sh"}}, nil, 400, "SANDBOX::INVALID_PARAMETER"},
		{"no entrypoint", "POST", "/v1/sandboxes", map[string]any{"image": map[string]any{"uri": ref}}, nil, 400, "SANDBOX::INVALID_ENTRYPOINT"},
		{"short timeout", "POST", "/v1/sandboxes", map[string]any{"image": map[string]any{"uri": ref}, "entrypoint": []string{"sh"}, "timeout": 30}, nil, 400, "SANDBOX::INVALID_PARAMETER"},
		{"bad cpu", "POST", "/v1/sandboxes", map[string]any{"image": map[string]any{"uri": ref}, "entrypoint": []string{"sh"}, "resourceLimits": map[string]string{"cpu": "lots"}}, nil, 400, "SANDBOX::INVALID_PARAMETER"},
		{"reserved metadata", "POST", "/v1/sandboxes", map[string]any{"image": map[string]any{"uri": ref}, "entrypoint": []string{"sh"}, "metadata": map[string]string{"opensandbox.io/x": "y"}}, nil, 400, "SANDBOX::INVALID_METADATA_LABEL"},
		{"unknown runtime", "POST", "/v1/sandboxes", map[string]any{"image": map[string]any{"uri": ref}, "entrypoint": []string{"sh"}, "extensions": map[string]string{"moat.runtime": "kata"}}, nil, 400, "SANDBOX::INVALID_PARAMETER"},
		{"missing image", "POST", "/v1/sandboxes", map[string]any{"image": map[string]any{"uri": strings.Split(ref, "/")[0] + "/nope/nope:1"}, "entrypoint": []string{"sh"}}, nil, 400, "SANDBOX::IMAGE_PULL_FAILED"},
		// registry.invalid is refused by --allow-registry loopback before any lookup.
		{"registry not allowed", "POST", "/v1/sandboxes", map[string]any{"image": map[string]any{"uri": "registry.invalid/busybox:1"}, "entrypoint": []string{"sh"}}, nil, 400, "SANDBOX::IMAGE_PULL_FAILED"},
		{"bad page", "GET", "/v1/sandboxes?page=0", nil, nil, 400, "SANDBOX::INVALID_PARAMETER"},
		{"bad port", "GET", "/v1/sandboxes/x/endpoints/http", nil, nil, 400, "SANDBOX::INVALID_PORT"},
		{"renew unknown", "POST", "/v1/sandboxes/x/renew-expiration", map[string]any{"expiresAt": time.Now().Add(time.Hour).Format(time.RFC3339)}, nil, 404, "SANDBOX::NOT_FOUND"},
		{"renew bad time", "POST", "/v1/sandboxes/x/renew-expiration", map[string]any{"expiresAt": "tomorrow"}, nil, 400, "SANDBOX::INVALID_PARAMETER"},
		{"no route", "GET", "/v1/nothing", nil, nil, 404, "SANDBOX::NOT_FOUND"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			code, body, _ := srv.do(c.method, c.path, c.body, c.hdr...)
			var e struct{ Code, Message string }
			if err := json.Unmarshal(body, &e); err != nil {
				t.Fatalf("body is not the error envelope: %s", body)
			}
			if code != c.code || e.Code != c.errCode || e.Message == "" {
				t.Fatalf("got %d %+v, want %d %s", code, e, c.code, c.errCode)
			}
		})
	}
	// A failed create leaves nothing behind and is reported as Failed or gone.
	var list struct{ Items []sandboxResp }
	srv.mustJSON(200, "GET", "/v1/sandboxes?state=Running", nil, &list)
	if len(list.Items) != 0 {
		t.Fatalf("running sandboxes after failed creates: %+v", list.Items)
	}
	if ports := sandboxPorts(t, srv); len(ports) != 0 {
		t.Fatalf("veths left by failed creates: %v", ports)
	}
}

func TestSandboxLifecycleDocker(t *testing.T) {
	srv := newServer(t)
	ref := startRegistry(t)
	srv.startDocker()
	lifecycleRoundTrip(t, srv, ref, "docker")
}

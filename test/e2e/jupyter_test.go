package e2e

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/moat-sandbox/moat/internal/testutil"
)

// TestJupyterInSandbox runs code contexts in a real sandbox whose image
// has ipykernel (Debian minbase + python3-ipykernel, built by
// scripts/build-test-images.sh from the Debian mirror and cached): the
// agent must find the kernel and use it instead of its built-in REPL.
func TestJupyterInSandbox(t *testing.T) {
	script := filepath.Join(testutil.RepoRoot(t), "scripts", "build-test-images.sh")
	out, err := exec.Command("bash", script).Output()
	if err != nil {
		t.Fatalf("build test image: %v (run scripts/build-test-images.sh)", err)
	}
	tarball := strings.TrimSpace(string(out))
	if _, err := os.Stat(tarball); err != nil {
		t.Fatalf("test image %q: %v", tarball, err)
	}

	srv := newServer(t)
	const ref = "localhost/debian-ipykernel:e2e"
	if b, err := exec.Command(srv.bin, "image", "import", "--root", srv.root, ref, tarball).CombinedOutput(); err != nil {
		t.Fatalf("import: %v\n%s", err, b)
	}
	srv.start()

	var created sandboxResp
	srv.mustJSON(202, "POST", "/v1/sandboxes", map[string]any{
		"image":      map[string]any{"uri": ref},
		"entrypoint": []string{"sleep", "infinity"},
		"timeout":    600,
	}, &created)
	var ep endpointResp
	srv.mustJSON(200, "GET", fmt.Sprintf("/v1/sandboxes/%s/endpoints/44772", created.ID), nil, &ep)
	base := "http://" + ep.Endpoint

	call := func(method, path string, body any) (int, []byte) {
		b, _ := json.Marshal(body)
		req, _ := http.NewRequest(method, base+path, bytes.NewReader(b))
		req.Header.Set("Content-Type", "application/json")
		for k, v := range ep.Headers {
			req.Header.Set(k, v)
		}
		resp, err := (&http.Client{Timeout: 2 * time.Minute}).Do(req)
		if err != nil {
			t.Fatalf("%s %s: %v", method, path, err)
		}
		defer resp.Body.Close()
		var buf bytes.Buffer
		buf.ReadFrom(resp.Body)
		return resp.StatusCode, buf.Bytes()
	}
	code, body := call("POST", "/code/context", map[string]any{"language": "python"})
	var ctx struct{ ID, Language string }
	if code != 200 || json.Unmarshal(body, &ctx) != nil || ctx.ID == "" {
		t.Fatalf("create context: %d %s", code, body)
	}
	run := func(src string) []map[string]any {
		t.Helper()
		code, body := call("POST", "/code", map[string]any{"context": map[string]any{"id": ctx.ID, "language": "python"}, "code": src})
		if code != 200 {
			t.Fatalf("run %q: %d %s", src, code, body)
		}
		var evs []map[string]any
		sc := bufio.NewScanner(bytes.NewReader(body))
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			line := strings.TrimPrefix(sc.Text(), "data: ")
			if line == "" {
				continue
			}
			var ev map[string]any
			if err := json.Unmarshal([]byte(line), &ev); err != nil {
				t.Fatalf("bad event %q", line)
			}
			if ev["type"] != "ping" {
				evs = append(evs, ev)
			}
		}
		return evs
	}
	result := func(evs []map[string]any) (string, float64) {
		for _, ev := range evs {
			if ev["type"] == "result" {
				r, _ := ev["results"].(map[string]any)
				n, _ := ev["execution_count"].(float64)
				s, _ := r["text"].(string)
				return s, n
			}
		}
		t.Fatalf("no result event: %v", evs)
		return "", 0
	}

	first := run("x = 41\nprint('hello from the kernel')")
	var printed string
	for _, ev := range first {
		if ev["type"] == "stdout" {
			printed += ev["text"].(string)
		}
	}
	if printed != "hello from the kernel\n" {
		t.Fatalf("stdout %q: %v", printed, first)
	}
	if v, n := result(run("x + 1")); v != "42" || n != 2 {
		t.Fatalf("state across cells: %q count %v", v, n)
	}
	// Only a real IPython kernel has get_ipython(); the built-in driver
	// is plain python.
	if v, _ := result(run("type(get_ipython()).__name__")); v != "'ZMQInteractiveShell'" {
		t.Fatalf("not a Jupyter kernel: %q", v)
	}
	evs := run("1/0")
	var ename string
	for _, ev := range evs {
		if ev["type"] == "error" {
			e, _ := ev["error"].(map[string]any)
			ename, _ = e["ename"].(string)
		}
	}
	if ename != "ZeroDivisionError" {
		t.Fatalf("error event: %v", evs)
	}
	if code, body := call("DELETE", "/code/contexts/"+ctx.ID, nil); code != 200 && code != 204 {
		t.Fatalf("delete context: %d %s", code, body)
	}
	if code, _, _ := srv.do("DELETE", "/v1/sandboxes/"+created.ID, nil); code != 204 {
		t.Fatalf("delete sandbox: %d", code)
	}
}

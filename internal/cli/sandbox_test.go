package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/spf13/cobra"

	"github.com/moat-sandbox/moat/client"
)

// runMoat runs the command tree as Execute does (ExitError passes its
// code through) and returns stdout, stderr and the exit code.
func runMoat(t *testing.T, stdin io.Reader, args ...string) (string, string, int) {
	t.Helper()
	root := NewRoot()
	var out, errOut bytes.Buffer
	root.SetOut(&out)
	root.SetErr(&errOut)
	if stdin != nil {
		root.SetIn(stdin)
	}
	root.SetArgs(args)
	err := root.ExecuteContext(context.Background())
	var ee *ExitError
	switch {
	case err == nil:
		return out.String(), errOut.String(), 0
	case errors.As(err, &ee):
		return out.String(), errOut.String(), ee.Code
	}
	errOut.WriteString("moat: " + err.Error() + "\n")
	return out.String(), errOut.String(), ExitCode(err)
}

// fakeServer is a loopback lifecycle server; the agent of every sandbox
// is served under /agent on the same server.
type fakeServer struct {
	t   *testing.T
	srv *httptest.Server
	mux *http.ServeMux

	mu   sync.Mutex
	reqs []*http.Request
	body [][]byte
}

func newFakeServer(t *testing.T) *fakeServer {
	f := &fakeServer{t: t, mux: http.NewServeMux()}
	f.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		r.Body = io.NopCloser(bytes.NewReader(b))
		f.mu.Lock()
		f.reqs = append(f.reqs, r)
		f.body = append(f.body, b)
		f.mu.Unlock()
		if r.URL.Path != "/v1/health" && !strings.HasPrefix(r.URL.Path, "/agent") && r.Header.Get(client.APIKeyHeader) != "k" {
			writeJSONResp(w, 401, map[string]string{"code": "AUTH::UNAUTHORIZED", "message": "bad key"})
			return
		}
		w.Header().Set("X-Request-ID", "rid")
		f.mux.ServeHTTP(w, r)
	}))
	t.Cleanup(f.srv.Close)
	f.mux.HandleFunc("GET /v1/sandboxes/{id}/endpoints/{port}", func(w http.ResponseWriter, r *http.Request) {
		writeJSONResp(w, 200, map[string]any{"endpoint": strings.TrimPrefix(f.srv.URL, "http://") + "/agent",
			"headers": map[string]string{"X-EXECD-ACCESS-TOKEN": "tok"}})
	})
	return f
}

// run runs the CLI against the fake with the API key.
func (f *fakeServer) run(stdin io.Reader, args ...string) (string, string, int) {
	f.t.Helper()
	conn := []string{"--server", f.srv.URL, "--api-key", "k"}
	for i, a := range args {
		if a == "--" {
			return runMoat(f.t, stdin, append(append(append([]string{}, args[:i]...), conn...), args[i:]...)...)
		}
	}
	return runMoat(f.t, stdin, append(args, conn...)...)
}

// last returns the last request (and its body) whose path has prefix.
func (f *fakeServer) last(method, prefix string) (*http.Request, []byte) {
	f.t.Helper()
	f.mu.Lock()
	defer f.mu.Unlock()
	for i := len(f.reqs) - 1; i >= 0; i-- {
		if f.reqs[i].Method == method && strings.HasPrefix(f.reqs[i].URL.Path, prefix) {
			return f.reqs[i], f.body[i]
		}
	}
	f.t.Fatalf("no %s %s request", method, prefix)
	return nil, nil
}

func writeJSONResp(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(v)
}

func TestCreateFlags(t *testing.T) {
	for i, tc := range []struct {
		args []string
		want string // JSON of the request, or the error text
	}{
		{[]string{"--image", "busybox"}, `{"image":{"uri":"busybox"},"entrypoint":["tail","-f","/dev/null"]}`},
		{[]string{"--image", "py", "--timeout", "10m", "-e", "A=1", "-m", "t=x", "-r", "cpu=1,memory=1Gi", "-r", "pids=9",
			"--runtime", "crun", "--entrypoint", `sh -c 'sleep 1000'`},
			`{"image":{"uri":"py"},"entrypoint":["sh","-c","sleep 1000"],"resourceLimits":{"cpu":"1","memory":"1Gi","pids":"9"},` +
				`"env":{"A":"1"},"metadata":{"t":"x"},"extensions":{"moat.runtime":"crun"}} 10m0s`},
		{[]string{"--image", "py", "--entrypoint", "ignored", "--", "python3", "-m", "http.server"},
			`{"image":{"uri":"py"},"entrypoint":["python3","-m","http.server"]}`},
		{[]string{"--snapshot", "s1"}, `{"snapshotId":"s1"}`},
		{[]string{"--pool", "warm"}, `{"extensions":{"poolRef":"warm"}}`},
		{[]string{"--image", "a", "--idle-timeout", "2m", "--idle-action", "pause"},
			`{"image":{"uri":"a"},"entrypoint":["tail","-f","/dev/null"],"extensions":{"moat.idle.action":"pause","moat.idle.timeout":"120"}}`},
		{[]string{"--image", "a", "--idle-timeout", "1500ms"}, "--idle-timeout must be a whole number of seconds"},
		{[]string{"--image", "a", "--idle-action", "pause"}, "--idle-action needs --idle-timeout"},
		{nil, "one of --image, --snapshot, --template or --pool is required"},
		{[]string{"--image", "a", "--snapshot", "b"}, "mutually exclusive"},
		{[]string{"--image", "a", "--timeout", "30s"}, "--timeout must be at least 1m"},
		{[]string{"--image", "a", "-m", "novalue"}, "--metadata"},
		{[]string{"--image", "a", "--count", "0"}, "--count must be at least 1"},
	} {
		f := &createFlags{}
		cmd := &cobra.Command{Use: "create"}
		f.register(cmd, false)
		_ = cmd.Flags().Parse(tc.args)
		var argv []string
		if d := cmd.Flags().ArgsLenAtDash(); d >= 0 {
			argv = cmd.Flags().Args()[d:]
		}
		req, err := f.request(argv)
		got := ""
		if err != nil {
			got = err.Error()
		} else {
			b, _ := json.Marshal(req)
			got = string(b)
			if req.Timeout > 0 {
				got += " " + req.Timeout.String()
			}
		}
		if err != nil && !strings.Contains(got, tc.want) || err == nil && got != tc.want {
			t.Errorf("%d: %v:\n got %s\nwant %s", i, tc.args, got, tc.want)
		}
	}
}

func TestSandboxVerbsAgainstFake(t *testing.T) {
	f := newFakeServer(t)
	created := time.Now().Add(-time.Hour).UTC()
	states := []string{"Pending", "Running"}
	f.mux.HandleFunc("POST /v1/sandboxes", func(w http.ResponseWriter, r *http.Request) {
		writeJSONResp(w, 202, map[string]any{"id": "sb1", "status": map[string]string{"state": "Pending"}, "createdAt": created})
	})
	f.mux.HandleFunc("GET /v1/sandboxes/{id}", func(w http.ResponseWriter, r *http.Request) {
		id := r.PathValue("id")
		if id != "sb1" {
			writeJSONResp(w, 404, map[string]string{"code": "SANDBOX::NOT_FOUND", "message": "sandbox " + id + " not found"})
			return
		}
		st := states[0]
		if len(states) > 1 {
			states = states[1:]
		}
		writeJSONResp(w, 200, map[string]any{"id": "sb1", "status": map[string]string{"state": st}, "createdAt": created,
			"image": map[string]string{"uri": "busybox"}, "metadata": map[string]string{"a": "b"}})
	})
	page := func(n int, next bool) map[string]any {
		return map[string]any{"items": []map[string]any{{"id": "p" + string(rune('0'+n)), "status": map[string]string{"state": "Running"}, "createdAt": created}},
			"pagination": map[string]any{"page": n, "pageSize": 1, "totalItems": 2, "totalPages": 2, "hasNextPage": next}}
	}
	f.mux.HandleFunc("GET /v1/sandboxes", func(w http.ResponseWriter, r *http.Request) {
		writeJSONResp(w, 200, page(map[string]int{"": 1, "1": 1, "2": 2}[r.URL.Query().Get("page")], r.URL.Query().Get("page") != "2"))
	})
	f.mux.HandleFunc("DELETE /v1/sandboxes/{id}", func(w http.ResponseWriter, r *http.Request) {
		if r.PathValue("id") == "gone" {
			writeJSONResp(w, 404, map[string]string{"code": "SANDBOX::NOT_FOUND", "message": "sandbox gone not found"})
			return
		}
		w.WriteHeader(204)
	})

	// create waits for Running (Pending, then Running).
	out, errOut, code := f.run(nil, "sb", "create", "--image", "busybox", "-m", "a=b")
	if code != 0 || out != "sb1\n" {
		t.Fatalf("create: %d %q %q", code, out, errOut)
	}
	if _, b := f.last("POST", "/v1/sandboxes"); !strings.Contains(string(b), `"metadata":{"a":"b"}`) {
		t.Fatalf("create body %s", b)
	}

	// ls passes the filters and hints at the next page.
	out, errOut, code = f.run(nil, "sandbox", "ls", "--state", "Running", "--state", "Paused", "-m", "team=ml", "--page-size", "1")
	if code != 0 || !strings.Contains(out, "p1") || !strings.Contains(errOut, "next: --page 2") {
		t.Fatalf("ls: %d %q %q", code, out, errOut)
	}
	if r, _ := f.last("GET", "/v1/sandboxes"); r.URL.RawQuery != "metadata=team%3Dml&pageSize=1&state=Running&state=Paused" {
		t.Fatalf("ls query %s", r.URL.RawQuery)
	}
	out, _, code = f.run(nil, "sb", "ls", "--all", "-q")
	if code != 0 || out != "p1\np2\n" {
		t.Fatalf("ls --all: %d %q", code, out)
	}
	var list client.SandboxList
	out, _, _ = f.run(nil, "sb", "ls", "-A", "-o", "json")
	if err := json.Unmarshal([]byte(out), &list); err != nil || len(list.Items) != 2 || list.Pagination.TotalItems != 2 || list.Pagination.HasNextPage {
		t.Fatalf("ls -A -o json: %v %s", err, out)
	}

	out, _, code = f.run(nil, "sb", "get", "sb1")
	if code != 0 || !strings.Contains(out, "State:       Running") || !strings.Contains(out, "Image:       busybox") {
		t.Fatalf("get: %d\n%s", code, out)
	}

	// rm goes on after a failure and exits with the failure's code.
	out, errOut, code = f.run(nil, "sb", "rm", "gone", "sb1")
	if code != 4 || out != "sb1\n" || !strings.Contains(errOut, "gone: SANDBOX::NOT_FOUND: sandbox gone not found (HTTP 404, request rid)") ||
		!strings.Contains(errOut, "1 of 2 failed") {
		t.Fatalf("rm: %d %q %q", code, out, errOut)
	}

	_, errOut, code = runMoat(t, nil, "sb", "ls", "--server", f.srv.URL, "--api-key", "bad")
	if code != 1 || !strings.Contains(errOut, "AUTH::UNAUTHORIZED: bad key (HTTP 401") {
		t.Fatalf("bad key: %d %q", code, errOut)
	}
}

func TestWaitRunningFailed(t *testing.T) {
	f := newFakeServer(t)
	f.mux.HandleFunc("GET /v1/sandboxes/{id}", func(w http.ResponseWriter, r *http.Request) {
		writeJSONResp(w, 200, map[string]any{"id": "sb1", "status": map[string]string{"state": "Failed", "reason": "START_FAILED", "message": "no such binary"}})
	})
	c, _ := client.New(f.srv.URL, client.WithAPIKey("k"))
	_, err := waitRunning(context.Background(), c, "sb1", time.Second)
	if err == nil || ExitCode(err) != 3 || !strings.Contains(err.Error(), "Failed: START_FAILED: no such binary") {
		t.Fatalf("waitRunning = %v", err)
	}
}

func TestPoolSpecFlags(t *testing.T) {
	f := &poolFlags{image: "busybox", bufferMin: 1, bufferMax: 2, poolMax: 5}
	spec, err := f.spec("p", nil)
	want := client.PoolSpec{Name: "p", Template: client.PoolTemplate{Image: &client.ImageSpec{URI: "busybox"},
		Entrypoint: []string{"tail", "-f", "/dev/null"}}, CapacitySpec: client.PoolCapacity{BufferMin: 1, BufferMax: 2, PoolMax: 5}}
	if err != nil || !reflect.DeepEqual(spec, want) {
		t.Fatalf("spec = %+v, %v", spec, err)
	}
	f.bufferMax = 9
	if _, err := f.spec("p", nil); err == nil || ExitCode(err) != 2 {
		t.Fatalf("buffer-max > pool-max accepted: %v", err)
	}
}

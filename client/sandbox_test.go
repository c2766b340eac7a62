package client

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/url"
	"reflect"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// agentFake returns a fake whose agent routes need the agent token.
func agentFake(t *testing.T) (*fake, *SandboxHandle) {
	t.Helper()
	f := newFake(t)
	f.withEndpoints()
	c := mustClient(t, f.srv.URL, WithAPIKey("k"))
	sb, err := c.Sandbox(context.Background(), "sb1")
	if err != nil {
		t.Fatal(err)
	}
	return f, sb
}

// agent registers an agent route that checks the token.
func (f *fake) agent(pattern string, h http.HandlerFunc) {
	method, p, _ := strings.Cut(pattern, " ")
	f.handle(method+" /agent"+p, func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("X-EXECD-ACCESS-TOKEN") != agentToken {
			writeJSON(w, 401, map[string]string{"error": "Unauthorized: invalid or missing header X-EXECD-ACCESS-TOKEN"})
			return
		}
		h(w, r)
	})
}

func stream(events ...string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		for _, e := range events {
			_, _ = io.WriteString(w, e)
			w.(http.Flusher).Flush()
		}
	}
}

func TestRunBothFramings(t *testing.T) {
	bare := stream(`{"type":"init","text":"c1","timestamp":1}`+"\n\n",
		`{"type":"ping","text":"pong"}`+"\n\n",
		`{"type":"stdout","text":"hello"}`+"\n\n",
		`{"type":"stderr","text":"warn"}`+"\n\n",
		`{"type":"stdout","text":"world"}`+"\n\n",
		`{"type":"execution_complete","execution_time":12}`+"\n\n")
	sse := stream("event: init\ndata: {\"type\":\"init\",\"text\":\"c1\"}\n\n",
		"data: {\"type\":\"stdout\",\"text\":\"hello\"}\n\n",
		": keepalive\n\n",
		"data: {\"type\":\"stderr\",\"text\":\"warn\"}\n\ndata: {\"type\":\"stdout\",\"text\":\"world\"}\n\n",
		"data: {\"type\":\"execution_complete\",\"execution_time\":12}\n\n")
	for name, h := range map[string]http.HandlerFunc{"bare": bare, "sse": sse} {
		t.Run(name, func(t *testing.T) {
			f, sb := agentFake(t)
			f.agent("POST /command", h)
			var events []string
			x, err := sb.Run(context.Background(), "echo hello", RunOptions{Cwd: "/tmp", Env: map[string]string{"A": "1"}, Timeout: 1500 * time.Millisecond},
				Handlers{
					OnInit:     func(id string) { events = append(events, "init "+id) },
					OnStdout:   func(l string) { events = append(events, "out "+l) },
					OnStderr:   func(l string) { events = append(events, "err "+l) },
					OnError:    func(e *ExecutionError) { events = append(events, "error") },
					OnComplete: func(x *Execution) { events = append(events, "complete") },
				})
			if err != nil {
				t.Fatal(err)
			}
			want := []string{"init c1", "out hello", "err warn", "out world", "complete"}
			if !reflect.DeepEqual(events, want) {
				t.Fatalf("events %q", events)
			}
			if x.ID != "c1" || x.ExitCode != 0 || x.Stdout != "hello\nworld\n" || x.Stderr != "warn\n" || x.Error != nil || x.Elapsed != 12*time.Millisecond {
				t.Fatalf("execution %+v", x)
			}
			r := f.last("/agent/command")
			want2 := map[string]any{"command": "echo hello", "cwd": "/tmp", "envs": map[string]any{"A": "1"}, "timeout": 1500.0}
			if got := decodeBody(t, r.Body); !reflect.DeepEqual(got, want2) {
				t.Fatalf("body %v", got)
			}
			if r.Header.Get(APIKeyHeader) != "" {
				t.Fatal("the lifecycle API key leaked to the agent")
			}
		})
	}
}

func TestRunNonZeroExitAndFailures(t *testing.T) {
	f, sb := agentFake(t)
	f.agent("POST /command", func(w http.ResponseWriter, r *http.Request) {
		var in struct {
			Command    string `json:"command"`
			Background bool   `json:"background"`
		}
		_ = json.NewDecoder(r.Body).Decode(&in)
		switch in.Command {
		case "exit 3":
			stream(`{"type":"init","text":"c2"}`+"\n\n", `{"type":"error","error":{"ename":"CommandExecError","evalue":"3","traceback":["exit status 3"]}}`+"\n\n")(w, r)
		case "nostart":
			stream(`{"type":"init","text":"c3"}`+"\n\n", `{"type":"error","error":{"ename":"CommandExecError","evalue":"fork/exec: no such file","traceback":[]}}`+"\n\n")(w, r)
		case "cut":
			stream(`{"type":"init","text":"c4"}`+"\n\n", `{"type":"stdout","text":"partial"}`+"\n\n")(w, r)
		case "bg":
			if !in.Background {
				writeJSON(w, 400, map[string]string{"code": "INVALID_REQUEST_BODY", "message": "expected background"})
				return
			}
			stream(`{"type":"init","text":"c5"}`+"\n\n", `{"type":"execution_complete"}`+"\n\n")(w, r)
		default:
			writeJSON(w, 400, map[string]string{"code": "INVALID_REQUEST_BODY", "message": "command is required"})
		}
	})
	ctx := context.Background()
	var gotErr *ExecutionError
	x, err := sb.Run(ctx, "exit 3", RunOptions{}, Handlers{OnError: func(e *ExecutionError) { gotErr = e }})
	if err != nil || x.ExitCode != 3 || x.Error == nil || gotErr == nil || gotErr.Traceback[0] != "exit status 3" {
		t.Fatalf("exit 3: %+v %v", x, err)
	}
	x, err = sb.Run(ctx, "nostart", RunOptions{}, Handlers{})
	if err != nil || x.ExitCode != -1 || !strings.Contains(x.Error.Value, "no such file") {
		t.Fatalf("nostart: %+v %v", x, err)
	}
	x, err = sb.Run(ctx, "cut", RunOptions{}, Handlers{})
	if !errors.Is(err, io.ErrUnexpectedEOF) || x.Stdout != "partial\n" {
		t.Fatalf("cut: %+v %v", x, err)
	}
	x, err = sb.Run(ctx, "bg", RunOptions{Background: true}, Handlers{})
	if err != nil || x.ID != "c5" || x.ExitCode != 0 {
		t.Fatalf("bg: %+v %v", x, err)
	}
	if _, err = sb.Run(ctx, "", RunOptions{}, Handlers{}); !IsInvalid(err) || err.(*APIError).Code != "INVALID_REQUEST_BODY" {
		t.Fatalf("empty: %v", err)
	}
}

func TestRunNotRetried(t *testing.T) {
	f := newFake(t)
	f.withEndpoints()
	var n atomic.Int32
	f.handle("POST /agent/command", counting(&n, 5, 503, ""))
	c := mustClient(t, f.srv.URL, WithRetry(3, time.Millisecond))
	sb, err := c.Sandbox(context.Background(), "sb1")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := sb.Run(context.Background(), "true", RunOptions{}, Handlers{}); err == nil || n.Load() != 1 {
		t.Fatalf("err %v attempts %d", err, n.Load())
	}
}

func TestCommandStatusLogsInterrupt(t *testing.T) {
	f, sb := agentFake(t)
	f.agent("GET /command/status/{id}", func(w http.ResponseWriter, r *http.Request) {
		if r.PathValue("id") != "c1" {
			writeJSON(w, 404, map[string]string{"code": "CONTEXT_NOT_FOUND", "message": "no such command"})
			return
		}
		_, _ = io.WriteString(w, `{"id":"c1","content":"sleep 1","running":false,"exit_code":2,"started_at":"2026-01-02T03:04:00Z","finished_at":"2026-01-02T03:04:01Z"}`)
	})
	f.agent("GET /command/{id}/{what}", func(w http.ResponseWriter, r *http.Request) {
		all := "one\ntwo\n"
		cur, _ := strconv.Atoi(r.URL.Query().Get("cursor"))
		if r.PathValue("what") != "logs" || cur < 0 || cur > len(all) {
			writeJSON(w, 400, map[string]string{"code": "INVALID_REQUEST_BODY", "message": "bad"})
			return
		}
		w.Header().Set("EXECD-COMMANDS-TAIL-CURSOR", strconv.Itoa(len(all)))
		_, _ = io.WriteString(w, all[cur:])
	})
	f.agent("DELETE /command", func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Query().Get("id") == "" {
			writeJSON(w, 400, map[string]string{"code": "MISSING_QUERY", "message": "id"})
		}
	})
	ctx := context.Background()
	st, err := sb.CommandStatus(ctx, "c1")
	if err != nil || st.Running || st.ExitCode == nil || *st.ExitCode != 2 || st.FinishedAt == nil || st.Content != "sleep 1" {
		t.Fatalf("status %+v %v", st, err)
	}
	if _, err := sb.CommandStatus(ctx, "nope"); !IsNotFound(err) {
		t.Fatalf("unknown command: %v", err)
	}
	logs, next, err := sb.CommandLogs(ctx, "c1", 0)
	if err != nil || logs != "one\ntwo\n" || next != 8 || f.last("/agent/command/c1/logs").RawQuery != "" {
		t.Fatalf("logs %q %d %v", logs, next, err)
	}
	logs, next, err = sb.CommandLogs(ctx, "c1", 4)
	if err != nil || logs != "two\n" || next != 8 || f.last("/agent/command/c1/logs").RawQuery != "cursor=4" {
		t.Fatalf("logs from 4: %q %d %v", logs, next, err)
	}
	if err := sb.Interrupt(ctx, "c1"); err != nil || f.last("/agent/command").RawQuery != "id=c1" {
		t.Fatalf("interrupt %v %q", err, f.last("/agent/command").RawQuery)
	}
}

func TestUploadMultipartShape(t *testing.T) {
	f, sb := agentFake(t)
	type got struct {
		metaName, metaType, fileName, fileType string
		meta                                   map[string]any
		content                                string
	}
	var g got
	var nMeta, nFile int
	f.agent("POST /files/upload", func(w http.ResponseWriter, r *http.Request) {
		// Parse exactly as the agent does: both parts are form files.
		if err := r.ParseMultipartForm(1 << 20); err != nil {
			writeJSON(w, 400, map[string]string{"code": "INVALID_FILE", "message": err.Error()})
			return
		}
		metas, files := r.MultipartForm.File["metadata"], r.MultipartForm.File["file"]
		nMeta, nFile = len(metas), len(files)
		if nMeta != 1 || nFile != 1 || len(r.MultipartForm.Value) != 0 {
			writeJSON(w, 400, map[string]string{"code": "INVALID_FILE_METADATA", "message": "counts"})
			return
		}
		g.metaName, g.metaType = metas[0].Filename, metas[0].Header.Get("Content-Type")
		g.fileName, g.fileType = files[0].Filename, files[0].Header.Get("Content-Type")
		mf, _ := metas[0].Open()
		_ = json.NewDecoder(mf).Decode(&g.meta)
		ff, _ := files[0].Open()
		b, _ := io.ReadAll(ff)
		g.content = string(b)
	})
	if err := sb.Upload(context.Background(), "/work/dir/a.txt", strings.NewReader("payload"), 0o640); err != nil {
		t.Fatal(err)
	}
	if nMeta != 1 || nFile != 1 {
		t.Fatalf("parts: %d metadata, %d file", nMeta, nFile)
	}
	want := got{metaName: "metadata", metaType: "application/json", fileName: "a.txt", fileType: "application/octet-stream",
		meta: map[string]any{"path": "/work/dir/a.txt", "mode": 640.0}, content: "payload"}
	if !reflect.DeepEqual(g, want) {
		t.Fatalf("upload\n got %+v\nwant %+v", g, want)
	}
	if !strings.HasPrefix(f.last("/agent/files/upload").Header.Get("Content-Type"), "multipart/form-data; boundary=") {
		t.Fatal("not multipart/form-data")
	}
}

func TestUploadErrorStopsReading(t *testing.T) {
	f, sb := agentFake(t)
	f.agent("POST /files/upload", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, 400, map[string]string{"code": "INVALID_FILE", "message": "nope"})
	})
	// A large body the server never reads: Upload must still return.
	err := sb.Upload(context.Background(), "/a", io.LimitReader(zeros{}, 64<<20), 0)
	if !IsInvalid(err) {
		t.Fatalf("err %v", err)
	}
}

type zeros struct{}

func (zeros) Read(p []byte) (int, error) { clear(p); return len(p), nil }

func TestFiles(t *testing.T) {
	f, sb := agentFake(t)
	f.agent("GET /files/download", func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Query().Get("path") != "/etc/x y" {
			writeJSON(w, 404, map[string]string{"code": "FILE_NOT_FOUND", "message": "no"})
			return
		}
		_, _ = io.WriteString(w, "content")
	})
	const info = `{"path":"/d/f","type":"file","size":3,"modified_at":"2026-01-02T03:04:00Z","created_at":"2026-01-02T03:04:00Z","owner":"root","group":"root","mode":755}`
	f.agent("GET /directories/list", raw(200, "["+info+"]"))
	f.agent("GET /files/info", raw(200, `{"/d/f":`+info+`}`))
	f.agent("DELETE /files", raw(200, ""))
	f.agent("POST /directories", raw(200, ""))
	ctx := context.Background()

	rc, err := sb.Download(ctx, "/etc/x y")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(rc)
	rc.Close()
	if string(b) != "content" {
		t.Fatalf("download %q", b)
	}
	if _, err := sb.Download(ctx, "/missing"); !IsNotFound(err) || err.(*APIError).Code != "FILE_NOT_FOUND" {
		t.Fatalf("missing: %v", err)
	}

	ls, err := sb.ListDir(ctx, "/d")
	if err != nil || len(ls) != 1 || ls[0].Perm() != 0o755 || ls[0].Type != "file" {
		t.Fatalf("list %+v %v", ls, err)
	}
	if q := f.last("/agent/directories/list").RawQuery; q != "path=%2Fd" {
		t.Fatalf("list query %q", q)
	}
	fi, err := sb.FileInfo(ctx, "/d/f", "/d/g")
	if err != nil || fi["/d/f"].Size != 3 {
		t.Fatalf("info %+v %v", fi, err)
	}
	q, _ := url.ParseQuery(f.last("/agent/files/info").RawQuery)
	if !reflect.DeepEqual(q["path"], []string{"/d/f", "/d/g"}) {
		t.Fatalf("info query %v", q)
	}
	if err := sb.DeleteFiles(ctx, "/a", "/b"); err != nil {
		t.Fatal(err)
	}
	q, _ = url.ParseQuery(f.last("/agent/files").RawQuery)
	if !reflect.DeepEqual(q["path"], []string{"/a", "/b"}) {
		t.Fatalf("delete query %v", q)
	}
	if err := sb.Mkdir(ctx, "/d/e", 0o700); err != nil {
		t.Fatal(err)
	}
	if b := f.last("/agent/directories").Body; string(b) != `{"/d/e":{"mode":700}}` {
		t.Fatalf("mkdir body %q", b)
	}
}

func TestAgentUnauthorized(t *testing.T) {
	f := newFake(t)
	f.handle("GET /v1/sandboxes/{id}/endpoints/{port}", raw(200, `{"endpoint":"`+f.host()+`/agent"}`)) // no token handed out
	f.agent("GET /ping", raw(200, ""))
	c := mustClient(t, f.srv.URL)
	sb, err := c.Sandbox(context.Background(), "sb1")
	if err != nil {
		t.Fatal(err)
	}
	err = sb.Ping(context.Background())
	if !IsUnauthorized(err) || !strings.Contains(err.(*APIError).Message, "X-EXECD-ACCESS-TOKEN") {
		t.Fatalf("err %v", err)
	}
}

func TestSandboxResolveErrors(t *testing.T) {
	f := newFake(t)
	f.handle("GET /v1/sandboxes/{id}/endpoints/{port}", raw(404, `{"code":"SANDBOX::NOT_FOUND","message":"no sandbox"}`))
	c := mustClient(t, f.srv.URL)
	if _, err := c.Sandbox(context.Background(), "gone"); !IsNotFound(err) {
		t.Fatalf("err %v", err)
	}
}

func TestServerProxyOption(t *testing.T) {
	f := newFake(t)
	f.handle("GET /v1/sandboxes/{id}/endpoints/{port}", func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Query().Get("use_server_proxy") != "true" {
			writeJSON(w, 400, map[string]string{"code": "X", "message": "expected proxy"})
			return
		}
		writeJSON(w, 200, map[string]any{"endpoint": f.host() + "/sandboxes/sb1/proxy/44772", "headers": map[string]string{"X-EXECD-ACCESS-TOKEN": agentToken}})
	})
	f.handle("GET /sandboxes/{id}/proxy/44772/ping", raw(200, ""))
	c := mustClient(t, f.srv.URL, WithServerProxy())
	sb, err := c.Sandbox(context.Background(), "sb1")
	if err != nil {
		t.Fatal(err)
	}
	if err := sb.Ping(context.Background()); err != nil {
		t.Fatal(err)
	}
	if r := f.last("/sandboxes/sb1/proxy"); r.Header.Get("X-EXECD-ACCESS-TOKEN") != agentToken {
		t.Fatalf("headers %v", r.Header)
	}
}

func TestEgressPolicy(t *testing.T) {
	f, sb := agentFake(t)
	var lastBody []byte
	f.handle("/sandboxes/{id}/proxy/18080/policy", func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("OPENSANDBOX-EGRESS-AUTH") != egressToken {
			http.Error(w, "unauthorized", http.StatusUnauthorized)
			return
		}
		lastBody, _ = io.ReadAll(r.Body)
		switch r.Method {
		case "GET":
			_, _ = io.WriteString(w, `{"status":"ok","mode":"deny_all","enforcementMode":"dns+nft","policy":{"defaultAction":"deny","egress":[]}}`)
		case "PATCH":
			if string(lastBody) == `[{"action":"allow","target":"bad target"}]` {
				http.Error(w, "invalid policy: bad target", 400)
				return
			}
			_, _ = io.WriteString(w, `{"status":"ok","mode":"enforcing","enforcementMode":"dns+nft","policy":{"defaultAction":"deny","egress":[{"action":"allow","target":"pypi.org"}]}}`)
		}
	})
	ctx := context.Background()
	st, err := sb.GetPolicy(ctx)
	if err != nil || st.Mode != "deny_all" || st.Policy.DefaultAction != "deny" {
		t.Fatalf("get %+v %v", st, err)
	}
	st, err = sb.PatchPolicy(ctx, []NetworkRule{{Action: "allow", Target: "pypi.org"}})
	if err != nil || st.Mode != "enforcing" || len(st.Policy.Egress) != 1 || string(lastBody) != `[{"action":"allow","target":"pypi.org"}]` {
		t.Fatalf("patch %+v %v %q", st, err, lastBody)
	}
	_, err = sb.PatchPolicy(ctx, []NetworkRule{{Action: "allow", Target: "bad target"}})
	if !IsInvalid(err) || err.(*APIError).Message != "invalid policy: bad target" {
		t.Fatalf("bad patch: %v", err)
	}
	if _, err := sb.PatchPolicy(ctx, nil); !IsInvalid(err) {
		t.Fatalf("empty patch: %v", err)
	}
	if n := len(f.requests("/v1/sandboxes/sb1/endpoints/18080")); n != 1 {
		t.Fatalf("egress endpoint resolved %d times", n)
	}
}

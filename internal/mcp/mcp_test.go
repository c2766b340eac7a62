package mcp

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"
	"go.uber.org/goleak"

	"github.com/moat-sandbox/moat/client"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const testKey = "test-key"

// connect serves a Server over the SDK's in-memory transport and returns a
// client session to it.
func connect(t *testing.T, baseURL string, opts Options) *sdk.ClientSession {
	t.Helper()
	c, err := client.New(baseURL, client.WithAPIKey(testKey))
	if err != nil {
		t.Fatal(err)
	}
	opts.Client = c
	srv, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	st, ct := sdk.NewInMemoryTransports()
	ss, err := srv.MCP().Connect(ctx, st, nil)
	if err != nil {
		t.Fatal(err)
	}
	cs, err := sdk.NewClient(&sdk.Implementation{Name: "test", Version: "v0"}, nil).Connect(ctx, ct, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cs.Close()
		ss.Wait()
	})
	return cs
}

// call calls a tool; it fails the test on a protocol error.
func call(t *testing.T, cs *sdk.ClientSession, name string, args map[string]any) *sdk.CallToolResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	res, err := cs.CallTool(ctx, &sdk.CallToolParams{Name: name, Arguments: args})
	if err != nil {
		t.Fatalf("%s: protocol error: %v", name, err)
	}
	return res
}

// ok calls a tool that must succeed and decodes its structured output.
func ok[T any](t *testing.T, cs *sdk.ClientSession, name string, args map[string]any) T {
	t.Helper()
	res := call(t, cs, name, args)
	if res.IsError {
		t.Fatalf("%s(%v): tool error %s", name, args, text(res))
	}
	var out T
	b, _ := json.Marshal(res.StructuredContent)
	if err := json.Unmarshal(b, &out); err != nil {
		t.Fatalf("%s: decode %s: %v", name, b, err)
	}
	// The text content mirrors the structured content for older clients.
	if !json.Valid([]byte(text(res))) {
		t.Fatalf("%s: text content is not JSON: %s", name, text(res))
	}
	return out
}

// fails calls a tool that must fail and returns its {code, message}.
func fails(t *testing.T, cs *sdk.ClientSession, name string, args map[string]any) toolError {
	t.Helper()
	res := call(t, cs, name, args)
	if !res.IsError {
		t.Fatalf("%s(%v): succeeded, want a tool error: %s", name, args, text(res))
	}
	var e toolError
	if err := json.Unmarshal([]byte(text(res)), &e); err != nil || e.Code == "" || e.Message == "" {
		t.Fatalf("%s: error text %q is not {code, message}", name, text(res))
	}
	return e
}

func text(res *sdk.CallToolResult) string {
	var b strings.Builder
	for _, c := range res.Content {
		if tc, ok := c.(*sdk.TextContent); ok {
			b.WriteString(tc.Text)
		}
	}
	return b.String()
}

func TestListTools(t *testing.T) {
	f := newFakeMoat(t)
	cs := connect(t, f.srv.URL, Options{})
	res, err := cs.ListTools(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string][]string{ // tool -> required arguments
		"sandbox_create": {"image"}, "sandbox_list": nil, "sandbox_get": {"sandbox_id"}, "sandbox_delete": {"sandbox_id"},
		"sandbox_pause": {"sandbox_id"}, "sandbox_resume": {"sandbox_id"},
		"exec": {"sandbox_id", "command"}, "file_write": {"sandbox_id", "path"}, "file_read": {"sandbox_id", "path"},
		"file_list": {"sandbox_id", "path"},
	}
	got := map[string]bool{}
	for _, tool := range res.Tools {
		got[tool.Name] = true
		req, known := want[tool.Name]
		if !known {
			t.Errorf("unexpected tool %s", tool.Name)
			continue
		}
		if len(tool.Description) < 30 || tool.Annotations == nil {
			t.Errorf("%s: description %q / annotations %v too thin for a model", tool.Name, tool.Description, tool.Annotations)
		}
		schema, _ := tool.InputSchema.(map[string]any)
		if schema["type"] != "object" {
			t.Errorf("%s: input schema %v", tool.Name, schema)
		}
		var required []string
		reqs, _ := schema["required"].([]any)
		for _, r := range reqs {
			required = append(required, r.(string))
		}
		if !slices.Equal(required, req) {
			t.Errorf("%s: required %v, want %v", tool.Name, required, req)
		}
		props, _ := schema["properties"].(map[string]any)
		for name, p := range props {
			if d, _ := p.(map[string]any)["description"].(string); d == "" && name != "sandbox_id" && name != "path" {
				t.Errorf("%s.%s has no description", tool.Name, name)
			}
		}
		if tool.OutputSchema == nil {
			t.Errorf("%s: no output schema", tool.Name)
		}
	}
	for name := range want {
		if !got[name] {
			t.Errorf("tool %s missing", name)
		}
	}
	if ins := cs.InitializeResult().Instructions; !strings.Contains(ins, "sandbox_create") {
		t.Errorf("instructions %q", ins)
	}
}

func TestSandboxLifecycle(t *testing.T) {
	f := newFakeMoat(t)
	cs := connect(t, f.srv.URL, Options{SandboxTimeout: 30 * time.Minute})

	// A slow sandbox is polled until Running; defaults fill the request.
	sb := ok[SandboxInfo](t, cs, "sandbox_create", map[string]any{"image": "img/slow", "env": map[string]string{"A": "1"},
		"metadata": map[string]string{"team": "ml"}, "resources": map[string]string{"cpu": "1", "memory": "512Mi"}})
	if sb.ID != "sb1" || sb.State != "Running" || sb.Image != "img/slow" || sb.Metadata["team"] != "ml" {
		t.Fatalf("created %+v", sb)
	}
	body := f.creates[0]
	if body["timeout"] != 1800.0 || !slices.Equal(toStrings(body["entrypoint"]), []string{"tail", "-f", "/dev/null"}) ||
		body["env"].(map[string]any)["A"] != "1" || body["resourceLimits"].(map[string]any)["memory"] != "512Mi" {
		t.Fatalf("create body %v", body)
	}
	// An explicit timeout and entrypoint win.
	ok[SandboxInfo](t, cs, "sandbox_create", map[string]any{"image": "img/ok", "timeout_seconds": 120, "entrypoint": []string{"sleep", "1d"}})
	if body := f.creates[1]; body["timeout"] != 120.0 || !slices.Equal(toStrings(body["entrypoint"]), []string{"sleep", "1d"}) {
		t.Fatalf("create body %v", body)
	}

	l := ok[ListOutput](t, cs, "sandbox_list", map[string]any{"states": []string{"Running"}})
	if l.Total != 2 || len(l.Sandboxes) != 2 || l.Sandboxes[0].ID != "sb1" || l.HasMore {
		t.Fatalf("list %+v", l)
	}
	if got := ok[SandboxInfo](t, cs, "sandbox_pause", map[string]any{"sandbox_id": "sb1"}); got.State != "Paused" {
		t.Fatalf("pause %+v", got)
	}
	if e := fails(t, cs, "sandbox_pause", map[string]any{"sandbox_id": "sb1"}); e.Code != "SANDBOX::INVALID_STATE" {
		t.Fatalf("double pause %+v", e)
	}
	if got := ok[SandboxInfo](t, cs, "sandbox_resume", map[string]any{"sandbox_id": "sb1"}); got.State != "Running" {
		t.Fatalf("resume %+v", got)
	}
	if got := ok[SandboxInfo](t, cs, "sandbox_get", map[string]any{"sandbox_id": "sb2"}); got.ID != "sb2" || got.CreatedAt != "2026-01-02T03:04:05Z" {
		t.Fatalf("get %+v", got)
	}
	if d := ok[DeleteOutput](t, cs, "sandbox_delete", map[string]any{"sandbox_id": "sb2"}); !d.Deleted {
		t.Fatalf("delete %+v", d)
	}
	if e := fails(t, cs, "sandbox_get", map[string]any{"sandbox_id": "sb2"}); e.Code != "SANDBOX::NOT_FOUND" || !strings.Contains(e.Message, "sb2") {
		t.Fatalf("get deleted %+v", e)
	}
	for _, k := range f.apiKeys {
		if k != testKey {
			t.Fatalf("lifecycle call with API key %q", k)
		}
	}
}

func toStrings(v any) []string {
	var out []string
	for _, x := range v.([]any) {
		out = append(out, x.(string))
	}
	return out
}

func TestCreateFailureDeletesSandbox(t *testing.T) {
	f := newFakeMoat(t)
	cs := connect(t, f.srv.URL, Options{})
	e := fails(t, cs, "sandbox_create", map[string]any{"image": "img/fail"})
	if e.Code != codeSandboxFailed || !strings.Contains(e.Message, "Failed: image_pull_failed") || !strings.Contains(e.Message, "was deleted") {
		t.Fatalf("error %+v", e)
	}
	if !slices.Equal(f.deletes, []string{"sb1"}) || len(f.sandboxes) != 0 {
		t.Fatalf("deletes %v, left %v", f.deletes, f.sandboxes)
	}
	// No expiry by default when Options.SandboxTimeout is 0.
	if _, has := f.creates[0]["timeout"]; has {
		t.Fatalf("create body %v", f.creates[0])
	}
}

func TestCreateWaitTimeout(t *testing.T) {
	f := newFakeMoat(t)
	cs := connect(t, f.srv.URL, Options{WaitTimeout: 50 * time.Millisecond})
	e := fails(t, cs, "sandbox_create", map[string]any{"image": "img/slow"})
	if e.Code != codeTimeout || !strings.Contains(e.Message, "still Pending") {
		t.Fatalf("error %+v", e)
	}
	if !slices.Equal(f.deletes, []string{"sb1"}) {
		t.Fatalf("deletes %v", f.deletes)
	}
}

func TestExec(t *testing.T) {
	f := newFakeMoat(t)
	cs := connect(t, f.srv.URL, Options{})
	ok[SandboxInfo](t, cs, "sandbox_create", map[string]any{"image": "img/ok"})

	x := ok[ExecOutput](t, cs, "exec", map[string]any{"sandbox_id": "sb1", "command": "echo hi; exit 3", "cwd": "/work", "env": map[string]string{"K": "v"}})
	if x.ExitCode != 3 || x.Stdout != "hi\n" || x.Stderr != "" || x.Truncated || x.TimedOut || x.Error != "" {
		t.Fatalf("exec %+v", x)
	}
	body := f.commands[0]
	if body["cwd"] != "/work" || body["envs"].(map[string]any)["K"] != "v" || body["timeout"] != 120000.0 {
		t.Fatalf("command body %v", body)
	}
	x = ok[ExecOutput](t, cs, "exec", map[string]any{"sandbox_id": "sb1", "command": "ok", "timeout_seconds": 5})
	if x.ExitCode != 0 || x.Stdout != "out\n" || x.Stderr != "err\n" || f.commands[1]["timeout"] != 5000.0 {
		t.Fatalf("exec ok %+v", x)
	}

	// 500 lines of 101 bytes against a 1000-byte cap: 500 bytes of head
	// and of tail are kept, with a marker between them.
	x = ok[ExecOutput](t, cs, "exec", map[string]any{"sandbox_id": "sb1", "command": "spam 500", "max_output_bytes": 1000})
	if !x.Truncated || x.ExitCode != 0 || len(x.Stdout) != 1000+len("\n[... 49500 bytes omitted ...]\n") || !strings.HasPrefix(x.Stdout, "line 0000 ") ||
		!strings.HasSuffix(x.Stdout, "line 0499 "+strings.Repeat("x", 90)+"\n") || !strings.Contains(x.Stdout, "[... 49500 bytes omitted ...]") {
		t.Fatalf("truncated exec: %d bytes, truncated=%v:\n%s", len(x.Stdout), x.Truncated, x.Stdout)
	}

	x = ok[ExecOutput](t, cs, "exec", map[string]any{"sandbox_id": "sb1", "command": "sleep", "timeout_seconds": 1})
	if !x.TimedOut || x.ExitCode != -1 || !strings.Contains(x.Error, "signal: killed") {
		t.Fatalf("timed out exec %+v", x)
	}

	// Infrastructure failures are tool errors, not results.
	if e := fails(t, cs, "exec", map[string]any{"sandbox_id": "nope", "command": "ok"}); e.Code != "SANDBOX::NOT_FOUND" {
		t.Fatalf("unknown sandbox %+v", e)
	}
	if e := fails(t, cs, "exec", map[string]any{"sandbox_id": "sb1", "command": "cut"}); e.Code != codeUpstream || !strings.Contains(e.Message, "ended before completion") {
		t.Fatalf("cut stream %+v", e)
	}
}

func TestFiles(t *testing.T) {
	f := newFakeMoat(t)
	cs := connect(t, f.srv.URL, Options{})
	ok[SandboxInfo](t, cs, "sandbox_create", map[string]any{"image": "img/ok"})

	w := ok[FileWriteOutput](t, cs, "file_write", map[string]any{"sandbox_id": "sb1", "path": "/work/a.py", "content": "print('héllo')\n", "mode": "0755"})
	if w.BytesWritten != 16 || f.sandboxes["sb1"].files["/work/a.py"].mode != 755 {
		t.Fatalf("write %+v, stored %+v", w, f.sandboxes["sb1"].files)
	}
	r := ok[FileReadOutput](t, cs, "file_read", map[string]any{"sandbox_id": "sb1", "path": "/work/a.py"})
	if r.Encoding != "text" || r.Content != "print('héllo')\n" || r.Truncated || r.BytesRead != 16 {
		t.Fatalf("read %+v", r)
	}
	// A cut inside a multi-byte character keeps the text whole.
	r = ok[FileReadOutput](t, cs, "file_read", map[string]any{"sandbox_id": "sb1", "path": "/work/a.py", "max_bytes": 9})
	if r.Encoding != "text" || r.Content != "print('h" || !r.Truncated || r.BytesRead != 8 {
		t.Fatalf("truncated read %+v", r)
	}

	bin := []byte{0x89, 'P', 'N', 'G', 0, 1, 2, 0xff}
	ok[FileWriteOutput](t, cs, "file_write", map[string]any{"sandbox_id": "sb1", "path": "/work/b.bin", "content_base64": base64.StdEncoding.EncodeToString(bin)})
	r = ok[FileReadOutput](t, cs, "file_read", map[string]any{"sandbox_id": "sb1", "path": "/work/b.bin"})
	if got, _ := base64.StdEncoding.DecodeString(r.Content); r.Encoding != "base64" || string(got) != string(bin) || r.BytesRead != len(bin) {
		t.Fatalf("binary read %+v", r)
	}
	ok[FileWriteOutput](t, cs, "file_write", map[string]any{"sandbox_id": "sb1", "path": "/work/empty"})

	l := ok[FileListOutput](t, cs, "file_list", map[string]any{"sandbox_id": "sb1", "path": "/work"})
	if len(l.Entries) != 3 || l.Entries[0].Name != "a.py" || l.Entries[0].Mode != "0755" || l.Entries[0].Size != 16 || l.Entries[2].Name != "empty" {
		t.Fatalf("list %+v", l)
	}

	if e := fails(t, cs, "file_read", map[string]any{"sandbox_id": "sb1", "path": "/nope"}); e.Code != "FILE_NOT_FOUND" || !strings.Contains(e.Message, "/nope") {
		t.Fatalf("missing file %+v", e)
	}
	if e := fails(t, cs, "file_list", map[string]any{"sandbox_id": "sb1", "path": "/nope"}); e.Code != "FILE_NOT_FOUND" {
		t.Fatalf("missing dir %+v", e)
	}
}

// TestArgumentValidation: bad arguments never reach the server and always
// come back as {code, message} tool errors, whether the SDK's schema check
// or a handler rejects them.
func TestArgumentValidation(t *testing.T) {
	f := newFakeMoat(t)
	cs := connect(t, f.srv.URL, Options{})
	ok[SandboxInfo](t, cs, "sandbox_create", map[string]any{"image": "img/ok"})
	before := len(f.apiKeys)
	for i, tc := range []struct {
		tool string
		args map[string]any
		want string // substring of the message
	}{
		{"sandbox_create", map[string]any{}, "image"},
		{"sandbox_create", map[string]any{"image": "  "}, "image is required"},
		{"sandbox_create", map[string]any{"image": "img/ok", "timeout_seconds": 5}, "at least 60"},
		{"sandbox_create", map[string]any{"image": "img/ok", "timeout_seconds": "soon"}, "timeout_seconds"},
		{"sandbox_create", map[string]any{"image": "img/ok", "entrypoint": []string{""}}, "entrypoint"},
		{"sandbox_create", map[string]any{"image": "img/ok", "bogus": 1}, "bogus"},
		{"sandbox_list", map[string]any{"page_size": 1000}, "page_size"},
		{"sandbox_get", map[string]any{"sandbox_id": ""}, "sandbox_id is required"},
		{"sandbox_delete", map[string]any{}, "sandbox_id"},
		{"exec", map[string]any{"sandbox_id": "sb1"}, "command"},
		{"exec", map[string]any{"sandbox_id": "sb1", "command": " "}, "command is required"},
		{"exec", map[string]any{"sandbox_id": "sb1", "command": "ok", "timeout_seconds": 99999}, "timeout_seconds"},
		{"exec", map[string]any{"sandbox_id": "sb1", "command": "ok", "max_output_bytes": -1}, "max_output_bytes"},
		{"exec", map[string]any{"sandbox_id": "sb1", "command": "ok", "env": []string{"A=1"}}, "env"},
		{"file_write", map[string]any{"sandbox_id": "sb1", "path": "/a", "content": "x", "content_base64": "eA=="}, "not both"},
		{"file_write", map[string]any{"sandbox_id": "sb1", "path": "/a", "content_base64": "%%%"}, "base64"},
		{"file_write", map[string]any{"sandbox_id": "sb1", "path": "/a", "mode": "rwx"}, "octal"},
		{"file_write", map[string]any{"sandbox_id": "sb1", "path": "", "content": "x"}, "path is required"},
		{"file_read", map[string]any{"sandbox_id": "sb1", "path": "/a", "max_bytes": 1 << 30}, "max_bytes"},
		{"file_read", map[string]any{"sandbox_id": "sb1", "path": "/a\x00b"}, "NUL"},
	} {
		e := fails(t, cs, tc.tool, tc.args)
		if e.Code != codeInvalidArgument || !strings.Contains(e.Message, tc.want) {
			t.Errorf("%d: %s(%v): %+v, want %s mentioning %q", i, tc.tool, tc.args, e, codeInvalidArgument, tc.want)
		}
	}
	if after := len(f.apiKeys); after != before {
		t.Errorf("invalid calls reached the server %d times", after-before)
	}
	// Server-side rejections keep the server's code.
	if e := fails(t, cs, "sandbox_create", map[string]any{"image": "img/bad"}); e.Code != "SANDBOX::INVALID_IMAGE" || !strings.Contains(e.Message, "img/bad") {
		t.Fatalf("bad image %+v", e)
	}
	// An unknown tool is a protocol error (the SDK's), not a crash.
	if _, err := cs.CallTool(context.Background(), &sdk.CallToolParams{Name: "rm_rf"}); err == nil {
		t.Fatal("unknown tool accepted")
	}
}

func TestServerUnreachable(t *testing.T) {
	dead := httptest.NewServer(http.NotFoundHandler())
	url := dead.URL
	dead.Close()
	cs := connect(t, url, Options{})
	for _, tc := range []struct {
		tool string
		args map[string]any
	}{
		{"sandbox_list", map[string]any{}},
		{"sandbox_create", map[string]any{"image": "img/ok"}},
		{"exec", map[string]any{"sandbox_id": "sb1", "command": "ok"}},
	} {
		if e := fails(t, cs, tc.tool, tc.args); e.Code != codeUpstream || !strings.Contains(e.Message, "connection refused") {
			t.Errorf("%s: %+v", tc.tool, e)
		}
	}
}

func TestPanicIsToolError(t *testing.T) {
	f := newFakeMoat(t)
	c, _ := client.New(f.srv.URL)
	srv, err := New(Options{Client: c})
	if err != nil {
		t.Fatal(err)
	}
	sdk.AddTool(srv.MCP(), &sdk.Tool{Name: "boom", Description: "panics"}, func(context.Context, *sdk.CallToolRequest, struct{}) (*sdk.CallToolResult, struct{}, error) {
		panic("secret detail")
	})
	st, ct := sdk.NewInMemoryTransports()
	ss, err := srv.MCP().Connect(context.Background(), st, nil)
	if err != nil {
		t.Fatal(err)
	}
	cs, err := sdk.NewClient(&sdk.Implementation{Name: "t", Version: "v0"}, nil).Connect(context.Background(), ct, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { cs.Close(); ss.Wait() }()
	e := fails(t, cs, "boom", nil)
	if e.Code != codeInternal || strings.Contains(e.Message, "secret") {
		t.Fatalf("panic: %+v", e)
	}
	// The session survives.
	if l := ok[ListOutput](t, cs, "sandbox_list", nil); l.Total != 0 {
		t.Fatalf("list %+v", l)
	}
}

func TestStreamableHTTP(t *testing.T) {
	f := newFakeMoat(t)
	c, _ := client.New(f.srv.URL, client.WithAPIKey(testKey))
	srv, err := New(Options{Client: c})
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(srv.Handler())
	defer hs.Close()
	ctx := context.Background()
	cs, err := sdk.NewClient(&sdk.Implementation{Name: "t", Version: "v0"}, nil).Connect(ctx,
		&sdk.StreamableClientTransport{Endpoint: hs.URL, DisableStandaloneSSE: true}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close()
	sb := ok[SandboxInfo](t, cs, "sandbox_create", map[string]any{"image": "img/ok"})
	x := ok[ExecOutput](t, cs, "exec", map[string]any{"sandbox_id": sb.ID, "command": "echo hi; exit 3"})
	if x.ExitCode != 3 || x.Stdout != "hi\n" {
		t.Fatalf("exec over HTTP %+v", x)
	}
	// DNS rebinding protection: a foreign Host on a loopback listener.
	req, _ := http.NewRequest("POST", hs.URL, strings.NewReader(`{}`))
	req.Host = "evil.example"
	resp, err := hs.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusForbidden {
		t.Fatalf("foreign Host: status %d", resp.StatusCode)
	}
}

func TestNewNeedsClient(t *testing.T) {
	if _, err := New(Options{}); err == nil {
		t.Fatal("New without a client succeeded")
	}
}

package e2e

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"
)

// TestMCP drives `moat mcp` as an MCP host would: a subprocess speaking
// MCP on stdio, talking to a real `moat serve` (native runc) that runs the
// sandboxes.
func TestMCP(t *testing.T) {
	srv := newServer(t)
	ref := startRegistry(t)
	srv.start()

	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.Command(srv.bin, "mcp", "--server", "http://"+srv.addr)
	cmd.Env = append(os.Environ(), "OPEN_SANDBOX_API_KEY="+srv.key)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	cs, err := sdk.NewClient(&sdk.Implementation{Name: "e2e", Version: "v0"}, nil).Connect(ctx,
		&sdk.CommandTransport{Command: cmd, TerminateDuration: 5 * time.Second}, nil)
	if err != nil {
		t.Fatalf("connect to moat mcp: %v\nstderr: %s", err, stderr.String())
	}
	defer func() {
		if err := cs.Close(); err != nil {
			t.Errorf("close: %v", err)
		}
		if cmd.ProcessState == nil || !cmd.ProcessState.Success() {
			t.Errorf("moat mcp did not exit cleanly on stdin EOF: %v\nstderr: %s", cmd.ProcessState, stderr.String())
		}
	}()

	tools, err := cs.ListTools(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, tool := range tools.Tools {
		names = append(names, tool.Name)
	}
	for _, want := range []string{"sandbox_create", "sandbox_list", "sandbox_get", "sandbox_delete", "exec", "file_write", "file_read", "file_list"} {
		if !slices.Contains(names, want) {
			t.Fatalf("tools %v lack %s", names, want)
		}
	}

	callTool := func(name string, args map[string]any, out any) *sdk.CallToolResult {
		t.Helper()
		res, err := cs.CallTool(ctx, &sdk.CallToolParams{Name: name, Arguments: args})
		if err != nil {
			t.Fatalf("%s: %v\nstderr: %s", name, err, stderr.String())
		}
		if out != nil {
			if res.IsError {
				t.Fatalf("%s(%v): tool error %s", name, args, mcpText(res))
			}
			b, _ := json.Marshal(res.StructuredContent)
			if err := json.Unmarshal(b, out); err != nil {
				t.Fatalf("%s: decode %s: %v", name, b, err)
			}
		}
		return res
	}

	var sb struct{ ID, State string }
	callTool("sandbox_create", map[string]any{"image": ref, "timeout_seconds": 600, "metadata": map[string]string{"case": "mcp"}}, &sb)
	t.Logf("sandbox %s", sb.ID)
	if sb.ID == "" || sb.State != "Running" {
		t.Fatalf("created %+v", sb)
	}
	var list struct {
		Sandboxes []struct{ ID string }
		Total     int
	}
	callTool("sandbox_list", map[string]any{"metadata": map[string]string{"case": "mcp"}}, &list)
	if list.Total != 1 || list.Sandboxes[0].ID != sb.ID {
		t.Fatalf("list %+v", list)
	}

	var st struct{ State string }
	if callTool("sandbox_pause", map[string]any{"sandbox_id": sb.ID}, &st); st.State != "Paused" {
		t.Fatalf("pause: %+v", st)
	}
	if callTool("sandbox_resume", map[string]any{"sandbox_id": sb.ID}, &st); st.State != "Running" {
		t.Fatalf("resume: %+v", st)
	}

	var x struct {
		ExitCode       int `json:"exit_code"`
		Stdout, Stderr string
		Truncated      bool
	}
	callTool("exec", map[string]any{"sandbox_id": sb.ID, "command": "echo hi; exit 3"}, &x)
	if x.ExitCode != 3 || x.Stdout != "hi\n" || x.Truncated {
		t.Fatalf("exec %+v", x)
	}
	callTool("exec", map[string]any{"sandbox_id": sb.ID, "command": "echo $FOO; pwd; echo oops >&2", "cwd": "/tmp", "env": map[string]string{"FOO": "bar"}}, &x)
	if x.ExitCode != 0 || x.Stdout != "bar\n/tmp\n" || x.Stderr != "oops\n" {
		t.Fatalf("exec with cwd/env %+v", x)
	}
	// The tool description tells the model to background servers this way;
	// the call must return without waiting for them.
	start := time.Now()
	callTool("exec", map[string]any{"sandbox_id": sb.ID, "command": "nohup sleep 60 > /tmp/s.log 2>&1 & echo started"}, &x)
	if x.ExitCode != 0 || x.Stdout != "started\n" || time.Since(start) > 20*time.Second {
		t.Fatalf("background exec took %s: %+v", time.Since(start), x)
	}
	callTool("exec", map[string]any{"sandbox_id": sb.ID, "command": "seq 1 100000", "max_output_bytes": 4096}, &x)
	if x.ExitCode != 0 || !x.Truncated || !strings.HasPrefix(x.Stdout, "1\n2\n") || !strings.HasSuffix(x.Stdout, "\n100000\n") || len(x.Stdout) > 4200 {
		t.Fatalf("capped exec: exit %d truncated %v, %d bytes", x.ExitCode, x.Truncated, len(x.Stdout))
	}

	const script = "#!/bin/sh\necho \"héllo from $0\"\n"
	var w struct {
		BytesWritten int `json:"bytes_written"`
	}
	callTool("file_write", map[string]any{"sandbox_id": sb.ID, "path": "/work/hi.sh", "content": script, "mode": "755"}, &w)
	if w.BytesWritten != len(script) {
		t.Fatalf("write %+v", w)
	}
	var r struct {
		Encoding, Content string
		Truncated         bool
	}
	callTool("file_read", map[string]any{"sandbox_id": sb.ID, "path": "/work/hi.sh"}, &r)
	if r.Encoding != "text" || r.Content != script || r.Truncated {
		t.Fatalf("read %+v", r)
	}
	callTool("exec", map[string]any{"sandbox_id": sb.ID, "command": "/work/hi.sh"}, &x)
	if x.ExitCode != 0 || x.Stdout != "héllo from /work/hi.sh\n" {
		t.Fatalf("written script did not run with mode 755: %+v", x)
	}
	bin := []byte{0x7f, 'E', 'L', 'F', 0, 0, 0xfe, 0xff}
	callTool("file_write", map[string]any{"sandbox_id": sb.ID, "path": "/work/b.bin", "content_base64": base64.StdEncoding.EncodeToString(bin)}, &w)
	callTool("file_read", map[string]any{"sandbox_id": sb.ID, "path": "/work/b.bin"}, &r)
	if got, _ := base64.StdEncoding.DecodeString(r.Content); r.Encoding != "base64" || string(got) != string(bin) {
		t.Fatalf("binary read %+v", r)
	}
	var dir struct {
		Entries []struct{ Name, Type, Mode string }
	}
	callTool("file_list", map[string]any{"sandbox_id": sb.ID, "path": "/work"}, &dir)
	if len(dir.Entries) != 2 || dir.Entries[0].Name != "b.bin" || dir.Entries[1].Name != "hi.sh" || dir.Entries[1].Mode != "0755" {
		t.Fatalf("list %+v", dir)
	}

	// A server error is a tool error with the server's {code, message}.
	res := callTool("file_read", map[string]any{"sandbox_id": sb.ID, "path": "/work/missing"}, nil)
	if !res.IsError || !strings.Contains(mcpText(res), `"code":"FILE_NOT_FOUND"`) {
		t.Fatalf("missing file: %+v %s", res, mcpText(res))
	}

	var del struct{ Deleted bool }
	callTool("sandbox_delete", map[string]any{"sandbox_id": sb.ID}, &del)
	if !del.Deleted {
		t.Fatalf("delete %+v", del)
	}
	res = callTool("exec", map[string]any{"sandbox_id": sb.ID, "command": "true"}, nil)
	if !res.IsError || !strings.Contains(mcpText(res), "NOT_FOUND") {
		t.Fatalf("exec after delete: %s", mcpText(res))
	}
	if code, body, _ := srv.do("GET", "/v1/sandboxes/"+sb.ID, nil); code != 404 {
		t.Fatalf("sandbox still there: %d %s", code, body)
	}
}

func mcpText(res *sdk.CallToolResult) string {
	var b strings.Builder
	for _, c := range res.Content {
		if tc, ok := c.(*sdk.TextContent); ok {
			b.WriteString(tc.Text)
		}
	}
	return b.String()
}

package execd

import (
	"bufio"
	"context"
	"encoding/binary"
	"encoding/json"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/moat-sandbox/moat/internal/execd/exectest"
	"github.com/moat-sandbox/moat/internal/execd/metrics"
	"github.com/moat-sandbox/moat/internal/execd/pty"
	"github.com/moat-sandbox/moat/internal/execd/wire"
	"github.com/moat-sandbox/moat/internal/web/webtest"
)

func TestSessionPersistsEnvAndCwd(t *testing.T) {
	e := newTestEnv(t)
	st, b := e.Call("POST", "/session", "")
	var cr struct {
		SessionID string `json:"session_id"`
	}
	json.Unmarshal(b, &cr)
	if st != 200 || !exectest.Hex32.MatchString(cr.SessionID) {
		t.Fatalf("create: %d %s", st, b)
	}
	dir := t.TempDir()
	run := func(cmd string) []wire.Event {
		resp := e.Do("POST", "/session/"+cr.SessionID+"/run", map[string]any{"command": cmd})
		defer resp.Body.Close()
		data, _ := io.ReadAll(resp.Body)
		return exectest.ReadEvents(t, data)
	}
	if evs := run("export FOO=bar; cd " + dir + "; echo err >&2"); evs[0].Text != cr.SessionID || evs[1].Type != wire.EvStdout || evs[1].Text != "err" ||
		evs[len(evs)-1].Type != wire.EvExecutionComplete {
		t.Fatalf("run 1: %+v", evs)
	}
	evs := run("echo $FOO; pwd; exit 4")
	if evs[1].Text != "bar" || evs[2].Text != dir || evs[3].Type != wire.EvError || evs[3].Error.EValue != "4" {
		t.Fatalf("run 2: %+v", evs)
	}
	if evs := run("echo $FOO"); evs[1].Text != "bar" {
		t.Fatalf("env lost after exit: %+v", evs)
	}
	st, b = e.Call("POST", "/session/"+cr.SessionID+"/run", "{}")
	exectest.WantError(t, st, b, 400, wire.CodeInvalidRequestBody)
	if st, _ := e.Call("DELETE", "/session/"+cr.SessionID, nil); st != 200 {
		t.Fatal(st)
	}
	st, b = e.Call("DELETE", "/session/"+cr.SessionID, nil)
	exectest.WantError(t, st, b, 404, wire.CodeContextNotFound)
	st, b = e.Call("POST", "/session/nope/run", map[string]any{"command": "true"})
	exectest.WantError(t, st, b, 404, wire.CodeContextNotFound)
}

func TestMetrics(t *testing.T) {
	e := newTestEnv(t)
	st, b := e.Call("GET", "/metrics", nil)
	var m metrics.Metrics
	if err := json.Unmarshal(b, &m); err != nil || st != 200 || m.CPUCount < 1 || m.CPUCount != math.Trunc(m.CPUCount) || m.MemTotalMiB <= 0 || m.MemUsedMiB <= 0 ||
		m.CPUUsedPct < 0 || m.CPUUsedPct > 100 || time.Since(time.UnixMilli(m.Timestamp)) > time.Minute {
		t.Fatalf("metrics: %d %s", st, b)
	}
	for _, k := range []string{"cpu_count", "cpu_used_pct", "mem_total_mib", "mem_used_mib", "timestamp"} {
		if !strings.Contains(string(b), `"`+k+`"`) {
			t.Errorf("missing %s", k)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "GET", e.ts.URL+"/metrics/watch", nil)
	resp, err := e.ts.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	br := bufio.NewReader(resp.Body)
	for range 2 {
		line, err := br.ReadBytes('\n')
		if err != nil || json.Unmarshal(line, &m) != nil || m.CPUCount <= 0 {
			t.Fatalf("watch line %q: %v", line, err)
		}
	}
}

func TestProxy(t *testing.T) {
	backend := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get(TokenHeader) != "" {
			t.Error("token forwarded to the backend")
		}
		if r.URL.Path == "/ws" {
			c, err := websocket.Accept(w, r, nil)
			if err != nil {
				return
			}
			defer c.CloseNow()
			typ, msg, err := c.Read(r.Context())
			if err == nil {
				c.Write(r.Context(), typ, append([]byte("echo:"), msg...))
			}
			c.Close(websocket.StatusNormalClosure, "")
			return
		}
		w.Write([]byte(r.Method + " " + r.URL.RequestURI()))
	}))
	defer backend.Close()
	port := backend.Listener.Addr().(*net_TCPAddr).Port
	e := newTestEnv(t, func(o *Options) { o.Token = "tok" })
	req, _ := http.NewRequest("POST", e.ts.URL+"/proxy/"+itoa(port)+"/a/b?x=1", nil)
	req.Header.Set(TokenHeader, "tok")
	resp, err := e.ts.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || string(body) != "POST /a/b?x=1" {
		t.Fatalf("proxy: %d %q", resp.StatusCode, body)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, _, err := websocket.Dial(ctx, "ws"+strings.TrimPrefix(e.ts.URL, "http")+"/proxy/"+itoa(port)+"/ws",
		&websocket.DialOptions{HTTPHeader: http.Header{TokenHeader: {"tok"}}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.CloseNow()
	c.Write(ctx, websocket.MessageText, []byte("hi"))
	_, msg, err := c.Read(ctx)
	if err != nil || string(msg) != "echo:hi" {
		t.Fatalf("ws via proxy: %q %v", msg, err)
	}
	c.Close(websocket.StatusNormalClosure, "")

	req, _ = http.NewRequest("GET", e.ts.URL+"/proxy/1/x", nil)
	req.Header.Set(TokenHeader, "tok")
	resp, _ = e.ts.Client().Do(req)
	resp.Body.Close()
	if resp.StatusCode != 502 {
		t.Fatalf("dead port: %d", resp.StatusCode)
	}

	// An answer that starts while the request body is still arriving.
	duplex := webtest.DuplexBackend(t)
	webtest.CheckDuplex(t, e.ts.Client(), e.ts.URL+"/proxy/"+itoa(duplex.Listener.Addr().(*net_TCPAddr).Port)+"/upload",
		http.Header{TokenHeader: {"tok"}})
}

func TestPTY(t *testing.T) {
	e := newTestEnv(t)
	resp := e.Do("POST", "/pty", map[string]any{"cwd": t.TempDir()})
	var cr struct {
		SessionID string `json:"session_id"`
	}
	json.NewDecoder(resp.Body).Decode(&cr)
	resp.Body.Close()
	if resp.StatusCode != 201 || cr.SessionID == "" {
		t.Fatalf("create: %d", resp.StatusCode)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	wsURL := "ws" + strings.TrimPrefix(e.ts.URL, "http") + "/pty/" + cr.SessionID + "/ws"
	c, _, err := websocket.Dial(ctx, wsURL, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer c.CloseNow()
	_, msg, err := c.Read(ctx)
	if err != nil || !strings.Contains(string(msg), `"type":"connected"`) || !strings.Contains(string(msg), `"mode":"pty"`) {
		t.Fatalf("connected: %q %v", msg, err)
	}
	// A second client is refused; takeover evicts the first with 4001.
	if _, r2, err := websocket.Dial(ctx, wsURL, nil); err == nil || r2 == nil || r2.StatusCode != 409 {
		t.Fatalf("second client: %v %v", r2, err)
	}
	c.Write(ctx, websocket.MessageBinary, append([]byte{pty.FrameStdin}, "echo pty-$((6*7))\n"...))
	var out strings.Builder
	for !strings.Contains(out.String(), "pty-42") {
		typ, msg, err := c.Read(ctx)
		if err != nil {
			t.Fatalf("read: %v (so far %q)", err, out.String())
		}
		if typ == websocket.MessageBinary && msg[0] == pty.FrameStdout {
			out.Write(msg[1:])
		}
	}
	c2, _, err := websocket.Dial(ctx, wsURL+"?takeover=1&since=0", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer c2.CloseNow()
	for {
		_, _, err := c.Read(ctx)
		if err != nil {
			if websocket.CloseStatus(err) != pty.CloseTakenOver {
				t.Fatalf("old client closed with %v", err)
			}
			break
		}
	}
	c2.Read(ctx) // connected
	typ, msg, err := c2.Read(ctx)
	if err != nil || typ != websocket.MessageBinary || msg[0] != pty.FrameReplay || binary.BigEndian.Uint64(msg[1:9]) != 0 ||
		!strings.Contains(string(msg[9:]), "pty-42") {
		t.Fatalf("replay: %v %q %v", typ, msg, err)
	}
	st, b := e.Call("GET", "/pty/"+cr.SessionID, nil)
	if st != 200 || !strings.Contains(string(b), `"running":true`) {
		t.Fatalf("status: %s", b)
	}
	c2.Write(ctx, websocket.MessageBinary, append([]byte{pty.FrameStdin}, "exit 3\n"...))
	for {
		typ, msg, err := c2.Read(ctx)
		if err != nil {
			t.Fatalf("no exit frame: %v", err)
		}
		if typ == websocket.MessageText && strings.Contains(string(msg), `"type":"exit"`) {
			if !strings.Contains(string(msg), `"exit_code":3`) {
				t.Fatalf("exit: %s", msg)
			}
			if _, _, err := c2.Read(ctx); websocket.CloseStatus(err) != websocket.StatusNormalClosure {
				t.Fatalf("after exit: %v", err)
			}
			break
		}
	}
	if st, _ := e.Call("DELETE", "/pty/"+cr.SessionID, nil); st != 200 {
		t.Fatal(st)
	}
	st, b = e.Call("GET", "/pty/"+cr.SessionID, nil)
	exectest.WantError(t, st, b, 404, wire.CodeContextNotFound)
}

package client

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"testing"
	"time"

	"github.com/coder/websocket"
)

// ptyAgent serves a scripted PTY WebSocket: it sends connected, a replay
// frame and one stdout frame, echoes stdin back as stdout, records the
// JSON frames, and on stdin "bye" sends exit 7.
func ptyAgent(t *testing.T, f *fake, got chan<- string) {
	f.agent("POST /pty", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, 201, map[string]string{"session_id": "p1"})
	})
	f.agent("GET /pty/{id}", func(w http.ResponseWriter, r *http.Request) {
		if r.PathValue("id") != "p1" {
			writeJSON(w, 404, map[string]string{"code": "CONTEXT_NOT_FOUND", "message": "pty session not found"})
			return
		}
		writeJSON(w, 200, map[string]any{"session_id": "p1", "running": true, "output_offset": 42})
	})
	f.agent("DELETE /pty/{id}", func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(200) })
	f.agent("GET /pty/{id}/ws", func(w http.ResponseWriter, r *http.Request) {
		if r.PathValue("id") == "busy" {
			writeJSON(w, 409, map[string]string{"code": "ALREADY_CONNECTED", "message": "session already has a connected client"})
			return
		}
		got <- "query " + r.URL.RawQuery
		ws, err := websocket.Accept(w, r, nil)
		if err != nil {
			t.Error(err)
			return
		}
		defer ws.CloseNow()
		ctx := r.Context()
		mode := "pty"
		if r.URL.Query().Get("pty") == "0" {
			mode = "pipe"
		}
		b, _ := json.Marshal(map[string]any{"type": "connected", "session_id": "p1", "mode": mode})
		ws.Write(ctx, websocket.MessageText, b)
		replay := make([]byte, 9)
		replay[0] = ptyFrameReplay
		binary.BigEndian.PutUint64(replay[1:], 5)
		ws.Write(ctx, websocket.MessageBinary, append(replay, "old"...))
		ws.Write(ctx, websocket.MessageBinary, append([]byte{ptyFrameStdout}, "$ "...))
		for {
			typ, data, err := ws.Read(ctx)
			if err != nil {
				return
			}
			if typ == websocket.MessageText {
				got <- string(data)
				if string(data) == `{"type":"ping"}` {
					ws.Write(ctx, websocket.MessageText, []byte(`{"type":"pong"}`))
				}
				continue
			}
			if data[0] != ptyFrameStdin {
				t.Errorf("stdin frame starts with %#x", data[0])
			}
			if string(data[1:]) == "bye" {
				ws.Write(ctx, websocket.MessageText, []byte(`{"type":"exit","exit_code":7}`))
				ws.Close(websocket.StatusNormalClosure, "exited")
				return
			}
			ws.Write(ctx, websocket.MessageBinary, append([]byte{ptyFrameStderr}, data[1:]...))
		}
	})
}

func TestPTYRoundTrip(t *testing.T) {
	f, sb := agentFake(t)
	got := make(chan string, 10)
	ptyAgent(t, f, got)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	id, err := sb.CreatePTY(ctx, "/tmp", "")
	if err != nil || id != "p1" {
		t.Fatalf("CreatePTY = %q, %v", id, err)
	}
	if b := decodeBody(t, f.last("/agent/pty").Body); b["cwd"] != "/tmp" || b["command"] != nil {
		t.Fatalf("create body %v", b)
	}
	st, err := sb.PTYStatus(ctx, "p1")
	if err != nil || !st.Running || st.OutputOffset != 42 {
		t.Fatalf("PTYStatus = %+v, %v", st, err)
	}
	if _, err := sb.PTYStatus(ctx, "nope"); !IsNotFound(err) {
		t.Fatalf("PTYStatus(nope) = %v, want not found", err)
	}

	c, err := sb.AttachPTY(ctx, "p1", AttachOptions{Pipe: true, Replay: true, Since: 5})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if q := <-got; q != "query pty=0&since=5" {
		t.Fatalf("attach %s", q)
	}
	if ws := f.last("/agent/pty/p1/ws"); ws.Header.Get("X-EXECD-ACCESS-TOKEN") != agentToken {
		t.Fatalf("attach without the agent token: %v", ws.Header)
	}
	want := []PTYEvent{
		{Type: PTYConnected, Mode: "pipe"},
		{Type: PTYReplay, Offset: 5, Data: []byte("old")},
		{Type: PTYStdout, Data: []byte("$ ")},
	}
	for i, w := range want {
		ev, err := c.Next(ctx)
		if err != nil || ev.Type != w.Type || ev.Mode != w.Mode || ev.Offset != w.Offset || string(ev.Data) != string(w.Data) {
			t.Fatalf("event %d = %+v, %v; want %+v", i, ev, err, w)
		}
	}
	if err := c.Resize(ctx, 120, 40); err != nil {
		t.Fatal(err)
	}
	if err := c.Signal(ctx, "SIGINT"); err != nil {
		t.Fatal(err)
	}
	if err := c.Ping(ctx); err != nil {
		t.Fatal(err)
	}
	for _, w := range []string{`{"cols":120,"rows":40,"type":"resize"}`, `{"signal":"SIGINT","type":"signal"}`, `{"type":"ping"}`} {
		if g := <-got; g != w {
			t.Fatalf("frame %s, want %s", g, w)
		}
	}
	if ev, err := c.Next(ctx); err != nil || ev.Type != PTYPong {
		t.Fatalf("want pong, got %+v, %v", ev, err)
	}
	if err := c.Write(ctx, []byte("echo hi\n")); err != nil {
		t.Fatal(err)
	}
	if ev, err := c.Next(ctx); err != nil || ev.Type != PTYStderr || string(ev.Data) != "echo hi\n" {
		t.Fatalf("echo: %+v, %v", ev, err)
	}
	if err := c.Write(ctx, []byte("bye")); err != nil {
		t.Fatal(err)
	}
	if ev, err := c.Next(ctx); err != nil || ev.Type != PTYExit || ev.ExitCode != 7 {
		t.Fatalf("exit: %+v, %v", ev, err)
	}
	if ev, err := c.Next(ctx); !errors.Is(err, io.EOF) {
		t.Fatalf("after exit: %+v, %v; want io.EOF", ev, err)
	}
	if err := sb.DeletePTY(ctx, "p1"); err != nil {
		t.Fatal(err)
	}
}

func TestPTYAttachConflict(t *testing.T) {
	f, sb := agentFake(t)
	ptyAgent(t, f, make(chan string, 10))
	_, err := sb.AttachPTY(context.Background(), "busy", AttachOptions{})
	var ae *APIError
	if !IsConflict(err) || !errors.As(err, &ae) || ae.Code != "ALREADY_CONNECTED" {
		t.Fatalf("attach busy = %v, want 409 ALREADY_CONNECTED", err)
	}
}

func TestRemoveDirs(t *testing.T) {
	f, sb := agentFake(t)
	f.agent("DELETE /directories", func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(200) })
	if err := sb.RemoveDirs(context.Background(), "/a", "/b c"); err != nil {
		t.Fatal(err)
	}
	if q := f.last("/agent/directories").RawQuery; q != "path=%2Fa&path=%2Fb+c" {
		t.Fatalf("query %s", q)
	}
}

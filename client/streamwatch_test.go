package client

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// hangingCommand streams the start of a command and then nothing, like
// the agent of a sandbox that died without resetting the connection.
func hangingCommand(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "text/event-stream")
	io.WriteString(w, `{"type":"init","text":"c1"}`+"\n\n"+`{"type":"stdout","text":"allocating"}`+"\n\n")
	w.(http.Flusher).Flush()
	<-r.Context().Done()
}

// A silent stream of a sandbox the server reports Failed ends at once,
// saying why; one of a sandbox that still runs goes on.
func TestStreamOfEndedSandbox(t *testing.T) {
	f, sb := agentFake(t)
	sb.c.streamSilence = 200 * time.Millisecond
	f.agent("POST /command", hangingCommand)
	var state atomic.Value
	state.Store("Running")
	f.handle("GET /v1/sandboxes/sb1", func(w http.ResponseWriter, r *http.Request) {
		st := state.Load().(string)
		msg := ""
		if st == "Failed" {
			msg = "the sandbox agent was killed by the OOM killer (out of memory), exit code 137"
		}
		writeJSON(w, 200, map[string]any{"id": "sb1", "status": map[string]any{"state": st, "reason": "SANDBOX_OOM_KILLED", "message": msg}})
	})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	type result struct {
		x   *Execution
		err error
	}
	got := make(chan result, 1)
	var lines []string
	go func() {
		x, err := sb.Stream(ctx, "dd if=/dev/zero", RunOptions{}, Handlers{OnStdout: func(l string) { lines = append(lines, l) }})
		got <- result{x, err}
	}()
	// Running: silence alone does not end the stream.
	select {
	case r := <-got:
		t.Fatalf("the stream of a running sandbox ended: %v", r.err)
	case <-time.After(time.Second):
	}
	if n := len(f.requests("/v1/sandboxes/sb1")); n == 0 {
		t.Fatal("the server was not asked about the silent stream's sandbox")
	}
	state.Store("Failed")
	var r result
	select {
	case r = <-got:
	case <-time.After(10 * time.Second):
		t.Fatal("the stream did not end within 10s of the sandbox")
	}
	if !errors.Is(r.err, ErrSandboxEnded) || !strings.Contains(r.err.Error(), "sandbox sb1 is Failed: the sandbox agent was killed by the OOM killer") {
		t.Fatalf("Stream error %v, want ErrSandboxEnded with the reason", r.err)
	}
	if r.x == nil || r.x.ID != "c1" || len(lines) != 1 {
		t.Fatalf("execution %+v, lines %q", r.x, lines)
	}
}

// A stream cut short by the death of its sandbox says why.
func TestStreamCutByDeadSandbox(t *testing.T) {
	f, sb := agentFake(t)
	f.agent("POST /command", stream(`{"type":"init","text":"c1"}`+"\n\n"))
	var asked atomic.Int32
	f.handle("GET /v1/sandboxes/sb1", func(w http.ResponseWriter, r *http.Request) {
		st := "Running" // the server learns of the death a moment later
		if asked.Add(1) > 1 {
			st = "Failed"
		}
		writeJSON(w, 200, map[string]any{"id": "sb1", "status": map[string]any{"state": st, "message": "the sandbox agent exited, exit code 1"}})
	})
	_, err := sb.Stream(context.Background(), "x", RunOptions{}, Handlers{})
	if !errors.Is(err, ErrSandboxEnded) || !strings.Contains(err.Error(), "sandbox sb1 is Failed: the sandbox agent exited") {
		t.Fatalf("Stream error %v, want ErrSandboxEnded with the reason", err)
	}
}

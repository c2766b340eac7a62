package client

import (
	"context"
	"errors"
	"io"
	"reflect"
	"strings"
	"testing"
	"time"
)

func TestStreamKeepsNoOutput(t *testing.T) {
	f, sb := agentFake(t)
	f.agent("POST /command", stream(`{"type":"init","text":"c1"}`+"\n\n",
		`{"type":"stdout","text":"hello"}`+"\n\n",
		`{"type":"stderr","text":"warn"}`+"\n\n",
		`{"type":"error","error":{"ename":"CommandExecError","evalue":"3","traceback":["exit status 3"]}}`+"\n\n"))
	var events []string
	x, err := sb.Stream(context.Background(), "echo hello; exit 3", RunOptions{Cwd: "/tmp", Timeout: 2 * time.Second}, Handlers{
		OnInit:     func(id string) { events = append(events, "init "+id) },
		OnStdout:   func(l string) { events = append(events, "out "+l) },
		OnStderr:   func(l string) { events = append(events, "err "+l) },
		OnError:    func(e *ExecutionError) { events = append(events, "error "+e.Value) },
		OnComplete: func(x *Execution) { events = append(events, "complete") },
	})
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"init c1", "out hello", "err warn", "error 3", "complete"}; !reflect.DeepEqual(events, want) {
		t.Fatalf("events %q", events)
	}
	if x.ID != "c1" || x.ExitCode != 3 || x.Stdout != "" || x.Stderr != "" {
		t.Fatalf("execution %+v", x)
	}
	got := decodeBody(t, f.last("/agent/command").Body)
	if want := map[string]any{"command": "echo hello; exit 3", "cwd": "/tmp", "timeout": 2000.0}; !reflect.DeepEqual(got, want) {
		t.Fatalf("body %v", got)
	}
}

func TestStreamFailures(t *testing.T) {
	f, sb := agentFake(t)
	f.agent("POST /command", stream(`{"type":"init","text":"c4"}`+"\n\n", `{"type":"stdout","text":"partial"}`+"\n\n"))
	x, err := sb.Stream(context.Background(), "cut", RunOptions{}, Handlers{})
	if !errors.Is(err, io.ErrUnexpectedEOF) || x.ExitCode != -1 {
		t.Fatalf("cut: %+v %v", x, err)
	}
	_, sb2 := agentFake(t) // no /command route: 404
	if _, err := sb2.Stream(context.Background(), "true", RunOptions{}, Handlers{}); !IsNotFound(err) || !strings.Contains(err.Error(), "404") {
		t.Fatalf("missing route: %v", err)
	}
}

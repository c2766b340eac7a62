package execd

import (
	"bytes"
	"encoding/json"
	"net/url"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/moat-sandbox/moat/internal/execd/code"
	"github.com/moat-sandbox/moat/internal/execd/command"
	"github.com/moat-sandbox/moat/internal/execd/files"
	"github.com/moat-sandbox/moat/internal/execd/metrics"
	"github.com/moat-sandbox/moat/internal/execd/wire"
	"github.com/moat-sandbox/moat/internal/gen/execdapi"
	"github.com/moat-sandbox/moat/internal/gen/wirecheck"
)

// These tests hold the agent's wire types to the models generated from
// api/openapi/execd.yaml: a field added, renamed or retyped on one side only
// fails here.

func TestWireTypesMatchSpec(t *testing.T) {
	t0 := time.Date(2026, 3, 4, 5, 6, 7, 891_000_000, time.UTC)
	t1 := t0.Add(time.Second)
	zero, three := int64(0), 3
	for name, ev := range map[string]wire.Event{
		"init":               {Type: wire.EvInit, Text: "abc"},
		"stdout":             {Type: wire.EvStdout, Text: "line", Timestamp: 1767323045000},
		"execution_count":    {Type: wire.EvExecutionCount, ExecutionCount: 2},
		"result":             {Type: wire.EvResult, ExecutionCount: 2, Results: map[string]any{"text": "3", "image/png": "AAAA"}},
		"execution_complete": {Type: wire.EvExecutionComplete, ExecutionTime: &zero, Timestamp: 1},
		"error":              {Type: wire.EvError, Error: &wire.EventError{EName: "CommandExecError", EValue: "1", Traceback: []string{"exit status 1"}}},
		"ping":               {Type: wire.EvPing, Text: "pong"},
	} {
		wirecheck.Response[execdapi.ServerStreamEvent](t, name+" event", ev)
	}
	wirecheck.Response[execdapi.CommandStatus](t, "running CommandStatus", command.Status{ID: "c1", Content: "sleep 1", Running: true, StartedAt: t0})
	wirecheck.Response[execdapi.CommandStatus](t, "finished CommandStatus",
		command.Status{ID: "c1", Content: "false", ExitCode: &three, Error: "exit status 3", StartedAt: t0, FinishedAt: &t1})
	wirecheck.Response[execdapi.CodeContext](t, "CodeContext", code.ContextInfo{ID: "x1", Language: "python", Cwd: "/tmp"})
	wirecheck.Response[execdapi.CodeContext](t, "CodeContext without cwd", code.ContextInfo{ID: "x1", Language: "python"})
	wirecheck.Response[execdapi.Metrics](t, "Metrics", metrics.Metrics{CPUCount: 2, CPUUsedPct: 12.345678901234, MemTotalMiB: 1024.5, MemUsedMiB: 3.25, Timestamp: 1767323045123})
	wirecheck.Response[execdapi.FileInfo](t, "files.FileInfo", files.FileInfo{Path: "/a", Type: "file", Size: 1 << 40, ModifiedAt: t0, CreatedAt: t1, Owner: "root", Group: "root", Mode: 644})

	for _, code := range []string{wire.CodeInvalidRequestBody, wire.CodeMissingQuery, wire.CodeRuntimeError, wire.CodeInvalidFile, wire.CodeInvalidFileContent,
		wire.CodeInvalidFileMetadata, wire.CodeFileNotFound, wire.CodeUnknown, wire.CodeContextNotFound, wire.CodeNotSupported, "ALREADY_CONNECTED"} {
		if !execdapi.ErrorResponseCode(code).Valid() {
			t.Errorf("error code %s is not in the spec's ErrorResponse.code enum", code)
		}
	}

	wirecheck.Request[command.RunRequest, execdapi.RunCommandRequest](t, "RunCommandRequest")
	wirecheck.Request[files.Permission, execdapi.Permission](t, "Permission")
	wirecheck.Request[files.Metadata, execdapi.FileMetadata](t, "FileMetadata")
}

// frames splits an execd stream into its JSON events.
func frames(t *testing.T, body []byte) []json.RawMessage {
	t.Helper()
	var out []json.RawMessage
	for _, f := range bytes.Split(bytes.TrimSuffix(body, []byte("\n\n")), []byte("\n\n")) {
		if len(f) > 0 {
			out = append(out, json.RawMessage(f))
		}
	}
	if len(out) == 0 {
		t.Fatalf("empty stream %q", body)
	}
	return out
}

// TestHandlersMatchSpecModels drives the real agent handlers and holds each
// JSON body to the generated model.
func TestHandlersMatchSpecModels(t *testing.T) {
	e := newTestEnv(t)
	expect := func(what string, status, wantStatus int, body []byte) {
		t.Helper()
		if status != wantStatus {
			t.Fatalf("%s: status %d, want %d: %s", what, status, wantStatus, body)
		}
	}

	st, body := e.Call("POST", "/command", map[string]any{"command": "echo out; echo err >&2; exit 3"})
	expect("foreground command", st, 200, body)
	for i, f := range frames(t, body) {
		wirecheck.Response[execdapi.ServerStreamEvent](t, "foreground event "+itoa(i), f)
	}
	st, body = e.Call("POST", "/command", map[string]any{"command": "true", "background": true, "envs": map[string]string{"A": "b"}})
	expect("background command", st, 200, body)
	var id string
	for _, f := range frames(t, body) {
		var ev execdapi.ServerStreamEvent
		if json.Unmarshal(f, &ev); ev.Type == execdapi.ServerStreamEventTypeInit && ev.Text != nil {
			id = *ev.Text
		}
	}
	if id == "" {
		t.Fatalf("no init event in %s", body)
	}
	waitFinished(t, e, id)
	st, body = e.Call("GET", "/command/status/"+id, nil)
	expect("command status", st, 200, body)
	wirecheck.Response[execdapi.CommandStatus](t, "GET /command/status", json.RawMessage(body))

	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "f.txt"), []byte("hello"), 0o644); err != nil {
		t.Fatal(err)
	}
	q := url.QueryEscape
	st, body = e.Call("GET", "/files/info?path="+q(filepath.Join(dir, "f.txt"))+"&path="+q(dir), nil)
	expect("files info", st, 200, body)
	wirecheck.Response[map[string]execdapi.FileInfo](t, "GET /files/info", json.RawMessage(body))
	st, body = e.Call("GET", "/directories/list?path="+q(dir), nil)
	expect("directory list", st, 200, body)
	wirecheck.Response[[]execdapi.FileInfo](t, "GET /directories/list", json.RawMessage(body))
	st, body = e.Call("GET", "/files/search?path="+q(dir)+"&pattern="+q("*.txt"), nil)
	expect("files search", st, 200, body)
	wirecheck.Response[[]execdapi.FileInfo](t, "GET /files/search", json.RawMessage(body))

	st, body = e.Call("GET", "/metrics", nil)
	expect("metrics", st, 200, body)
	wirecheck.Response[execdapi.Metrics](t, "GET /metrics", json.RawMessage(body))
	st, body = e.Call("GET", "/code/contexts", nil)
	expect("code contexts", st, 200, body)
	wirecheck.Response[[]execdapi.CodeContext](t, "GET /code/contexts", json.RawMessage(body))

	st, body = e.Call("GET", "/files/info?path="+q(filepath.Join(dir, "missing")), nil)
	expect("missing file", st, 404, body)
	wirecheck.Response[execdapi.ErrorResponse](t, "404 /files/info", json.RawMessage(body))
	st, body = e.Call("POST", "/command", "{")
	expect("bad body", st, 400, body)
	wirecheck.Response[execdapi.ErrorResponse](t, "400 /command", json.RawMessage(body))
	wirecheck.Response[execdapi.UnauthorizedResponse](t, "401 body", json.RawMessage(unauthorizedBody))
}

package main

import (
	"context"
	"flag"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"
)

var update = flag.Bool("update", false, "rewrite deps.txt from the current dependency list")

// allowed are the only modules besides the standard library the agent may
// link, with why.
var allowed = []string{
	"github.com/moat-sandbox/moat/cmd/moat-agent",
	"github.com/moat-sandbox/moat/internal/execd", // the agent itself (and its service packages)
	"github.com/moat-sandbox/moat/internal/agentproto",
	"github.com/moat-sandbox/moat/internal/errdefs",
	"github.com/moat-sandbox/moat/internal/web",
	"golang.org/x/sys/",
	"github.com/creack/pty",      // PTY sessions
	"github.com/coder/websocket", // PTY over WebSocket
	"github.com/go-zeromq/zmq4",  // Jupyter kernels
	"golang.org/x/sync/errgroup", // zmq4
	"golang.org/x/text/",         // zmq4 (cases, for socket option names)
	"connectrpc.com/connect",     // E2B envd's Connect services
	"google.golang.org/protobuf", // their messages (JSON and binary codecs)
}

// agentDeps is the artifact's dependency list: `go list -deps` of this
// main package for the platform the agent ships on.
func agentDeps(t *testing.T) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "go", "list", "-deps", ".")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH=amd64")
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	deps := strings.Fields(string(out))
	slices.Sort(deps) // the order follows import order; only the set matters
	return deps
}

// TestDependencies keeps the shipped agent lean: what it links is in
// deps.txt, so that any growth shows in review, and nothing outside the
// allowed modules (no Kubernetes, Docker, OpenTelemetry, cobra, server
// packages) may enter it.
func TestDependencies(t *testing.T) {
	deps := agentDeps(t)
	for _, pkg := range deps {
		if !strings.Contains(strings.Split(pkg, "/")[0], ".") {
			continue // standard library
		}
		if !slices.ContainsFunc(allowed, func(a string) bool { return strings.HasPrefix(pkg, a) }) {
			t.Errorf("the agent links %s; it may only use the standard library and %v", pkg, allowed)
		}
	}
	want := strings.Join(deps, "\n") + "\n"
	if *update {
		if err := os.WriteFile("deps.txt", []byte(want), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	got, err := os.ReadFile("deps.txt")
	if err != nil {
		t.Fatal(err)
	}
	if string(got) != want {
		old := strings.Fields(string(got))
		for _, p := range deps {
			if !slices.Contains(old, p) {
				t.Errorf("new dependency: %s", p)
			}
		}
		for _, p := range old {
			if !slices.Contains(deps, p) {
				t.Errorf("dependency gone: %s", p)
			}
		}
		t.Errorf("deps.txt is out of date; review the change, then run: go test ./cmd/moat-agent -run TestDependencies -update")
	}
}

package cli

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/moat-sandbox/moat/internal/audit/trail"
	"github.com/moat-sandbox/moat/internal/httpapi"
	"github.com/moat-sandbox/moat/internal/lifecycle"
	"github.com/moat-sandbox/moat/internal/runtime/fake"
	"github.com/moat-sandbox/moat/internal/sandbox"
	"github.com/moat-sandbox/moat/internal/store"
)

func TestSandboxAudit(t *testing.T) {
	db, err := store.Open(context.Background(), filepath.Join(t.TempDir(), "s.db"), time.Second)
	if err != nil {
		t.Fatal(err)
	}
	rt := fake.New(fake.Hooks{})
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	svc, err := sandbox.New(sandbox.Config{}, sandbox.Deps{Deps: lifecycle.Deps{Store: db, Runtime: rt, Images: localImages{}, Log: log}})
	if err != nil {
		t.Fatal(err)
	}
	tr, err := trail.Open(trail.Options{Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(httpapi.New(httpapi.Config{APIKey: "root-key", Trail: tr}, svc, log).Handler())
	t.Cleanup(func() { srv.Close(); svc.Close(); rt.Close(); db.Close() })
	as := func(args ...string) (string, string, int) {
		return runMoat(t, nil, append([]string{args[0], "--server", srv.URL, "--api-key", "root-key"}, args[1:]...)...)
	}
	out, errOut, code := as("sb", "create", "--image", "busybox", "-q")
	id := strings.TrimSpace(out)
	if code != 0 || id == "" {
		t.Fatalf("create: %d %q %q", code, out, errOut)
	}
	as("sb", "pause", id)
	tr.Append(trail.Record{Kind: trail.KindCommand, Action: trail.ActionRun, SandboxID: id, Command: &trail.Command{Line: "make test", Cwd: "/src"}})
	out, errOut, code = as("sb", "audit", id)
	if code != 0 || !strings.Contains(out, "ACTION") || !strings.Contains(out, "create") || !strings.Contains(out, "pause") ||
		!strings.Contains(out, `"make test" cwd=/src`) {
		t.Fatalf("audit: %d %q %q", code, out, errOut)
	}
	out, _, code = as("sb", "audit", id, "--kind", "command", "-o", "json")
	lines := strings.Split(strings.TrimSpace(out), "\n")
	var r map[string]any
	if code != 0 || len(lines) != 1 || json.Unmarshal([]byte(lines[0]), &r) != nil || r["kind"] != "command" {
		t.Fatalf("audit --kind command -o json: %d %q", code, out)
	}
	if out, _, code = as("sb", "audit", id, "--since", "1h", "-o", "json"); code != 0 || len(strings.Split(strings.TrimSpace(out), "\n")) != 3 {
		t.Fatalf("audit --since 1h: %d %q", code, out)
	}
	if _, errOut, code = as("sb", "audit", id, "--kind", "output"); code == 0 || !strings.Contains(errOut, "output") {
		t.Fatalf("audit --kind output: %d %q", code, errOut)
	}
	if _, errOut, code = as("sb", "audit", id, "--since", "yesterday"); code == 0 || !strings.Contains(errOut, "RFC 3339") {
		t.Fatalf("audit --since yesterday: %d %q", code, errOut)
	}
	if _, _, code = as("sb", "audit", "nosuchsandbox"); code != 4 {
		t.Fatalf("audit of an unknown sandbox: exit %d, want 4", code)
	}
}

package agentbin

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/moat-sandbox/moat/internal/errdefs"
	"github.com/moat-sandbox/moat/internal/runtime"
)

func TestInstallOncePerContent(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "agent")
	p1, err := install(dir, []byte("agent one"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(filepath.Base(p1), "moat-agent-") || len(filepath.Base(p1)) != len("moat-agent-")+16 {
		t.Errorf("path %s is not named by content hash", p1)
	}
	fi, err := os.Stat(p1)
	if err != nil || fi.Mode().Perm() != 0o555 {
		t.Fatalf("installed file: %v, %v", fi, err)
	}
	old := time.Now().Add(-time.Hour)
	os.Chtimes(p1, old, old)
	again, err := install(dir, []byte("agent one"))
	if err != nil || again != p1 {
		t.Fatalf("second install = %s, %v; want %s", again, err, p1)
	}
	if fi, _ := os.Stat(p1); !fi.ModTime().Equal(old) {
		t.Error("the same agent was written again")
	}
	p2, err := install(dir, []byte("agent two"))
	if err != nil || p2 == p1 {
		t.Fatalf("another agent = %s, %v", p2, err)
	}
	if data, _ := os.ReadFile(p1); string(data) != "agent one" {
		t.Errorf("the earlier agent (still mounted by its sandboxes) changed: %q", data)
	}
	ents, _ := os.ReadDir(dir)
	if len(ents) != 2 {
		t.Errorf("dir holds %d entries, want the 2 agents (no temporary files)", len(ents))
	}
}

// TestEmbedded checks what this build carries: a static agent when the
// payload was built (make build, testutil.MoatBinary), else ErrMissing
// with how to build it.
func TestEmbedded(t *testing.T) {
	data, err := Embedded()
	if err != nil {
		if !errors.Is(err, ErrMissing) || !errdefs.IsFailedPrecondition(err) || !strings.Contains(err.Error(), "make build") {
			t.Fatalf("Embedded = %v", err)
		}
		if _, err := Install(t.TempDir()); !errors.Is(err, ErrMissing) {
			t.Errorf("Install without a payload = %v", err)
		}
		return
	}
	p, err := Install(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	if err := runtime.CheckAgentBinary(p); err != nil {
		t.Errorf("the embedded agent (%d bytes) is not a static executable: %v", len(data), err)
	}
}

package cli

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"
)

// TestCopySelf: the agent init container's copy is this very binary,
// executable.
func TestCopySelf(t *testing.T) {
	dest := filepath.Join(t.TempDir(), "moat")
	if err := copySelf(dest); err != nil {
		t.Fatal(err)
	}
	self, _ := os.Executable()
	want, err := os.ReadFile(self)
	if err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(dest)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("copy differs: %d bytes, want %d", len(got), len(want))
	}
	if fi, _ := os.Stat(dest); fi.Mode().Perm() != 0o755 {
		t.Errorf("mode = %v", fi.Mode())
	}
	if err := copySelf(filepath.Join(t.TempDir(), "missing", "moat")); err == nil {
		t.Error("copy into a missing directory succeeded")
	}
}

package runtime

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/moat-sandbox/moat/internal/errdefs"
)

func TestCheckAgentBinary(t *testing.T) {
	dir := t.TempDir()
	src := filepath.Join(dir, "main.go")
	if err := os.WriteFile(src, []byte("package main\nimport \"os/user\"\nfunc main(){ user.Current() }\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	build := func(cgo, out string) string {
		cmd := exec.Command("go", "build", "-o", filepath.Join(dir, out), src)
		cmd.Env = append(os.Environ(), "CGO_ENABLED="+cgo, "GOFLAGS=")
		if b, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("build %s: %v\n%s", out, err, b)
		}
		return filepath.Join(dir, out)
	}
	if err := CheckAgentBinary(build("0", "static")); err != nil {
		t.Fatalf("static binary refused: %v", err)
	}
	if _, err := exec.LookPath("gcc"); err == nil {
		if err := CheckAgentBinary(build("1", "dynamic")); !errdefs.IsInvalidArgument(err) {
			t.Fatalf("dynamic binary: %v", err)
		}
	}
	if err := CheckAgentBinary(src); !errdefs.IsInvalidArgument(err) {
		t.Fatalf("not an ELF file: %v", err)
	}
}

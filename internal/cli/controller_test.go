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

// TestControllerQPSFlags: --k8s-api-qps/--k8s-api-burst are the flags,
// and the old --kube-api-* spelling still sets them (deployments that
// pass it keep working), hidden from the help.
func TestControllerQPSFlags(t *testing.T) {
	for i, args := range [][]string{
		{"--k8s-api-qps=5", "--k8s-api-burst=7"},
		{"--kube-api-qps=5", "--kube-api-burst=7"},
	} {
		f := newControllerCommand().Flags()
		if err := f.Parse(args); err != nil {
			t.Fatalf("%d: %v", i, err)
		}
		if q, b := f.Lookup("k8s-api-qps").Value.String(), f.Lookup("k8s-api-burst").Value.String(); q != "5" || b != "7" {
			t.Errorf("%d: %v: qps %s burst %s, want 5 7", i, args, q, b)
		}
		if !f.Lookup("kube-api-qps").Hidden || f.Lookup("k8s-api-qps").Hidden {
			t.Errorf("%d: want --kube-api-qps hidden and --k8s-api-qps shown", i)
		}
	}
}

package oci

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/moat-sandbox/moat/internal/runtime"
	"github.com/moat-sandbox/moat/internal/runtime/runtimetest"
)

// TestHostDropsRootfs: once runc or crun started a sandbox, its root
// filesystem is mounted only in the sandbox's mount namespace (the host's
// copy is dropped, dropRootfs), and the sandbox's root still works: a file
// written in the sandbox is in its writable layer on the host and reads
// back in the sandbox. runsc keeps the host's mount (its gofer serves it)
// and its writes in its own overlay.
func TestHostDropsRootfs(t *testing.T) {
	for _, class := range availableClasses(t) {
		t.Run(class, func(t *testing.T) {
			r := newEnv(t, class, nil).open(t)
			ctx := context.Background()
			id := runtimetest.NewID("rootfs")
			if _, err := r.Create(ctx, runtime.Spec{ID: id, Image: testImage, AgentToken: runtimetest.Token}); err != nil {
				t.Fatal(err)
			}
			runtimetest.WaitAgent(t, ctx, r, id, 10*time.Second)
			rootfs := filepath.Join(r.sandboxDir(id), "rootfs")
			mounted := hostMountedAt(t, rootfs)
			if want := class == runscKind; mounted != want {
				t.Errorf("host mount at %s: %v, want %v", rootfs, mounted, want)
			}
			out, code, err := runtimetest.Exec(ctx, r, id, "echo moat-root > /probe && cat /probe && grep -c ' / / ' /proc/1/mountinfo")
			if err != nil || code != 0 || out != "moat-root\n1\n" {
				t.Fatalf("exec = %q, %d, %v", out, code, err)
			}
			// runsc keeps a sandbox's writes in its own overlay (memory or a
			// filestore file), not in the upper directory.
			upper, _ := writableDirs(r.sandboxDir(id))
			if class == runscKind {
				upper = ""
			}
			if upper != "" {
				if data, err := os.ReadFile(filepath.Join(upper, "probe")); err != nil || strings.TrimSpace(string(data)) != "moat-root" {
					t.Errorf("upper/probe = %q, %v", data, err)
				}
			}
			if err := r.Delete(ctx, id); err != nil {
				t.Fatal(err)
			}
			assertNoLeaks(t, r, id)
		})
	}
}

// hostMountedAt reports whether target is a mount point in this process's
// mount namespace.
func hostMountedAt(t *testing.T, target string) bool {
	t.Helper()
	mi, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.SplitSeq(string(mi), "\n") {
		if f := strings.Fields(line); len(f) > 4 && f[4] == target {
			return true
		}
	}
	return false
}

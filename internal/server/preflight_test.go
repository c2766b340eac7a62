package server

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/moat-sandbox/moat/internal/errdefs"
	"github.com/moat-sandbox/moat/internal/preflight"
)

// TestServeRefusesHostWithoutController: the start-up gate of Run
// refuses, with the fix, a host whose cgroup v2 tree does not delegate
// the memory controller to the cgroup parent, and lets the same host
// with it through (the warnings logged).
func TestServeRefusesHostWithoutController(t *testing.T) {
	root := t.TempDir()
	write := func(p, s string) {
		t.Helper()
		p = filepath.Join(root, p)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("proc/self/mountinfo", "26 22 0:23 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n")
	write("proc/sys/kernel/osrelease", "6.1.0-27-amd64\n")
	write("proc/filesystems", "nodev\toverlay\n")
	write("boot/config-6.1.0-27-amd64", "CONFIG_NF_TABLES=y\nCONFIG_NFT_NAT=y\nCONFIG_NFT_MASQ=y\nCONFIG_NFT_CT=y\nCONFIG_VETH=y\nCONFIG_BRIDGE=y\n")
	write("sys/fs/cgroup/cgroup.controllers", "cpu io memory pids\n")
	write("sys/fs/cgroup/moat/cgroup.controllers", "cpu io pids\n")
	host := preflight.Host{
		Root:     root,
		LookPath: func(f string) (string, error) { return "/usr/sbin/" + f, nil },
		Output: func(ctx context.Context, p string, args ...string) ([]byte, error) {
			return []byte("runc version 1.1.5\n"), nil
		},
		FreeBytes: func(string) (uint64, error) { return 1 << 30, nil },
		Euid:      func() int { return 0 },
	}
	cfg := Default()
	cfg.Runtime = "oci"
	var logged strings.Builder
	log := slog.New(slog.NewTextHandler(&logged, nil))
	err := checkHost(context.Background(), cfg, host, log)
	if !errdefs.IsFailedPrecondition(err) || !strings.Contains(err.Error(), "cgroup.memory: not delegated to cgroup /moat") ||
		!strings.Contains(err.Error(), "echo +memory > /sys/fs/cgroup/cgroup.subtree_control") {
		t.Fatalf("checkHost = %v, want the missing memory controller and its fix", err)
	}
	if !strings.Contains(logged.String(), "check=disk") {
		t.Errorf("the low-disk warning was not logged: %s", logged.String())
	}

	write("sys/fs/cgroup/moat/cgroup.controllers", "cpu io memory pids\n")
	if err := checkHost(context.Background(), cfg, host, log); err != nil {
		t.Fatalf("checkHost on a host with every controller: %v", err)
	}

	// The same gate runs the backend's own checks: docker's daemon.
	cfg.Runtime = "docker"
	host.Docker = func(context.Context) (string, error) { return "", errors.New("connection refused") }
	if err := checkHost(context.Background(), cfg, host, log); !errdefs.IsFailedPrecondition(err) || !strings.Contains(err.Error(), "docker: Docker daemon unreachable") {
		t.Fatalf("checkHost without dockerd = %v", err)
	}
}

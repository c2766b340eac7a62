package preflight

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// System is the live host (without the Docker and Kubernetes probes,
// which the server wires for its backend).
func System() Host {
	return Host{
		Root:     "/",
		LookPath: exec.LookPath,
		Output: func(ctx context.Context, path string, args ...string) ([]byte, error) {
			return exec.CommandContext(ctx, path, args...).Output()
		},
		FreeBytes: freeBytes,
		Euid:      os.Geteuid,
	}
}

// freeBytes is statfs's space available to unprivileged users of the
// filesystem holding p or, while p does not exist yet, its nearest
// existing ancestor.
func freeBytes(p string) (uint64, error) {
	p, err := filepath.Abs(p)
	if err != nil {
		return 0, err
	}
	for {
		var st unix.Statfs_t
		err := unix.Statfs(p, &st)
		if err == nil {
			return st.Bavail * uint64(st.Bsize), nil
		}
		if !errors.Is(err, fs.ErrNotExist) || p == "/" {
			return 0, err
		}
		p = filepath.Dir(p)
	}
}

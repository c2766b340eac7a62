// Package rootfs builds small root filesystems from host binaries, for
// tests, benchmarks and demos that must not download images: a busybox
// tree from Debian's busybox-static.
package rootfs

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// BusyboxPath is where Debian's busybox-static installs the binary.
const BusyboxPath = "/bin/busybox"

// BusyboxVersion returns the version of the host busybox (e.g. "1.35.0").
func BusyboxVersion() (string, error) {
	if _, err := os.Stat(BusyboxPath); err != nil {
		return "", fmt.Errorf("busybox-static not installed: %w", err)
	}
	out, _ := exec.Command(BusyboxPath).CombinedOutput()
	f := strings.Fields(strings.SplitN(string(out), "\n", 2)[0])
	if len(f) < 2 {
		return "", fmt.Errorf("cannot read busybox version from %q", out)
	}
	return strings.TrimPrefix(f[1], "v"), nil
}

// Busybox writes a busybox rootfs into root (which must not exist): the
// static binary with its applet links, /etc/passwd and /etc/group (root,
// nobody, user 1000), and the usual empty directories.
func Busybox(root string) error {
	if err := os.Mkdir(root, 0o755); err != nil {
		return err
	}
	for _, d := range []string{"bin", "sbin", "usr/bin", "usr/sbin", "etc", "tmp", "root", "home/user", "proc", "sys", "dev", "run", "var/tmp", "workspace"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			return err
		}
	}
	os.Chmod(filepath.Join(root, "tmp"), 0o1777)
	os.Chmod(filepath.Join(root, "var/tmp"), 0o1777)
	os.Chown(filepath.Join(root, "home/user"), 1000, 1000)
	data, err := os.ReadFile(BusyboxPath)
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(root, "bin/busybox"), data, 0o755); err != nil {
		return err
	}
	list, err := exec.Command(BusyboxPath, "--list-full").Output()
	if err != nil {
		return fmt.Errorf("busybox --list-full: %w", err)
	}
	for _, app := range strings.Fields(string(list)) {
		if app == "bin/busybox" {
			continue
		}
		target := filepath.Join(root, app)
		if err := os.MkdirAll(filepath.Dir(target), 0o755); err != nil {
			return err
		}
		rel, _ := filepath.Rel(filepath.Dir(target), filepath.Join(root, "bin/busybox"))
		if err := os.Symlink(rel, target); err != nil && !os.IsExist(err) {
			return err
		}
	}
	files := map[string]string{
		"etc/passwd":      "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\nuser:x:1000:1000:user:/home/user:/bin/sh\n",
		"etc/group":       "root:x:0:\nnogroup:x:65534:\nuser:x:1000:\n",
		"etc/hostname":    "sandbox\n",
		"etc/hosts":       "127.0.0.1 localhost\n",
		"etc/resolv.conf": "",
	}
	for name, content := range files {
		if err := os.WriteFile(filepath.Join(root, name), []byte(content), 0o644); err != nil {
			return err
		}
	}
	return nil
}

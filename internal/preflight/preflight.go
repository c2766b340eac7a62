// Package preflight checks a host for what `moat serve` needs: the cgroup
// hierarchy and the controllers delegated to moat's cgroup parent, the
// kernel features the native backend uses (overlayfs, nftables, veth,
// bridges, loop devices), the OCI runtimes and their versions, free disk
// under the state directory, privileges, and the Docker daemon or the
// Kubernetes API when those backends are chosen. Every result says what
// was found and, when something lacks, how to fix it.
//
// The checks are pure functions of a Host: a root directory under which
// /proc, /sys, /boot and /lib/modules are read, and functions for the
// lookups that are not files (PATH, exec, statfs, the daemons). System is
// the live host; tests give fake trees. `moat doctor` prints a Report;
// `moat serve` refuses to start on a Fail (Report.Err) and logs the
// warnings.
package preflight

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/moat-sandbox/moat/internal/errdefs"
)

// Status is the outcome of one check.
type Status string

const (
	// OK: the host has it.
	OK Status = "ok"
	// Info: not present, and not needed by this configuration.
	Info Status = "info"
	// Warn: a soft requirement lacks (a feature will not work, or the
	// check cannot tell); the server starts.
	Warn Status = "warn"
	// Fail: a hard requirement of the chosen backend lacks; the server
	// refuses to start.
	Fail Status = "fail"
)

// Check is the result of one check.
type Check struct {
	// Name identifies the check ("cgroup", "cgroup.memory",
	// "kernel.overlayfs", "runtime.runc", "disk", "docker", ...).
	Name   string `json:"name"`
	Status Status `json:"status"`
	// Detail says what was found.
	Detail string `json:"detail"`
	// Fix says how to get what lacks (empty when nothing does).
	Fix string `json:"fix,omitempty"`
}

// Report is the result of Run, in check order.
type Report struct {
	Checks []Check `json:"checks"`
}

// With returns the checks of status s.
func (r Report) With(s Status) []Check {
	var out []Check
	for _, c := range r.Checks {
		if c.Status == s {
			out = append(out, c)
		}
	}
	return out
}

// Find returns the check called name.
func (r Report) Find(name string) (Check, bool) {
	for _, c := range r.Checks {
		if c.Name == name {
			return c, true
		}
	}
	return Check{}, false
}

// Err is nil unless a check failed; then it lists every failure with its
// fix, as an errdefs.ErrFailedPrecondition.
func (r Report) Err() error {
	failed := r.With(Fail)
	if len(failed) == 0 {
		return nil
	}
	var b strings.Builder
	fmt.Fprintf(&b, "the host lacks what the server needs (run `moat doctor` for the full report):")
	for _, c := range failed {
		fmt.Fprintf(&b, "\n  %s: %s", c.Name, c.Detail)
		if c.Fix != "" {
			fmt.Fprintf(&b, "\n    fix: %s", c.Fix)
		}
	}
	return fmt.Errorf("%s: %w", b.String(), errdefs.ErrFailedPrecondition)
}

// Config is what the checks need to know of the server's configuration.
type Config struct {
	// Runtime is the backend: "oci", "docker", "kubernetes" or "fake".
	Runtime string
	// Root is the state directory (--root), whose free space is checked.
	Root string
	// CgroupParent is the cgroup native sandboxes are made under (oci).
	CgroupParent string
	// DefaultClass is the OCI runtime sandboxes use by default (oci): it
	// must be installed.
	DefaultClass string
	// Classes are the OCI runtimes the backend offers when installed,
	// each looked up on PATH.
	Classes []string
	// DiskQuota is set when sandboxes get a writable-layer quota (loop
	// mounted ext4 files).
	DiskQuota bool
}

// Host is the view of the host the checks read.
type Host struct {
	// Root is the directory /proc, /sys, /boot and /lib/modules are read
	// under ("/" on the live host).
	Root string
	// LookPath finds an executable on PATH (exec.LookPath).
	LookPath func(file string) (string, error)
	// Output runs a program and returns its standard output.
	Output func(ctx context.Context, path string, args ...string) ([]byte, error)
	// FreeBytes returns the space available to moat on the filesystem
	// holding path, or on that of its nearest existing ancestor.
	FreeBytes func(path string) (uint64, error)
	// Euid returns the effective user ID.
	Euid func() int
	// Docker, if set, reaches the Docker daemon and returns its version.
	Docker func(ctx context.Context) (string, error)
	// Kubernetes, if set, reaches the Kubernetes API server, checks that
	// moat's CRDs are installed, and returns the server's version.
	Kubernetes func(ctx context.Context) (string, error)
}

// path returns p (absolute) under the host's root.
func (h Host) path(p string) string { return filepath.Join(h.Root, p) }

func (h Host) read(p string) (string, error) {
	b, err := os.ReadFile(h.path(p))
	return string(b), err
}

func (h Host) exists(p string) bool {
	_, err := os.Stat(h.path(p))
	return err == nil
}

// Run runs the checks that cfg's backend needs, in a fixed order.
func Run(ctx context.Context, cfg Config, h Host) Report {
	var r Report
	add := func(cs ...Check) { r.Checks = append(r.Checks, cs...) }
	switch cfg.Runtime {
	case "oci":
		add(privileges(cfg, h))
		add(cgroups(cfg, h)...)
		add(kernel(cfg, h)...)
		add(runtimes(ctx, cfg, h)...)
		add(disk(cfg, h))
	case "docker":
		add(privileges(cfg, h))
		add(docker(ctx, h))
		add(kernel(cfg, h)...)
		add(disk(cfg, h))
	case "kubernetes":
		add(kubernetes(ctx, h))
	default:
		add(Check{Name: "runtime", Status: OK, Detail: fmt.Sprintf("backend %q needs nothing of the host", cfg.Runtime)})
	}
	return r
}

// privileges: the native and Docker backends make network namespaces,
// nftables tables, mounts and cgroups.
func privileges(cfg Config, h Host) Check {
	c := Check{Name: "privileges"}
	if h.Euid == nil {
		c.Status, c.Detail = Warn, "cannot tell the effective user"
		return c
	}
	if uid := h.Euid(); uid != 0 {
		c.Status, c.Detail = Fail, fmt.Sprintf("running as uid %d; the %s backend makes network namespaces, nftables tables, mounts and cgroups", uid, cfg.Runtime)
		c.Fix = "run moat serve as root (sudo, or a systemd unit without User=)"
		return c
	}
	c.Status, c.Detail = OK, "running as root"
	return c
}

// Disk thresholds of --root's filesystem: below diskFail a create fails
// soon (an image pull, a writable layer); below diskWarn it will.
const (
	diskFail = 256 << 20
	diskWarn = 2 << 30
)

func disk(cfg Config, h Host) Check {
	c := Check{Name: "disk"}
	if h.FreeBytes == nil {
		c.Status, c.Detail = Warn, "cannot tell free space"
		return c
	}
	free, err := h.FreeBytes(cfg.Root)
	if err != nil {
		c.Status, c.Detail = Warn, fmt.Sprintf("free space of %s: %v", cfg.Root, err)
		return c
	}
	c.Detail = fmt.Sprintf("%s free under %s", bytesIEC(free), cfg.Root)
	fix := "free space on that filesystem, or point --root at a larger one"
	switch {
	case free < diskFail:
		c.Status, c.Fix = Fail, fix
		c.Detail += fmt.Sprintf(" (needs at least %s for images and writable layers)", bytesIEC(diskFail))
	case free < diskWarn:
		c.Status, c.Fix = Warn, fix
		c.Detail += fmt.Sprintf(" (under %s: image pulls and writable layers will fill it soon)", bytesIEC(diskWarn))
	default:
		c.Status = OK
	}
	return c
}

func bytesIEC(n uint64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := uint64(unit), 0
	for m := n / unit; m >= unit; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTPE"[exp])
}

func docker(ctx context.Context, h Host) Check {
	c := Check{Name: "docker"}
	if h.Docker == nil {
		c.Status, c.Detail = Warn, "no way to reach the Docker daemon configured"
		return c
	}
	v, err := h.Docker(ctx)
	if err != nil {
		c.Status, c.Detail = Fail, fmt.Sprintf("Docker daemon unreachable: %v", err)
		c.Fix = "start dockerd (systemctl start docker), or point --docker-host at a running daemon"
		return c
	}
	c.Status, c.Detail = OK, "Docker Engine "+v
	return c
}

func kubernetes(ctx context.Context, h Host) Check {
	c := Check{Name: "kubernetes"}
	if h.Kubernetes == nil {
		c.Status, c.Detail = Warn, "no way to reach the Kubernetes API configured"
		return c
	}
	v, err := h.Kubernetes(ctx)
	if err != nil {
		c.Status, c.Detail = Fail, fmt.Sprintf("Kubernetes API: %v", err)
		c.Fix = "check --kubeconfig ($KUBECONFIG, ~/.kube/config or the in-cluster service account), " +
			"and install moat's CRDs and controller with the Helm chart (deploy/helm/moat)"
		return c
	}
	c.Status, c.Detail = OK, "Kubernetes "+v+", moat's CRDs installed"
	return c
}

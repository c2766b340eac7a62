package preflight

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"
)

// install says how to get each OCI runtime on Debian.
var install = map[string]string{
	"runc":  "apt-get install runc",
	"crun":  "apt-get install crun",
	"runsc": "install gVisor's runsc (https://gvisor.dev/docs/user_guide/install/) on PATH",
}

// runtimes checks the OCI runtimes: each class found on PATH with its
// version; the default class is a hard requirement, the others are
// optional. runsc also wants user namespaces.
func runtimes(ctx context.Context, cfg Config, h Host) []Check {
	classes := slices.Clone(cfg.Classes)
	if cfg.DefaultClass != "" && !slices.Contains(classes, cfg.DefaultClass) {
		classes = append(classes, cfg.DefaultClass)
	}
	var out []Check
	var runsc bool
	for _, class := range classes {
		c := Check{Name: "runtime." + class}
		def := class == cfg.DefaultClass
		p, err := lookPath(h, class)
		if err != nil {
			c.Status, c.Detail = Info, class+" not found on PATH (optional: sandboxes cannot ask for it)"
			c.Fix = install[class]
			if def {
				c.Status, c.Detail = Fail, class+" not found on PATH, and it is the default runtime class (--runtime-class)"
				c.Fix = strings.TrimSpace(install[class] + ", or choose an installed --runtime-class")
			}
			out = append(out, c)
			continue
		}
		runsc = runsc || class == "runsc"
		v, err := version(ctx, h, p)
		if err != nil {
			c.Status, c.Detail = Warn, fmt.Sprintf("%s at %s does not run: %s --version: %v", class, p, p, err)
			c.Fix = "reinstall " + class
			if def {
				c.Status = Fail
			}
			out = append(out, c)
			continue
		}
		c.Status, c.Detail = OK, fmt.Sprintf("%s (%s)", v, p)
		if def {
			c.Detail += ", the default class"
		}
		out = append(out, c)
	}
	if runsc {
		out = append(out, h.has(h.kernelInfo(), userns), maxUserNamespaces(h))
	}
	return out
}

func lookPath(h Host, file string) (string, error) {
	if h.LookPath == nil {
		return "", fmt.Errorf("no PATH lookup")
	}
	return h.LookPath(file)
}

// version runs path --version and returns its first line.
func version(ctx context.Context, h Host, path string) (string, error) {
	if h.Output == nil {
		return "", fmt.Errorf("no exec")
	}
	ctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	out, err := h.Output(ctx, path, "--version")
	if err != nil {
		return "", err
	}
	first, _, _ := strings.Cut(strings.TrimSpace(string(out)), "\n")
	if first == "" {
		return "", fmt.Errorf("printed nothing")
	}
	return strings.TrimSpace(first), nil
}

// maxUserNamespaces: runsc runs its sandbox in a user namespace; a limit
// of 0 refuses them.
func maxUserNamespaces(h Host) Check {
	c := Check{Name: "kernel.userns-limit"}
	data, err := h.read("/proc/sys/user/max_user_namespaces")
	if err != nil {
		c.Status, c.Detail = Warn, "cannot read /proc/sys/user/max_user_namespaces"
		return c
	}
	if v := strings.TrimSpace(data); v == "0" {
		c.Status, c.Detail = Warn, "user.max_user_namespaces is 0: runsc sandboxes cannot start"
		c.Fix = "sysctl -w user.max_user_namespaces=15000 (and in /etc/sysctl.d)"
		return c
	}
	c.Status, c.Detail = OK, "user.max_user_namespaces = "+strings.TrimSpace(data)
	return c
}

package execd

import (
	"context"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// TestDependencies keeps the in-sandbox agent lean: besides the standard
// library it may link only these modules and moat packages.
func TestDependencies(t *testing.T) {
	allowed := []string{
		"github.com/moat-sandbox/moat/internal/execd",
		"github.com/moat-sandbox/moat/internal/errdefs",
		"github.com/moat-sandbox/moat/internal/web",
		"golang.org/x/sys/",
		"github.com/creack/pty",
		"github.com/coder/websocket",
		"github.com/go-zeromq/zmq4",  // Jupyter kernels (jupyter.go)
		"golang.org/x/sync/errgroup", // zmq4
		"golang.org/x/text/",         // zmq4 (cases, for socket option names)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, "go", "list", "-deps", "-f", "{{if not .Standard}}{{.ImportPath}}{{end}}", ".").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	for _, pkg := range strings.Fields(string(out)) {
		ok := false
		for _, a := range allowed {
			if strings.HasPrefix(pkg, a) {
				ok = true
			}
		}
		if !ok {
			t.Errorf("execd links %s; the agent may only use the stdlib, x/sys, creack/pty, coder/websocket and go-zeromq/zmq4", pkg)
		}
	}
}

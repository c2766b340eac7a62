package main

import (
	"context"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// layer ranks a product package of the module: the edge (binaries, CLI
// verbs, the server's wiring) over the APIs over the sandbox service (the
// lifecycle core, its features and their wiring) over the mechanics
// (runtimes, networking, egress, images, stores, the agent). A package may
// import its own layer or a lower one, never a higher one.
func layer(rel string) (int, string) {
	under := func(p string) bool { return rel == p || strings.HasPrefix(rel, p+"/") }
	switch {
	case under("cmd"), under("internal/cli"), under("internal/server"), under("internal/mcp"):
		return 4, "the edge"
	case under("internal/httpapi"), under("internal/console"), under("internal/e2b"):
		return 3, "an API"
	case under("internal/lifecycle"), under("internal/sandbox"):
		return 2, "the sandbox service"
	}
	return 1, "a mechanism"
}

// TestLayers fails on an import that runs against the layering, and on the
// lifecycle core importing one of its features (they plug into the core
// through its interfaces, not the other way round).
func TestLayers(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "go", "list", "-f", "{{.ImportPath}} {{join .Imports \" \"}}", module+"...")
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	checked := 0
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		fields := strings.Fields(line)
		from, ok := strings.CutPrefix(fields[0], module)
		if !ok || lab(fields[0]) != "" {
			continue
		}
		for _, imp := range fields[1:] {
			to, ok := strings.CutPrefix(imp, module)
			if !ok || lab(imp) != "" {
				continue
			}
			checked++
			if violation := layerViolation(from, to); violation != "" {
				t.Errorf("%s imports %s: %s", from, to, violation)
			}
		}
	}
	if checked < 100 {
		t.Fatalf("only %d imports inside the module checked: go list output looks wrong", checked)
	}
}

// layerViolation says why from must not import to ("" if it may).
func layerViolation(from, to string) string {
	fl, fname := layer(from)
	tl, tname := layer(to)
	if tl > fl {
		return fname + " imports " + tname
	}
	if from == "internal/lifecycle" && to != from && (strings.HasPrefix(to, "internal/lifecycle/") || to == "internal/sandbox") {
		return "the lifecycle core imports a feature"
	}
	return ""
}

// TestLayerRule: the rule of TestLayers refuses the imports it is for and
// lets the ordinary ones pass.
func TestLayerRule(t *testing.T) {
	for i, c := range []struct {
		from, to string
		bad      bool
	}{
		{"internal/runtime/oci", "internal/lifecycle", true},
		{"internal/lifecycle", "internal/httpapi", true},
		{"internal/httpapi", "internal/server", true},
		{"internal/egress/vault", "internal/sandbox", true},
		{"internal/lifecycle", "internal/lifecycle/pool", true},
		{"internal/lifecycle/pool", "internal/lifecycle", false},
		{"internal/sandbox", "internal/lifecycle/pool", false},
		{"internal/httpapi", "internal/sandbox", false},
		{"internal/server", "internal/httpapi", false},
		{"internal/cli", "internal/k8s/controller", false},
		{"internal/runtime/oci", "internal/network", false},
	} {
		if got := layerViolation(c.from, c.to) != ""; got != c.bad {
			t.Errorf("%d: layerViolation(%s, %s) = %v, want %v", i, c.from, c.to, got, c.bad)
		}
	}
}

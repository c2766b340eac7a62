package cli

import (
	"encoding/json"
	"strings"
	"testing"
)

func TestTemplateVerbs(t *testing.T) {
	url := realAPI(t)
	// The server flags go before any "--".
	as := func(args ...string) (string, string, int) {
		return runMoat(t, nil, append([]string{args[0], "--server", url, "--api-key", "root-key"}, args[1:]...)...)
	}
	out, errOut, code := as("template", "create", "py", "--image", "python:3", "-e", "A=1", "-r", "cpu=1,memory=1Gi",
		"--user", "user", "--workdir", "/home/user", "--timeout", "10m", "--", "sleep", "infinity")
	if code != 0 || strings.TrimSpace(out) != "py" {
		t.Fatalf("create: %d %q %q", code, out, errOut)
	}
	if _, errOut, code = as("template", "create", "py", "--image", "x"); code != 3 || !strings.Contains(errOut, "TEMPLATE::ALREADY_EXISTS") {
		t.Fatalf("duplicate: %d %q", code, errOut)
	}
	for _, args := range [][]string{
		{"template", "create", "x"},
		{"template", "create", "x", "--image", "a", "--pool", "p"},
		{"template", "create", "Bad Id", "--image", "a"},
		{"template", "create", "x", "--image", "a", "--timeout", "1.5s"},
	} {
		if _, errOut, code := as(args...); code != 2 {
			t.Errorf("%v: exit %d, want 2 (%q)", args, code, errOut)
		}
	}
	out, _, code = as("template", "ls")
	if code != 0 || !strings.Contains(out, "base") || !strings.Contains(out, "code-interpreter-v1") || !strings.Contains(out, "python:3") || !strings.Contains(out, "(built in)") {
		t.Fatalf("ls: %d %q", code, out)
	}
	out, _, code = as("template", "get", "py", "-o", "json")
	var tm map[string]any
	if code != 0 || json.Unmarshal([]byte(out), &tm) != nil || tm["timeoutSeconds"].(float64) != 600 || tm["workdir"] != "/home/user" {
		t.Fatalf("get: %d %q", code, out)
	}
	if out, _, code = as("template", "get", "py"); code != 0 || !strings.Contains(out, "sleep infinity") || !strings.Contains(out, "cpu=1") {
		t.Fatalf("get table: %d %q", code, out)
	}
	if _, _, code = as("template", "get", "nope"); code != 4 {
		t.Fatalf("get unknown: exit %d, want 4", code)
	}
	// A sandbox from the template.
	out, errOut, code = as("sb", "create", "--template", "py", "-q")
	if code != 0 || strings.TrimSpace(out) == "" {
		t.Fatalf("sb create --template: %d %q %q", code, out, errOut)
	}
	id := strings.TrimSpace(out)
	if out, _, code = as("sb", "get", id, "-o", "json"); code != 0 || !strings.Contains(out, "python:3") {
		t.Fatalf("sandbox from template: %d %q", code, out)
	}
	if _, _, code = as("template", "rm", "base"); code != 3 {
		t.Fatalf("rm built-in: exit %d, want 3", code)
	}
	if out, _, code = as("template", "rm", "py"); code != 0 {
		t.Fatalf("rm: %d %q", code, out)
	}
	if _, _, code = as("template", "get", "py"); code != 4 {
		t.Fatalf("get after rm: exit %d", code)
	}
}

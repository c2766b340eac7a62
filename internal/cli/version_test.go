package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"regexp"
	"runtime"
	"strings"
	"testing"

	"github.com/moat-sandbox/moat/internal/agentbin"
)

// execCLI runs the command tree with args and returns its standard output.
func execCLI(t *testing.T, args ...string) (string, error) {
	t.Helper()
	root := NewRoot()
	var out bytes.Buffer
	root.SetOut(&out)
	root.SetErr(&out)
	root.SetArgs(args)
	err := root.ExecuteContext(context.Background())
	return out.String(), err
}

// TestVersion: `moat version` names the version, commit, Go version,
// platform and the carried agent's digest, as a table or as JSON.
func TestVersion(t *testing.T) {
	digest, derr := agentbin.Digest()
	out, err := execCLI(t, "version", "-o", "json")
	if err != nil {
		t.Fatal(err)
	}
	var v map[string]any
	if err := json.Unmarshal([]byte(out), &v); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	if v["version"] == "" || v["goVersion"] != runtime.Version() || v["platform"] != runtime.GOOS+"/"+runtime.GOARCH || v["agentDigest"] != digest {
		t.Errorf("version -o json: %s (agent digest %q, %v)", out, digest, derr)
	}
	if derr == nil && !regexp.MustCompile(`^sha256:[0-9a-f]{64}$`).MatchString(digest) {
		t.Errorf("agent digest %q", digest)
	}

	out, err = execCLI(t, "version")
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	var keys []string
	for _, l := range lines {
		keys = append(keys, strings.Fields(l)[0])
	}
	if strings.Join(keys, " ") != "moat commit go platform agent" {
		t.Fatalf("version lines %q", lines)
	}
	agent := strings.Fields(lines[4])[1]
	if derr == nil && agent != digest || derr != nil && agent != "none" {
		t.Errorf("agent line %q, digest %q (%v)", lines[4], digest, derr)
	}
	if !strings.Contains(lines[2], runtime.Version()) {
		t.Errorf("go line %q", lines[2])
	}
}

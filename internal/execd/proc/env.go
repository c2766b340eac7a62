package proc

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// DefaultPath is the PATH used when the environment has none.
const DefaultPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// LookPath resolves name against the PATH in env (names with a slash are
// used as they are).
func LookPath(name string, env []string) (string, error) {
	if strings.Contains(name, "/") {
		return name, nil
	}
	path := LookupEnv(env, "PATH")
	if path == "" {
		path = DefaultPath
	}
	for _, dir := range filepath.SplitList(path) {
		p := filepath.Join(dir, name)
		if st, err := os.Stat(p); err == nil && !st.IsDir() && st.Mode()&0o111 != 0 {
			return p, nil
		}
	}
	return "", fmt.Errorf("%q not found in PATH: %w", name, exec.ErrNotFound)
}

// findShell returns bash from PATH, else sh, else /bin/sh.
func findShell(env []string) string {
	for _, name := range []string{"bash", "sh"} {
		if p, err := LookPath(name, env); err == nil {
			return p
		}
	}
	return "/bin/sh"
}

// LookupEnv returns the last value of key in env ("" if unset).
func LookupEnv(env []string, key string) string {
	for i := len(env) - 1; i >= 0; i-- {
		if k, v, ok := strings.Cut(env[i], "="); ok && k == key {
			return v
		}
	}
	return ""
}

// MergeEnv layers overlays over base; later keys win and keep the
// position of their first occurrence.
func MergeEnv(base []string, overlays ...[]string) []string {
	idx := make(map[string]int, len(base))
	out := make([]string, 0, len(base)+8)
	add := func(kv string) {
		k, _, _ := strings.Cut(kv, "=")
		if i, ok := idx[k]; ok {
			out[i] = kv
			return
		}
		idx[k] = len(out)
		out = append(out, kv)
	}
	for _, kv := range base {
		add(kv)
	}
	for _, o := range overlays {
		for _, kv := range o {
			add(kv)
		}
	}
	return out
}

// envFileLines reads KEY=VALUE lines from the EXECD_ENVS file (missing file
// = none; blank lines and # comments skipped).
func envFileLines(path string) []string {
	if path == "" {
		return nil
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return nil
	}
	var out []string
	for _, line := range strings.Split(string(data), "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		line = strings.TrimPrefix(line, "export ")
		if k, _, ok := strings.Cut(line, "="); ok && k != "" {
			out = append(out, line)
		}
	}
	return out
}

// ChildEnv returns environ minus the agent's own variables (EXECD_*,
// MOAT_*), which children must not inherit (the access token in particular).
func ChildEnv(environ []string) []string {
	out := make([]string, 0, len(environ))
	for _, kv := range environ {
		if strings.HasPrefix(kv, "EXECD_") || strings.HasPrefix(kv, "MOAT_") {
			continue
		}
		out = append(out, kv)
	}
	return out
}

// ExpandPath expands ~, $HOME and $VAR (from env, then the agent's own
// environment) and makes p absolute.
func ExpandPath(p string, env []string) string {
	getenv := func(k string) string {
		if v := LookupEnv(env, k); v != "" {
			return v
		}
		return os.Getenv(k)
	}
	if p == "~" || strings.HasPrefix(p, "~/") {
		home := getenv("HOME")
		if home == "" {
			home = "/root"
		}
		p = home + p[1:]
	}
	p = os.Expand(p, getenv)
	if abs, err := filepath.Abs(p); err == nil {
		p = abs
	}
	return p
}

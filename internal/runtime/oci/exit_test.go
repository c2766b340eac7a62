package oci

import (
	"os"
	"path/filepath"
	"testing"
)

func TestReadExit(t *testing.T) {
	for _, c := range []struct {
		in     string
		code   int
		reason string
	}{
		{"137 OOMKilled", 137, "OOMKilled"},
		{"3 Exited\n", 3, "Exited"},
		{"0", 0, ""}, // written by earlier releases
		{"-1 OOMKilled", -1, "OOMKilled"},
		{"", 0, ""},
	} {
		if code, reason := readExit([]byte(c.in)); code != c.code || reason != c.reason {
			t.Errorf("readExit(%q) = %d %q, want %d %q", c.in, code, reason, c.code, c.reason)
		}
	}
}

func TestCgroupField(t *testing.T) {
	dir := t.TempDir()
	v1 := filepath.Join(dir, "memory.oom_control")
	os.WriteFile(v1, []byte("oom_kill_disable 0\nunder_oom 0\noom_kill 2\n"), 0o600)
	v2 := filepath.Join(dir, "memory.events")
	os.WriteFile(v2, []byte("low 0\nhigh 0\nmax 7\noom 1\noom_kill 1\noom_group_kill 0\n"), 0o600)
	for _, c := range []struct {
		file string
		want int64
		ok   bool
	}{{v1, 2, true}, {v2, 1, true}, {filepath.Join(dir, "none"), 0, false}} {
		if n, ok := cgroupField(c.file, "oom_kill"); n != c.want || ok != c.ok {
			t.Errorf("%s: %d %v, want %d %v", c.file, n, ok, c.want, c.ok)
		}
	}
}

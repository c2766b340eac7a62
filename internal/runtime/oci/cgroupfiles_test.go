package oci

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// cgroupDir is the directory of cgroup path cg holding the files of
// controller ctrl: <root>/<ctrl><cg> on a v1 or hybrid host,
// <root><cg> on a v2 (unified) host.
func cgroupDir(ctrl, cg string) string {
	if isCgroup2(cgroupRoot) {
		return filepath.Join(cgroupRoot, cg)
	}
	return filepath.Join(cgroupRoot, ctrl, cg)
}

// cgroupValue reads a value of cgroup cg by its v1 name in either layout,
// so that the tests check the same thing on v1 and v2 hosts:
// memory.limit_in_bytes is memory.max on v2, memory.failcnt the "max"
// count of memory.events, cpu.cfs_quota_us and cpu.cfs_period_us the two
// fields of cpu.max; pids.* have the same names in both.
func cgroupValue(t testing.TB, cg, v1name string) string {
	t.Helper()
	ctrl, _, _ := strings.Cut(v1name, ".")
	read := func(name string) string {
		t.Helper()
		data, err := os.ReadFile(filepath.Join(cgroupDir(ctrl, cg), name))
		if err != nil {
			t.Fatal(err)
		}
		return strings.TrimSpace(string(data))
	}
	if !isCgroup2(cgroupRoot) {
		return read(v1name)
	}
	switch v1name {
	case "memory.limit_in_bytes":
		return read("memory.max")
	case "memory.failcnt":
		for line := range strings.SplitSeq(read("memory.events"), "\n") {
			if k, v, _ := strings.Cut(line, " "); k == "max" {
				return v
			}
		}
		t.Fatalf("no max count in %s memory.events", cg)
	case "cpu.cfs_quota_us", "cpu.cfs_period_us":
		f := strings.Fields(read("cpu.max"))
		if len(f) != 2 {
			t.Fatalf("%s cpu.max is %q", cg, f)
		}
		if v1name == "cpu.cfs_period_us" {
			return f[1]
		}
		return f[0]
	}
	return read(v1name)
}

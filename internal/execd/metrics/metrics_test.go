package metrics

import (
	"os"
	"path/filepath"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestCPUCountIsWholeCores: cpu_count is the CPU limit (cgroup v2 or v1
// quota, capped at the CPUs present) in whole cores, rounded up.
func TestCPUCountIsWholeCores(t *testing.T) {
	for i, tc := range []struct {
		files map[string]string
		ncpu  int
		limit float64
		cores float64
	}{
		0: {map[string]string{"cpu.max": "50000 100000\n"}, 8, 0.5, 1},
		1: {map[string]string{"cpu.max": "150000 100000\n"}, 8, 1.5, 2},
		2: {map[string]string{"cpu.max": "200000 100000\n"}, 8, 2, 2},
		3: {map[string]string{"cpu.max": "max 100000\n"}, 4, 4, 4},
		4: {map[string]string{"cpu.max": "800000 100000\n"}, 2, 2, 2},
		5: {map[string]string{"cpu/cpu.cfs_quota_us": "25000\n", "cpu/cpu.cfs_period_us": "100000\n"}, 2, 0.25, 1},
		6: {map[string]string{"cpu/cpu.cfs_quota_us": "-1\n", "cpu/cpu.cfs_period_us": "100000\n"}, 3, 3, 3},
		7: {nil, 2, 2, 2},
	} {
		root := t.TempDir()
		for name, data := range tc.files {
			os.MkdirAll(filepath.Dir(filepath.Join(root, name)), 0o755)
			if err := os.WriteFile(filepath.Join(root, name), []byte(data), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		limit := cpuLimit(root, tc.ncpu)
		if limit != tc.limit || wholeCores(limit) != tc.cores {
			t.Errorf("%d: limit %v cores %v, want %v and %v", i, limit, wholeCores(limit), tc.limit, tc.cores)
		}
	}
}

package oci

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/moat-sandbox/moat/internal/runtime"
	"github.com/moat-sandbox/moat/internal/runtime/runtimetest"
)

// TestSelfTasksFile checks that the warm-up writes to the tasks file of the
// v1 pids cgroup this process is in (a no-op move), or to nothing on a host
// without one.
func TestSelfTasksFile(t *testing.T) {
	data, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		t.Fatal(err)
	}
	want := ""
	for line := range strings.SplitSeq(strings.TrimSpace(string(data)), "\n") {
		if f := strings.SplitN(line, ":", 3); len(f) == 3 && f[1] == "pids" {
			want = "/sys/fs/cgroup/pids" + strings.TrimSuffix(f[2], "/") + "/tasks"
		}
	}
	got := selfTasksFile()
	if got != want {
		t.Fatalf("selfTasksFile() = %q, want %q", got, want)
	}
	if got == "" {
		return
	}
	tasks, err := os.ReadFile(got)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(strings.Fields(string(tasks)), strconv.Itoa(os.Getpid())) {
		t.Fatalf("%s does not list this process (%d): not its own cgroup", got, os.Getpid())
	}
}

// BenchmarkCgroupWarmupCrun creates crun sandboxes one at a time, 150 ms
// apart (so that the kernel's cgroup attach lock has gone idle, as between
// a client's creates), alternating with and without warmCgroupAttach, and
// reports the p50 of Create for each (warm-p50-ms, cold-p50-ms): the two
// halves see the same machine load.
//
//	go test -run='^$' -bench=CgroupWarmupCrun -benchtime=40x ./internal/runtime/oci/
func BenchmarkCgroupWarmupCrun(b *testing.B) {
	if _, err := exec.LookPath("crun"); err != nil {
		b.Skip("crun not installed")
	}
	e := newEnv(b, "crun", nil)
	r, err := New(context.Background(), e.cfg, Deps{Images: e.images})
	if err != nil {
		b.Fatal(err)
	}
	defer r.Close()
	if r.tasksFile == "" {
		b.Skip("no cgroup v1 pids hierarchy: the warm-up is off")
	}
	tasks := r.tasksFile
	ctx := context.Background()
	var warm, cold []time.Duration
	for i := 0; b.Loop(); i++ {
		b.StopTimer()
		time.Sleep(150 * time.Millisecond)
		on := i%2 == 0
		if on {
			r.tasksFile = tasks
		} else {
			r.tasksFile = ""
		}
		id := fmt.Sprintf("cgwarm-%d-%d", i, time.Now().UnixNano()%100000)
		b.StartTimer()
		start := time.Now()
		if _, err := r.Create(ctx, runtime.Spec{ID: id, Image: testImage, AgentToken: runtimetest.Token}); err != nil {
			b.Fatal(err)
		}
		d := time.Since(start)
		b.StopTimer()
		if on {
			warm = append(warm, d)
		} else {
			cold = append(cold, d)
		}
		if err := r.Delete(ctx, id); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
	}
	r.tasksFile = tasks
	p50 := func(d []time.Duration) float64 {
		if len(d) == 0 {
			return 0
		}
		s := slices.Clone(d)
		slices.Sort(s)
		return float64(s[len(s)/2].Microseconds()) / 1000
	}
	b.ReportMetric(p50(warm), "warm-p50-ms")
	b.ReportMetric(p50(cold), "cold-p50-ms")
}

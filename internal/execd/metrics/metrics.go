// Package metrics is the agent's GET /metrics and GET /metrics/watch: CPU
// and memory of the sandbox, from its cgroup (v1 or v2) when limited, else
// from /proc.
package metrics

import (
	"bufio"
	"context"
	"encoding/json"
	"math"
	"net/http"
	"os"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/moat-sandbox/moat/internal/execd/wire"
)

// Metrics is the GET /metrics body. CPUCount is whole cores; CPUUsedPct
// is the share of the sandbox's CPU limit (which may be fractional) in use.
type Metrics struct {
	CPUCount    float64 `json:"cpu_count"`
	CPUUsedPct  float64 `json:"cpu_used_pct"`
	MemTotalMiB float64 `json:"mem_total_mib"`
	MemUsedMiB  float64 `json:"mem_used_mib"`
	Timestamp   int64   `json:"timestamp"`
}

// cgroupRoot is where the sandbox's own cgroup is visible.
const cgroupRoot = "/sys/fs/cgroup"

func readInt(path string) (int64, bool) {
	data, err := os.ReadFile(path)
	if err != nil {
		return 0, false
	}
	v, err := strconv.ParseInt(strings.TrimSpace(string(data)), 10, 64)
	return v, err == nil
}

// cpuLimit returns the CPU quota in cores (cgroup v2 cpu.max or v1
// cfs_quota/period under root), at most ncpu; ncpu without a quota.
func cpuLimit(root string, ncpu int) float64 {
	n := float64(ncpu)
	if data, err := os.ReadFile(root + "/cpu.max"); err == nil {
		f := strings.Fields(string(data))
		if len(f) == 2 && f[0] != "max" {
			q, _ := strconv.ParseFloat(f[0], 64)
			p, _ := strconv.ParseFloat(f[1], 64)
			if q > 0 && p > 0 {
				return min(q/p, n)
			}
		}
		return n
	}
	q, ok1 := readInt(root + "/cpu/cpu.cfs_quota_us")
	p, ok2 := readInt(root + "/cpu/cpu.cfs_period_us")
	if ok1 && ok2 && q > 0 && p > 0 {
		return min(float64(q)/float64(p), n)
	}
	return n
}

// wholeCores is the cpu_count of a CPU limit: whole cores, as upstream
// reports it (its runtime.GOMAXPROCS, an integer). A fractional quota is
// rounded up: a sandbox with half a core has one core to run on.
func wholeCores(limit float64) float64 { return max(1, math.Ceil(limit)) }

// cpuUsage returns cumulative CPU time: the cgroup's usage, or all CPUs'
// busy time from /proc/stat.
func cpuUsage() (time.Duration, bool) {
	if data, err := os.ReadFile(cgroupRoot + "/cpu.stat"); err == nil {
		for _, line := range strings.Split(string(data), "\n") {
			if v, ok := strings.CutPrefix(line, "usage_usec "); ok {
				us, err := strconv.ParseInt(v, 10, 64)
				return time.Duration(us) * time.Microsecond, err == nil
			}
		}
	}
	for _, p := range []string{cgroupRoot + "/cpuacct/cpuacct.usage", cgroupRoot + "/cpu,cpuacct/cpuacct.usage"} {
		if ns, ok := readInt(p); ok {
			return time.Duration(ns), true
		}
	}
	f, err := os.Open("/proc/stat")
	if err != nil {
		return 0, false
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	if !sc.Scan() {
		return 0, false
	}
	fields := strings.Fields(sc.Text())
	var busy int64
	for i, v := range fields[1:] {
		if i == 3 || i == 4 { // idle, iowait
			continue
		}
		n, _ := strconv.ParseInt(v, 10, 64)
		busy += n
	}
	return time.Duration(busy) * 10 * time.Millisecond, true // USER_HZ = 100
}

// memory returns total and used bytes: the cgroup limit and usage (minus
// inactive page cache) when limited, else /proc/meminfo.
func memory() (total, used int64) {
	var memTotal, memAvail int64
	if f, err := os.Open("/proc/meminfo"); err == nil {
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			fs := strings.Fields(sc.Text())
			if len(fs) < 2 {
				continue
			}
			v, _ := strconv.ParseInt(fs[1], 10, 64)
			switch fs[0] {
			case "MemTotal:":
				memTotal = v << 10
			case "MemAvailable:":
				memAvail = v << 10
			}
		}
		f.Close()
	}
	total, used = memTotal, memTotal-memAvail
	limit, ok := readInt(cgroupRoot + "/memory.max")
	usage, ok2 := readInt(cgroupRoot + "/memory.current")
	inactive := statField(cgroupRoot+"/memory.stat", "inactive_file")
	if !ok {
		limit, ok = readInt(cgroupRoot + "/memory/memory.limit_in_bytes")
		usage, ok2 = readInt(cgroupRoot + "/memory/memory.usage_in_bytes")
		inactive = statField(cgroupRoot+"/memory/memory.stat", "total_inactive_file")
	}
	if ok && ok2 && limit > 0 && limit < memTotal {
		total, used = limit, max(usage-inactive, 0)
	}
	return total, used
}

func statField(path, key string) int64 {
	data, err := os.ReadFile(path)
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(data), "\n") {
		if v, ok := strings.CutPrefix(line, key+" "); ok {
			n, _ := strconv.ParseInt(v, 10, 64)
			return n
		}
	}
	return 0
}

// sampleMetrics measures CPU use over window.
func sampleMetrics(ctx context.Context, window time.Duration) Metrics {
	cpus := cpuLimit(cgroupRoot, runtime.NumCPU())
	u0, ok0 := cpuUsage()
	t0 := time.Now()
	select {
	case <-time.After(window):
	case <-ctx.Done():
	}
	u1, ok1 := cpuUsage()
	wall := time.Since(t0)
	m := Metrics{CPUCount: wholeCores(cpus), Timestamp: time.Now().UnixMilli()}
	if ok0 && ok1 && wall > 0 && cpus > 0 {
		m.CPUUsedPct = min(100, max(0, float64(u1-u0)/float64(wall)/cpus*100))
	}
	total, used := memory()
	m.MemTotalMiB = float64(total) / (1 << 20)
	m.MemUsedMiB = float64(used) / (1 << 20)
	return m
}

// Get serves GET /metrics: one sample over 100 ms.
func Get(w http.ResponseWriter, r *http.Request) error {
	return wire.WriteJSON(w, sampleMetrics(r.Context(), 100*time.Millisecond))
}

// Watch serves GET /metrics/watch: one JSON object per line about every
// second until the client goes away.
func Watch(w http.ResponseWriter, r *http.Request) error {
	rc := http.NewResponseController(w)
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	w.Header().Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	enc := json.NewEncoder(w)
	for r.Context().Err() == nil {
		m := sampleMetrics(r.Context(), time.Second)
		if r.Context().Err() != nil {
			break
		}
		rc.SetWriteDeadline(time.Now().Add(wire.WriteWindow))
		if enc.Encode(m) != nil || rc.Flush() != nil {
			break
		}
	}
	return nil
}

// Routes are the metrics routes.
func Routes() []wire.Route {
	return []wire.Route{
		{Pattern: "GET /metrics", Handler: Get},
		{Pattern: "GET /metrics/watch", Handler: Watch},
	}
}

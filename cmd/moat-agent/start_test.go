package main

import (
	"bufio"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/moat-sandbox/moat/internal/agentproto"
	"github.com/moat-sandbox/moat/internal/testutil"
)

// BenchmarkAgentStart starts the shipped agent artifact (MOAT_AGENT_BIN or a
// fresh build) once per iteration on a loopback port and reports the time
// from exec to the first 200 from /ping (start-p50-ms, start-p99-ms) and the
// agent's proportional set size after it has idled for 300 ms (pss-KiB,
// median; from /proc/PID/smaps_rollup: alone on the host, so its text pages
// are not shared with other agents as they are between sandboxes). With
// MOAT_BIN set, "moat-execd" measures the same for the whole moat binary's
// `moat execd` alias, the agent that sandboxes ran before cmd/moat-agent.
//
//	go test -run='^$' -bench=AgentStart -benchtime=50x ./cmd/moat-agent/
func BenchmarkAgentStart(b *testing.B) {
	b.Run("moat-agent", func(b *testing.B) { benchmarkStart(b, []string{testutil.AgentBinary(b)}) })
	if moat := os.Getenv("MOAT_BIN"); moat != "" {
		b.Run("moat-execd", func(b *testing.B) { benchmarkStart(b, []string{moat, "execd"}) })
	}
}

func benchmarkStart(b *testing.B, argv []string) {
	state := b.TempDir()
	client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: 2 * time.Second}
	var starts []time.Duration
	var pss []int
	b.ResetTimer()
	for range b.N {
		addr := freeAddr(b)
		cmd := exec.Command(argv[0], append(argv[1:], "--listen", addr, "--state-dir", state, "--log-level", "warn")...)
		cmd.Env = append(os.Environ(), "EXECD_ACCESS_TOKEN=bench")
		t0 := time.Now()
		if err := cmd.Start(); err != nil {
			b.Fatal(err)
		}
		d, err := waitPing(client, "http://"+addr+agentproto.PingPath, t0)
		if err != nil {
			cmd.Process.Kill()
			cmd.Wait()
			b.Fatal(err)
		}
		starts = append(starts, d)
		time.Sleep(300 * time.Millisecond)
		kib, err := readPss(cmd.Process.Pid)
		if err != nil {
			b.Fatal(err)
		}
		pss = append(pss, kib)
		cmd.Process.Signal(syscall.SIGTERM)
		cmd.Wait()
	}
	b.StopTimer()
	slices.Sort(starts)
	slices.Sort(pss)
	b.ReportMetric(float64(starts[len(starts)/2].Microseconds())/1000, "start-p50-ms")
	b.ReportMetric(float64(starts[(len(starts)*99)/100].Microseconds())/1000, "start-p99-ms")
	b.ReportMetric(float64(pss[len(pss)/2]), "pss-KiB")
}

// waitPing polls url until it answers 200 and returns the time since t0.
func waitPing(c *http.Client, url string, t0 time.Time) (time.Duration, error) {
	deadline := t0.Add(10 * time.Second)
	for time.Now().Before(deadline) {
		req, _ := http.NewRequest(http.MethodGet, url, nil)
		req.Header.Set(agentproto.TokenHeader, "bench")
		resp, err := c.Do(req)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return time.Since(t0), nil
			}
		}
		time.Sleep(100 * time.Microsecond)
	}
	return 0, fmt.Errorf("agent did not answer %s within 10 s", url)
}

func readPss(pid int) (int, error) {
	f, err := os.Open("/proc/" + strconv.Itoa(pid) + "/smaps_rollup")
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "Pss:"); ok {
			return strconv.Atoi(strings.TrimSuffix(strings.TrimSpace(v), " kB"))
		}
	}
	return 0, fmt.Errorf("no Pss in smaps_rollup of %d", pid)
}

func freeAddr(b *testing.B) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

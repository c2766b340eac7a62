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

// BenchmarkAgentStart measures the shipped agent from exec to the first
// /ping 200 (start-p50-ms, start-p99-ms) and its PSS after 300 ms idle
// (pss-KiB); "net-http-floor" is the smallest Go HTTP server for scale and
// "moat-execd" (with MOAT_BIN) the whole moat binary's agent alias.
//
//	go test -run='^$' -bench=AgentStart -benchtime=50x ./cmd/moat-agent/
func BenchmarkAgentStart(b *testing.B) {
	b.Run("moat-agent", func(b *testing.B) { benchmarkStart(b, []string{testutil.AgentBinary(b)}) })
	b.Run("net-http-floor", func(b *testing.B) {
		benchmarkStart(b, []string{testutil.Build(b, "./cmd/moat-agent/testdata/floor", "-ldflags=-s -w")})
	})
	if moat := os.Getenv("MOAT_BIN"); moat != "" {
		b.Run("moat-execd", func(b *testing.B) { benchmarkStart(b, []string{moat, "execd"}) })
	}
}

func benchmarkStart(b *testing.B, argv []string) {
	state := b.TempDir()
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
		d, err := waitPing(addr, t0)
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

// waitPing connects to addr every 50 us until the connection is taken
// (the agent listens), then sends GET /ping on it and returns the time
// since t0 once a 200 arrives. A bare connect per attempt keeps the
// poller's own cost (and its share of the 2 cores the agent starts on)
// out of the figure; a refused /ping is retried the same way.
func waitPing(addr string, t0 time.Time) (time.Duration, error) {
	deadline := t0.Add(10 * time.Second)
	for time.Now().Before(deadline) {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			time.Sleep(50 * time.Microsecond)
			continue
		}
		ok := ping(c)
		c.Close()
		if ok {
			return time.Since(t0), nil
		}
		time.Sleep(50 * time.Microsecond)
	}
	return 0, fmt.Errorf("agent did not answer /ping on %s within 10 s", addr)
}

// ping sends GET /ping with the bench token on c and reports a 200.
func ping(c net.Conn) bool {
	c.SetDeadline(time.Now().Add(2 * time.Second))
	req, _ := http.NewRequest(http.MethodGet, "http://agent"+agentproto.PingPath, nil)
	req.Header.Set(agentproto.TokenHeader, "bench")
	req.Close = true
	if err := req.Write(c); err != nil {
		return false
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), req)
	if err != nil {
		return false
	}
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK
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

package bench

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestSummarize(t *testing.T) {
	var ds []time.Duration
	for i := 100; i >= 1; i-- {
		ds = append(ds, time.Duration(i)*time.Millisecond)
	}
	p := Summarize(ds)
	if p.N != 100 || p.P50 != 50*time.Millisecond || p.P99 != 99*time.Millisecond || p.Min != time.Millisecond || p.Max != 100*time.Millisecond {
		t.Fatalf("got %+v", p)
	}
	if p.Mean != 50500*time.Microsecond {
		t.Fatalf("mean %v", p.Mean)
	}
	if (Summarize(nil) != Percentiles{}) {
		t.Fatal("empty input")
	}
	one := Summarize([]time.Duration{7})
	if one.P50 != 7 || one.P99 != 7 {
		t.Fatalf("single: %+v", one)
	}
}

func TestRSSReaders(t *testing.T) {
	if n, ok := procRSS("self"); !ok || n < 1<<20 {
		t.Fatalf("procRSS(self) = %d %v", n, ok)
	}
	if _, ok := procRSS("999999999"); ok {
		t.Fatal("procRSS of a missing pid succeeded")
	}
	m := "# HELP x\nprocess_resident_memory_bytes 1.2345e+07\nmoat_sandboxes{state=\"Running\"} 3\n"
	if n, ok := parseRSSMetric(strings.NewReader(m)); !ok || n != 12345000 {
		t.Fatalf("parseRSSMetric = %d %v", n, ok)
	}
	if _, ok := parseRSSMetric(strings.NewReader("moat_sandboxes 1\n")); ok {
		t.Fatal("parsed a metric that is not there")
	}
}

// TestLockBench: a second in-process benchmark server is refused while one
// runs (they share a bridge), with the holder's pid, and allowed after.
func TestLockBench(t *testing.T) {
	path := filepath.Join(t.TempDir(), "bench.lock")
	first, err := lockBench(path)
	if err != nil {
		t.Fatal(err)
	}
	_, err = lockBench(path)
	if err == nil || !strings.Contains(err.Error(), fmt.Sprintf("pid %d", os.Getpid())) {
		t.Fatalf("second lock: %v, want a refusal naming pid %d", err, os.Getpid())
	}
	first.Close()
	again, err := lockBench(path)
	if err != nil {
		t.Fatalf("lock after release: %v", err)
	}
	again.Close()
}

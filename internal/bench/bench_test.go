package bench

import (
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

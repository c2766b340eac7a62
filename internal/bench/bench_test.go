package bench

import (
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

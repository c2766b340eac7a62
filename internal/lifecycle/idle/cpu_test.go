package idle

import (
	"testing"
	"time"
)

// The history keeps one reading at least a window old as the base and
// at most cpuSamples over the window; the use is measured from that base.
func TestCPUPercent(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	window := 10 * time.Second
	var h []cpuSample
	used := time.Duration(0)
	for i := range 100 {
		used += 50 * time.Millisecond // 5% of a core
		s := cpuSample{at: t0.Add(time.Duration(i) * time.Second), used: used}
		pct, ok := cpuPercent(h, s, window)
		if i < 9 && ok {
			t.Fatalf("reading %d: known %.1f%% before the window is covered", i, pct)
		}
		if i >= 10 && (!ok || pct < 4.9 || pct > 5.1) {
			t.Fatalf("reading %d: %.2f%% %v, want 5%%", i, pct, ok)
		}
		h = addSample(h, s, window)
		if len(h) > cpuSamples+2 || h[0].at.After(s.at.Add(-window)) && i >= 10 {
			t.Fatalf("reading %d: history of %d from %v", i, len(h), h[0].at)
		}
	}
	// A counter that went back (started again) restarts the history.
	s := cpuSample{at: t0.Add(101 * time.Second), used: time.Millisecond}
	if _, ok := cpuPercent(h, s, window); ok {
		t.Fatal("use known across a counter reset")
	}
	if h = addSample(h, s, window); len(h) != 1 {
		t.Fatalf("history after a reset: %d", len(h))
	}
}

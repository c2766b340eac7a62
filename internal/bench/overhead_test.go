package bench

import (
	"math"
	"testing"
	"time"
)

// TestSampleOrder: the servers alternate A B B A A B ..., so each goes
// first in half of the rounds.
func TestSampleOrder(t *testing.T) {
	var seq []int
	first := [2]int{}
	for i := range 6 {
		o := sampleOrder(i)
		seq = append(seq, o[0], o[1])
		first[o[0]]++
	}
	want := []int{0, 1, 1, 0, 0, 1, 1, 0, 0, 1, 1, 0}
	for i := range want {
		if seq[i] != want[i] {
			t.Fatalf("order %v, want %v", seq, want)
		}
	}
	if first[0] != first[1] {
		t.Fatalf("first in %v rounds", first)
	}
}

func TestCompareOverhead(t *testing.T) {
	ms := func(xs ...int) []time.Duration {
		var out []time.Duration
		for _, x := range xs {
			out = append(out, time.Duration(x)*time.Millisecond)
		}
		return out
	}
	for i, c := range []struct {
		a, b       []time.Duration
		p50, noise float64
		aP50, bP50 time.Duration
	}{
		// 1: B 10 % above A; A's halves (rounds 0, 1 and 2, 3) agree.
		{a: ms(10, 10, 10, 10), b: ms(11, 11, 11, 11), p50: 10, noise: 0, aP50: 10 * time.Millisecond, bP50: 11 * time.Millisecond},
		// 2: B below A is a negative overhead.
		{a: ms(20, 20, 20), b: ms(19, 19, 19), p50: -5, noise: 0, aP50: 20 * time.Millisecond, bP50: 19 * time.Millisecond},
		// 3: A's rounds 0, 1 (10, 10) and 2, 3 (12, 12): 20 % of noise.
		{a: ms(10, 10, 12, 12), b: ms(10, 10, 10, 10), p50: 0, noise: 20, aP50: 10 * time.Millisecond, bP50: 10 * time.Millisecond},
		// 4: the noise is a magnitude: rounds 0, 1 (12, 12) above 2, 3 (10, 10).
		{a: ms(12, 12, 10, 10), b: ms(10, 10, 10, 10), p50: 0, noise: 1.0 / 6 * 100, aP50: 10 * time.Millisecond, bP50: 10 * time.Millisecond},
		// 5: what comes first or second in a round (10 and 12) is in both
		// halves alike: no noise.
		{a: ms(10, 12, 10, 12), b: ms(10, 10, 10, 10), p50: 0, noise: 0, aP50: 10 * time.Millisecond, bP50: 10 * time.Millisecond},
		// 6: no samples: no figures, no division by zero.
		{p50: 0, noise: 0},
	} {
		o := CompareOverhead(c.a, c.b)
		if o.A.P50 != c.aP50 || o.B.P50 != c.bP50 || math.Abs(o.P50-c.p50) > 1e-9 || math.Abs(o.Noise-c.noise) > 1e-9 {
			t.Errorf("%d: got p50 %v/%v, overhead %.3f%%, noise %.3f%%; want %v/%v, %.3f%%, %.3f%%",
				i+1, o.A.P50, o.B.P50, o.P50, o.Noise, c.aP50, c.bP50, c.p50, c.noise)
		}
	}
}

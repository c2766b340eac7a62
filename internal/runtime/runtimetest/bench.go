package runtimetest

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/moat-sandbox/moat/internal/runtime"
)

// BenchmarkCreate measures Create of image until the agent answers /ping,
// then deletes the sandbox outside the timed region. It reports the p50
// and p90 until ping, the p50 of Create alone and the mean delete time.
func BenchmarkCreate(b *testing.B, rt runtime.Runtime, image string) {
	ctx := context.Background()
	var lat, startLat []time.Duration
	var del time.Duration
	for i := 0; b.Loop(); i++ {
		// The random part keeps IDs unique across runs against one daemon.
		id := fmt.Sprintf("bench-%d-%04x", i, rand.Uint32()&0xffff)
		start := time.Now()
		if _, err := rt.Create(ctx, runtime.Spec{ID: id, Image: image, AgentToken: Token}); err != nil {
			b.Fatal(err)
		}
		startLat = append(startLat, time.Since(start))
		if err := PingAgent(ctx, rt, id, 10*time.Second); err != nil {
			b.Fatal(err)
		}
		lat = append(lat, time.Since(start))
		b.StopTimer()
		ds := time.Now()
		if err := rt.Delete(ctx, id); err != nil {
			b.Fatal(err)
		}
		del += time.Since(ds)
		b.StartTimer()
	}
	pct := func(d []time.Duration, p int) float64 {
		s := slices.Clone(d)
		slices.Sort(s)
		return float64(s[(len(s)-1)*p/100].Microseconds()) / 1000
	}
	b.ReportMetric(pct(lat, 50), "ping-p50-ms")
	b.ReportMetric(pct(lat, 90), "ping-p90-ms")
	b.ReportMetric(pct(startLat, 50), "create-p50-ms")
	b.ReportMetric(float64(del.Microseconds())/1000/float64(len(lat)), "delete-ms")
}

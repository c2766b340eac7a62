package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"time"
)

// OverheadBenchOptions configure `moat bench overhead`: two servers that
// differ only in what they record, measured in one run.
type OverheadBenchOptions struct {
	// A is the baseline server (no audit trail, no audit log, no
	// telemetry), B the one that audits and traces (audit trail and log
	// on, OTLP export to a collector). Both need Server and APIKey; the
	// image is Image (the servers pull it from the same registry).
	A, B Target
	// Image is the image both servers create sandboxes from.
	Image string
	// RuntimeClass of every sandbox ("" = the servers' default).
	RuntimeClass string
	// Creates and Execs are the samples per server of each figure.
	Creates, Execs int
	// Warmup execs per server before the timed ones (not counted).
	Warmup int
}

// overheadSide is one server of the comparison and its samples.
type overheadSide struct {
	name          string
	c             *Client
	create, first []time.Duration
	total, exec   []time.Duration
}

// RunOverhead measures what auditing and tracing add to the two paths a
// user waits on, side by side: create → Running → first command, and the
// exec round trip of `true` on a running sandbox, both through the
// server proxy as the SDKs use it (the path the audit trail records).
// Samples alternate between the servers in the order sampleOrder gives,
// so a change of the machine's load weighs on both alike. It prints p50
// and p90 of each server, the difference of the p50s, and the noise
// floor: the difference between the p50s of A's own two halves (see
// Overhead.Noise).
func RunOverhead(ctx context.Context, o OverheadBenchOptions, w io.Writer) error {
	if o.A.Server == "" || o.B.Server == "" {
		return errors.New("overhead: both --server-a and --server-b are required")
	}
	if o.Image == "" {
		return errors.New("overhead: --image is required")
	}
	sides := [2]*overheadSide{
		{name: "A", c: &Client{Base: o.A.Server, Key: o.A.APIKey, HTTP: &http.Client{Timeout: 2 * time.Minute, Transport: &http.Transport{}}}},
		{name: "B", c: &Client{Base: o.B.Server, Key: o.B.APIKey, HTTP: &http.Client{Timeout: 2 * time.Minute, Transport: &http.Transport{}}}},
	}
	fmt.Fprintf(w, "moat bench overhead: A %s, B %s, image %s, runtime class %q, %d creates and %d execs per server, interleaved, %d cores\n",
		o.A.Server, o.B.Server, o.Image, o.RuntimeClass, o.Creates, o.Execs, nproc())
	// Warm-up: the first create on each server pulls the image.
	for _, s := range sides {
		id, _, _, err := createOne(ctx, s.c, o.Image, o.RuntimeClass, s.c.ProxyEndpoint)
		if id != "" {
			s.c.Delete(ctx, id)
		}
		if err != nil {
			return fmt.Errorf("%s: warm-up create: %w", s.name, err)
		}
	}
	for i := range o.Creates {
		for _, k := range sampleOrder(i) {
			s := sides[k]
			id, tc, tf, err := createOne(ctx, s.c, o.Image, o.RuntimeClass, s.c.ProxyEndpoint)
			if id != "" {
				if derr := s.c.Delete(ctx, id); err == nil {
					err = derr
				}
			}
			if err != nil {
				return fmt.Errorf("%s: create %d: %w", s.name, i, err)
			}
			s.create, s.first, s.total = append(s.create, tc), append(s.first, tf), append(s.total, tc+tf)
		}
	}
	if o.Execs > 0 {
		eps := [2]Endpoint{}
		for k, s := range sides {
			id, err := s.c.Create(ctx, CreateOptions{Image: o.Image, RuntimeClass: o.RuntimeClass, Entrypoint: []string{"tail", "-f", "/dev/null"}})
			if id != "" {
				defer s.c.Delete(context.WithoutCancel(ctx), id)
			}
			if err != nil {
				return fmt.Errorf("%s: create the exec sandbox: %w", s.name, err)
			}
			if eps[k], err = s.c.ProxyEndpoint(ctx, id); err != nil {
				return fmt.Errorf("%s: %w", s.name, err)
			}
		}
		for i := range o.Warmup + o.Execs {
			for _, k := range sampleOrder(i) {
				s := sides[k]
				t0 := time.Now()
				if _, err := s.c.Run(ctx, eps[k], "true"); err != nil {
					return fmt.Errorf("%s: exec %d: %w", s.name, i, err)
				}
				if i >= o.Warmup {
					s.exec = append(s.exec, time.Since(t0))
				}
			}
		}
	}
	a, b := sides[0], sides[1]
	if o.Creates > 0 {
		printOverhead(w, "", "create -> Running -> first command (through the server proxy)", a.total, b.total)
		printOverhead(w, "  ", "of which create (POST until Running)", a.create, b.create)
		printOverhead(w, "  ", "of which first command (endpoint + exec)", a.first, b.first)
	}
	if o.Execs > 0 {
		printOverhead(w, "", "exec round trip (`true` through the server proxy, to the end of the stream)", a.exec, b.exec)
	}
	return nil
}

// sampleOrder is the order in which round i samples the two servers: A
// then B, then B then A (A B B A A B ...), so that neither always goes
// first, right after the other's work.
func sampleOrder(i int) [2]int {
	if i%2 == 0 {
		return [2]int{0, 1}
	}
	return [2]int{1, 0}
}

// Overhead compares B's samples with A's.
type Overhead struct {
	A, B Percentiles
	// P50 is how much B's p50 is above A's, in percent of A's.
	P50 float64
	// Noise is the same difference between the p50s of A's two halves,
	// rounds 0, 1, 4, 5 ... and rounds 2, 3, 6, 7 ... (each half has as
	// many samples taken first as second, see sampleOrder): a P50 within
	// it is no measurable overhead.
	Noise float64
}

// CompareOverhead summarizes A's and B's samples.
func CompareOverhead(a, b []time.Duration) Overhead {
	o := Overhead{A: Summarize(a), B: Summarize(b)}
	o.P50 = pctAbove(o.A.P50, o.B.P50)
	var h0, h1 []time.Duration
	for i, d := range a {
		if i/2%2 == 0 {
			h0 = append(h0, d)
		} else {
			h1 = append(h1, d)
		}
	}
	o.Noise = pctAbove(Summarize(h0).P50, Summarize(h1).P50)
	if o.Noise < 0 {
		o.Noise = -o.Noise
	}
	return o
}

// pctAbove is how much b is above a, in percent of a (0 if a is 0).
func pctAbove(a, b time.Duration) float64 {
	if a == 0 {
		return 0
	}
	return float64(b-a) / float64(a) * 100
}

func printOverhead(w io.Writer, indent, what string, a, b []time.Duration) {
	o := CompareOverhead(a, b)
	ms := func(d time.Duration) string { return fmt.Sprintf("%.2fms", float64(d.Microseconds())/1000) }
	fmt.Fprintf(w, "%s%s:\n", indent, what)
	fmt.Fprintf(w, indent+"  A: n=%d p50=%s p90=%s\n", o.A.N, ms(o.A.P50), ms(o.A.P90))
	fmt.Fprintf(w, indent+"  B: n=%d p50=%s p90=%s\n", o.B.N, ms(o.B.P50), ms(o.B.P90))
	fmt.Fprintf(w, indent+"  p50 B vs A: %+.1f%% (%+.2fms); noise, A's halves: %.1f%%\n", o.P50, float64((o.B.P50-o.A.P50).Microseconds())/1000, o.Noise)
}

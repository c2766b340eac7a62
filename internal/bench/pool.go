package bench

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"time"
)

// PoolBenchOptions configure `moat bench pool`.
type PoolBenchOptions struct {
	Target
	// Claims is how many single warm claims to time; Batch the size of the
	// batch delivered from a warm pool; Cold how many sandboxes to create
	// cold in one batch (0 skips it).
	Claims, Batch, Cold int
	RuntimeClass        string
}

type poolStatus struct {
	Status struct{ Total, Allocated, Available int } `json:"status"`
}

func (c *Client) createPool(ctx context.Context, name, image, class string, buffer int) error {
	body := map[string]any{
		"name": name,
		"template": map[string]any{"image": map[string]string{"uri": image}, "entrypoint": []string{"tail", "-f", "/dev/null"},
			"extensions": map[string]string{"moat.runtime": class}},
		"capacitySpec": map[string]int{"bufferMin": buffer, "bufferMax": buffer, "poolMin": 0, "poolMax": buffer * 3},
	}
	if class == "" {
		delete(body["template"].(map[string]any), "extensions")
	}
	_, err := c.do(ctx, "POST", "/v1/pools", body, nil)
	return err
}

func (c *Client) waitAvailable(ctx context.Context, name string, n int, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		var st poolStatus
		if _, err := c.do(ctx, "GET", "/v1/pools/"+name, nil, &st); err != nil {
			return err
		}
		if st.Status.Available >= n {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("pool %s: %d available after %s, want %d", name, st.Status.Available, timeout, n)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func (c *Client) batch(ctx context.Context, body map[string]any) ([]string, error) {
	var out struct{ Items []struct{ ID string } }
	if _, err := c.do(ctx, "POST", "/v1/sandboxes/batch", body, &out); err != nil {
		return nil, err
	}
	ids := make([]string, len(out.Items))
	for i, it := range out.Items {
		ids[i] = it.ID
	}
	return ids, nil
}

// memAvailable reads MemAvailable from /proc/meminfo, in bytes.
func memAvailable() (int64, error) {
	f, err := os.Open("/proc/meminfo")
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), "MemAvailable:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), "kB")), 10, 64)
			return kb * 1024, err
		}
	}
	return 0, fmt.Errorf("no MemAvailable in /proc/meminfo")
}

// RunPool prints warm-claim latency, batch delivery from a warm pool, cold
// batch creation, and idle host memory per sandbox.
func RunPool(ctx context.Context, o PoolBenchOptions, w io.Writer, log *slog.Logger) error {
	c, image, stop, err := o.connect(ctx, "oci", 10*time.Minute, log)
	if err != nil {
		return err
	}
	defer stop()
	var all []string
	defer func() {
		for _, id := range all {
			c.Delete(context.WithoutCancel(ctx), id)
		}
	}()
	fmt.Fprintf(w, "moat bench pool: image %s, runtime %q\n", image, o.RuntimeClass)
	for _, phase := range []struct {
		n   int
		run func(context.Context, *Client, PoolBenchOptions, string, io.Writer) ([]string, error)
	}{{o.Claims, warmClaims}, {o.Batch, warmBatch}} {
		if phase.n > 0 {
			ids, err := phase.run(ctx, c, o, image, w)
			all = append(all, ids...)
			if err != nil {
				return err
			}
		}
	}
	if o.Cold > 0 {
		// Free what the earlier phases made, so memory is measured cleanly.
		for _, id := range all {
			c.Delete(ctx, id)
		}
		all = nil
		ids, err := coldBatch(ctx, c, o, image, w)
		all = append(all, ids...)
		return err
	}
	return nil
}

// warmClaims times the fill of a pool of o.Claims and the single claims
// of all of them; it returns the claimed sandboxes.
func warmClaims(ctx context.Context, c *Client, o PoolBenchOptions, image string, w io.Writer) (all []string, _ error) {
	if err := c.createPool(ctx, "bench-claim", image, o.RuntimeClass, o.Claims); err != nil {
		return nil, err
	}
	t0 := time.Now()
	if err := c.waitAvailable(ctx, "bench-claim", o.Claims, 10*time.Minute); err != nil {
		return nil, err
	}
	fmt.Fprintf(w, "  warm fill of %d: %s\n", o.Claims, time.Since(t0).Round(time.Millisecond))
	var lat []time.Duration
	for i := 0; i < o.Claims; i++ {
		t0 := time.Now()
		id, err := c.Create(ctx, CreateOptions{Image: "", RuntimeClass: "", Entrypoint: nil, poolRef: "bench-claim"})
		if err != nil {
			return all, fmt.Errorf("claim %d: %w", i, err)
		}
		lat = append(lat, time.Since(t0))
		all = append(all, id)
	}
	fmt.Fprintf(w, "  warm claim over HTTP (POST /v1/sandboxes with poolRef): %s\n", Summarize(lat))
	c.do(ctx, "DELETE", "/v1/pools/bench-claim", nil, nil)
	return all, nil
}

// warmBatch times one batch of o.Batch from a warm pool; it returns the
// batch's sandboxes.
func warmBatch(ctx context.Context, c *Client, o PoolBenchOptions, image string, w io.Writer) ([]string, error) {
	if err := c.createPool(ctx, "bench-batch", image, o.RuntimeClass, o.Batch); err != nil {
		return nil, err
	}
	if err := c.waitAvailable(ctx, "bench-batch", o.Batch, 10*time.Minute); err != nil {
		return nil, err
	}
	t0 := time.Now()
	ids, err := c.batch(ctx, map[string]any{"count": o.Batch, "extensions": map[string]string{"poolRef": "bench-batch"}})
	if err != nil {
		return nil, err
	}
	d := time.Since(t0)
	fmt.Fprintf(w, "  batch of %d from a warm pool (one POST /v1/sandboxes/batch): %s\n", len(ids), d.Round(10*time.Microsecond))
	c.do(ctx, "DELETE", "/v1/pools/bench-batch", nil, nil)
	return ids, nil
}

// coldBatch times one cold batch of o.Cold and the host memory each of
// its sandboxes takes; it returns the batch's sandboxes.
func coldBatch(ctx context.Context, c *Client, o PoolBenchOptions, image string, w io.Writer) ([]string, error) {
	before, err := memAvailable()
	if err != nil {
		return nil, err
	}
	body := map[string]any{"count": o.Cold, "image": map[string]string{"uri": image}, "entrypoint": []string{"tail", "-f", "/dev/null"}}
	if o.RuntimeClass != "" {
		body["extensions"] = map[string]string{"moat.runtime": o.RuntimeClass}
	}
	t0 := time.Now()
	ids, err := c.batch(ctx, body)
	if err != nil {
		return nil, fmt.Errorf("cold batch: %w", err)
	}
	d := time.Since(t0)
	time.Sleep(2 * time.Second) // let page cache and agents settle
	after, err := memAvailable()
	if err != nil {
		return ids, err
	}
	fmt.Fprintf(w, "  %d sandboxes cold (one batch, %d cores): %s (%.1f/s)\n", len(ids), nproc(), d.Round(time.Millisecond), float64(len(ids))/d.Seconds())
	fmt.Fprintf(w, "  idle host memory per sandbox (MemAvailable drop / %d): %.1f MiB\n", len(ids), float64(before-after)/float64(len(ids))/(1<<20))
	return ids, nil
}

package bench

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"time"
)

// ForkBenchOptions configure `moat bench fork`.
type ForkBenchOptions struct {
	Target
	// N is how many sandboxes to fork from one snapshot, cold (one batch
	// with snapshotId) and warm (one batch claim from a fork pool).
	N            int
	RuntimeClass string
	// SkipCold leaves out the cold fork.
	SkipCold bool
}

// RunFork snapshots a sandbox that wrote a marker file, then forks N
// sandboxes from the snapshot twice: cold (POST /v1/sandboxes/batch with
// snapshotId) and from a warm fork pool (a pool whose template is the
// snapshot; the batch is one claim). Each phase checks the marker in a fork.
func RunFork(ctx context.Context, o ForkBenchOptions, w io.Writer, log *slog.Logger) error {
	c, image, stop, err := o.connect(ctx, "oci", 10*time.Minute, log)
	if err != nil {
		return err
	}
	defer stop()
	var all []string
	cleanup := func() {
		for _, id := range all {
			c.Delete(context.WithoutCancel(ctx), id)
		}
		all = nil
	}
	defer cleanup()
	fmt.Fprintf(w, "moat bench fork: image %s, runtime %q, N=%d\n", image, o.RuntimeClass, o.N)

	src, err := c.Create(ctx, CreateOptions{Image: image, RuntimeClass: o.RuntimeClass, Entrypoint: []string{"tail", "-f", "/dev/null"}})
	if src != "" {
		all = append(all, src)
	}
	if err != nil {
		return fmt.Errorf("source sandbox: %w", err)
	}
	ep, err := c.AgentEndpoint(ctx, src)
	if err != nil {
		return err
	}
	if _, err := c.Run(ctx, ep, "echo forked-"+src+" > /marker"); err != nil {
		return fmt.Errorf("write marker: %w", err)
	}
	// An idle background process: a memory snapshot (gVisor) keeps it
	// running in the forks, a filesystem snapshot does not. (A busy one
	// would load every fork and measure the CPU, not the fork.)
	if _, err := c.Run(ctx, ep, "sleep 86399 </dev/null >/dev/null 2>&1 &"); err != nil {
		return fmt.Errorf("start background process: %w", err)
	}
	t0 := time.Now()
	var sn struct {
		ID     string
		Status struct{ Message string }
	}
	if _, err := c.do(ctx, "POST", "/v1/sandboxes/"+src+"/snapshots", map[string]string{"name": "bench-fork"}, &sn); err != nil {
		return fmt.Errorf("snapshot: %w", err)
	}
	memory := strings.Contains(sn.Status.Message, "memory")
	kind := "filesystem"
	if memory {
		kind = "memory + filesystem"
	}
	fmt.Fprintf(w, "  snapshot (%s) of a running sandbox: %s\n", kind, time.Since(t0).Round(100*time.Microsecond))
	defer c.do(context.WithoutCancel(ctx), "DELETE", "/v1/snapshots/"+sn.ID, nil, nil)
	ext := map[string]string{}
	if o.RuntimeClass != "" {
		ext["moat.runtime"] = o.RuntimeClass
	}
	check := func(ids []string) error {
		if len(ids) != o.N {
			return fmt.Errorf("got %d forks, want %d", len(ids), o.N)
		}
		ep, err := c.AgentEndpoint(ctx, ids[len(ids)-1])
		if err != nil {
			return err
		}
		out, err := c.Run(ctx, ep, "cat /marker")
		if err != nil {
			return err
		}
		if strings.TrimSpace(out) != "forked-"+src {
			return fmt.Errorf("fork %s sees marker %q", ids[len(ids)-1], out)
		}
		if memory {
			out, err := c.Run(ctx, ep, "ps -o args | grep -c '^sleep 86399'")
			if err != nil || strings.TrimSpace(out) != "1" {
				return fmt.Errorf("fork %s: the source's background process is not running: %q %v", ids[len(ids)-1], out, err)
			}
		}
		return nil
	}

	if !o.SkipCold {
		t0 = time.Now()
		ids, err := c.batch(ctx, map[string]any{"count": o.N, "snapshotId": sn.ID, "extensions": ext})
		d := time.Since(t0)
		all = append(all, ids...)
		if err != nil {
			return fmt.Errorf("cold fork: %w", err)
		}
		if err := check(ids); err != nil {
			return fmt.Errorf("cold fork: %w", err)
		}
		fmt.Fprintf(w, "  fork %d cold (one batch with snapshotId, %d cores): %s\n", len(ids), nproc(), d.Round(time.Millisecond))
		for _, id := range ids {
			c.Delete(ctx, id)
		}
		all = all[:1]
	}

	pool := map[string]any{"name": "bench-fork",
		"template":     map[string]any{"snapshotId": sn.ID, "extensions": ext},
		"capacitySpec": map[string]int{"bufferMin": o.N, "bufferMax": o.N, "poolMax": 2 * o.N}}
	if _, err := c.do(ctx, "POST", "/v1/pools", pool, nil); err != nil {
		return fmt.Errorf("fork pool: %w", err)
	}
	defer c.do(context.WithoutCancel(ctx), "DELETE", "/v1/pools/bench-fork", nil, nil)
	t0 = time.Now()
	if err := c.waitAvailable(ctx, "bench-fork", o.N, 15*time.Minute); err != nil {
		return err
	}
	fmt.Fprintf(w, "  fork pool warm fill of %d: %s\n", o.N, time.Since(t0).Round(time.Millisecond))
	t0 = time.Now()
	ids, err := c.batch(ctx, map[string]any{"count": o.N, "snapshotId": sn.ID, "extensions": map[string]string{"poolRef": "bench-fork"}})
	d := time.Since(t0)
	all = append(all, ids...)
	if err != nil {
		return fmt.Errorf("warm fork: %w", err)
	}
	if err := check(ids); err != nil {
		return fmt.Errorf("warm fork: %w", err)
	}
	fmt.Fprintf(w, "  fork %d from a warm fork pool (one batch claim): %s\n", len(ids), d.Round(10*time.Microsecond))
	// Forks must be gone before the pool and the snapshot can go.
	cleanup()
	return nil
}

package bench

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strconv"
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
	// SkipCold leaves out the cold forks (the batch and the fork API),
	// SkipWarm the fork pool.
	SkipCold, SkipWarm bool
	// APIOnly stops after the cold forks (no fork pool).
	APIOnly bool
	// Memory is the source's memory limit ("256Mi"; "" the default) and
	// FillMiB how much of it a file in its /dev/shm holds (in a memory
	// snapshot, in every child's memory).
	Memory  string
	FillMiB int
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
	f := &forkRun{c: c, o: o, w: w, ext: map[string]string{}}
	defer f.cleanup(ctx)
	fmt.Fprintf(w, "moat bench fork: image %s, runtime %q, N=%d\n", image, o.RuntimeClass, o.N)
	if err := f.source(ctx, image); err != nil {
		return err
	}
	if err := f.snapshot(ctx); err != nil {
		return err
	}
	defer c.do(context.WithoutCancel(ctx), "DELETE", "/v1/snapshots/"+f.snap, nil, nil)
	if o.RuntimeClass != "" {
		f.ext["moat.runtime"] = o.RuntimeClass
	}
	if !o.SkipCold {
		if err := f.cold(ctx); err != nil {
			return err
		}
		if err := f.api(ctx); err != nil {
			return err
		}
	}
	if o.APIOnly {
		f.cleanup(ctx)
		return nil
	}
	if o.SkipWarm {
		f.cleanup(ctx)
		return nil
	}
	pool := map[string]any{"name": "bench-fork",
		"template":     map[string]any{"snapshotId": f.snap, "extensions": f.ext},
		"capacitySpec": map[string]int{"bufferMin": o.N, "bufferMax": o.N, "poolMax": 2 * o.N}}
	if _, err := c.do(ctx, "POST", "/v1/pools", pool, nil); err != nil {
		return fmt.Errorf("fork pool: %w", err)
	}
	defer c.do(context.WithoutCancel(ctx), "DELETE", "/v1/pools/bench-fork", nil, nil)
	if err := f.warm(ctx); err != nil {
		return err
	}
	// Forks must be gone before the pool and the snapshot can go.
	f.cleanup(ctx)
	return nil
}

// forkRun is one run of RunFork.
type forkRun struct {
	c      *Client
	o      ForkBenchOptions
	w      io.Writer
	ext    map[string]string // the forks' extensions
	all    []string          // sandboxes to delete: the source first
	src    string            // the source sandbox
	snap   string            // its snapshot
	memory bool              // the snapshot holds memory (gVisor)
}

// cleanup deletes every sandbox of the run.
func (f *forkRun) cleanup(ctx context.Context) {
	for _, id := range f.all {
		f.c.Delete(context.WithoutCancel(ctx), id)
	}
	f.all = nil
}

// source creates the sandbox to fork, with a marker file and an idle
// background process: a memory snapshot (gVisor) keeps it running in the
// forks, a filesystem snapshot does not. (A busy one would load every
// fork and measure the CPU, not the fork.)
func (f *forkRun) source(ctx context.Context, image string) error {
	src, err := f.c.Create(ctx, CreateOptions{Image: image, RuntimeClass: f.o.RuntimeClass, Entrypoint: []string{"tail", "-f", "/dev/null"}, Memory: f.o.Memory})
	if src != "" {
		f.all = append(f.all, src)
	}
	if err != nil {
		return fmt.Errorf("source sandbox: %w", err)
	}
	f.src = src
	ep, err := f.c.AgentEndpoint(ctx, src)
	if err != nil {
		return err
	}
	if _, err := f.c.Run(ctx, ep, "echo forked-"+src+" > /marker"); err != nil {
		return fmt.Errorf("write marker: %w", err)
	}
	if _, err := f.c.Run(ctx, ep, "sleep 86399 </dev/null >/dev/null 2>&1 &"); err != nil {
		return fmt.Errorf("start background process: %w", err)
	}
	if f.o.FillMiB > 0 {
		if _, err := f.c.Run(ctx, ep, fmt.Sprintf("dd if=/dev/urandom of=/dev/shm/fill bs=1M count=%d 2>/dev/null", f.o.FillMiB)); err != nil {
			return fmt.Errorf("fill: %w", err)
		}
	}
	return nil
}

// snapshot snapshots the running source and prints the time it took.
func (f *forkRun) snapshot(ctx context.Context) error {
	t0 := time.Now()
	var sn struct {
		ID     string
		Status struct{ Message string }
	}
	if _, err := f.c.do(ctx, "POST", "/v1/sandboxes/"+f.src+"/snapshots", map[string]string{"name": "bench-fork"}, &sn); err != nil {
		return fmt.Errorf("snapshot: %w", err)
	}
	f.snap = sn.ID
	f.memory = strings.Contains(sn.Status.Message, "memory")
	kind := "filesystem"
	if f.memory {
		kind = "memory + filesystem"
	}
	fmt.Fprintf(f.w, "  snapshot (%s) of a running sandbox: %s\n", kind, time.Since(t0).Round(100*time.Microsecond))
	return nil
}

// check: there are N forks, and the last sees the source's marker (and,
// from a memory snapshot, its background process).
func (f *forkRun) check(ctx context.Context, ids []string, n int) error {
	if len(ids) != n {
		return fmt.Errorf("got %d forks, want %d", len(ids), n)
	}
	ep, err := f.c.AgentEndpoint(ctx, ids[len(ids)-1])
	if err != nil {
		return err
	}
	out, err := f.c.Run(ctx, ep, "cat /marker")
	if err != nil {
		return err
	}
	if strings.TrimSpace(out) != "forked-"+f.src {
		return fmt.Errorf("fork %s sees marker %q", ids[len(ids)-1], out)
	}
	if f.memory {
		out, err := f.c.Run(ctx, ep, "ps -o args | grep -c '^sleep 86399'")
		if err != nil || strings.TrimSpace(out) != "1" {
			return fmt.Errorf("fork %s: the source's background process is not running: %q %v", ids[len(ids)-1], out, err)
		}
	}
	return nil
}

// cold times one fork, then N forks in one batch with snapshotId until
// the batch is answered and until every fork answered a command, with
// the host memory they took; then it deletes them.
func (f *forkRun) cold(ctx context.Context) error {
	one, _, mem1, err := f.coldBatch(ctx, 1)
	if err != nil {
		return err
	}
	fmt.Fprintf(f.w, "  fork 1 cold: %s until it answers, host memory +%d MiB\n", one.Round(time.Millisecond), mem1>>20)
	all, batch, memN, err := f.coldBatch(ctx, f.o.N)
	if err != nil {
		return err
	}
	fmt.Fprintf(f.w, "  fork %d cold (one batch with snapshotId, %d cores): batch answered %s, every fork answered a command %s (%s per fork)\n",
		f.o.N, nproc(), batch.Round(time.Millisecond), all.Round(time.Millisecond), (all / time.Duration(f.o.N)).Round(time.Millisecond))
	if f.o.N > 1 {
		fmt.Fprintf(f.w, "  host memory of %d forks +%d MiB; marginal per fork (N forks minus one, over N-1) %.1f MiB\n",
			f.o.N, memN>>20, float64(memN-mem1)/float64(f.o.N-1)/(1<<20))
	}
	return nil
}

// api times POST /v1/sandboxes/{id}/fork of N children (its own
// snapshot, then the children) until the operation has Succeeded, then
// deletes the children.
func (f *forkRun) api(ctx context.Context) error {
	t0 := time.Now()
	var op struct {
		ID, State string
		Children  []struct{ ID string }
		Error     *struct{ Code, Message string }
	}
	if _, err := f.c.do(ctx, "POST", "/v1/sandboxes/"+f.src+"/fork", map[string]any{"count": f.o.N}, &op); err != nil {
		return fmt.Errorf("fork API: %w", err)
	}
	accepted := time.Since(t0)
	for op.State == "Running" {
		time.Sleep(5 * time.Millisecond)
		if _, err := f.c.do(ctx, "GET", "/v1/operations/"+op.ID, nil, &op); err != nil {
			return fmt.Errorf("fork API: %w", err)
		}
	}
	d := time.Since(t0)
	ids := make([]string, len(op.Children))
	for i, c := range op.Children {
		ids[i] = c.ID
	}
	f.all = append(f.all, ids...)
	if op.State != "Succeeded" {
		return fmt.Errorf("fork API: operation %s %s: %+v", op.ID, op.State, op.Error)
	}
	if err := f.check(ctx, ids, f.o.N); err != nil {
		return fmt.Errorf("fork API: %w", err)
	}
	fmt.Fprintf(f.w, "  fork %d cold through POST /fork (snapshot + children + identity, %d cores): %s (202 after %s)\n",
		len(ids), nproc(), d.Round(time.Millisecond), accepted.Round(100*time.Microsecond))
	for _, id := range ids {
		f.c.Delete(ctx, id)
	}
	f.all = f.all[:1]
	return nil
}

// coldBatch forks n cold in one batch and returns the time until every
// fork answered a command, until the batch was answered, and the host
// memory (MemTotal - MemAvailable) the forks added; it deletes them.
func (f *forkRun) coldBatch(ctx context.Context, n int) (all, batch time.Duration, mem int64, err error) {
	before := hostMemUsed()
	t0 := time.Now()
	ids, err := f.c.batch(ctx, map[string]any{"count": n, "snapshotId": f.snap, "extensions": f.ext})
	batch = time.Since(t0)
	f.all = append(f.all, ids...)
	defer func() {
		for _, id := range ids {
			f.c.Delete(context.WithoutCancel(ctx), id)
		}
		f.all = f.all[:1]
	}()
	if err != nil {
		return 0, 0, 0, fmt.Errorf("cold fork: %w", err)
	}
	errs := make(chan error, len(ids))
	for _, id := range ids {
		go func() {
			ep, err := f.c.AgentEndpoint(ctx, id)
			if err == nil {
				var out string
				out, err = f.c.Run(ctx, ep, "echo ok")
				if err == nil && out != "ok" {
					err = fmt.Errorf("fork %s answered %q", id, out)
				}
			}
			errs <- err
		}()
	}
	for range ids {
		if e := <-errs; e != nil && err == nil {
			err = e
		}
	}
	all = time.Since(t0)
	mem = hostMemUsed() - before
	if err != nil {
		return 0, 0, 0, fmt.Errorf("cold fork: %w", err)
	}
	if len(ids) != n {
		return 0, 0, 0, fmt.Errorf("cold fork: got %d forks, want %d", len(ids), n)
	}
	if err := f.check(ctx, ids, n); err != nil {
		return 0, 0, 0, fmt.Errorf("cold fork: %w", err)
	}
	return all, batch, mem, nil
}

// hostMemUsed is MemTotal - MemAvailable of /proc/meminfo, in bytes.
func hostMemUsed() int64 {
	data, _ := os.ReadFile("/proc/meminfo")
	var total, avail int64
	for line := range strings.SplitSeq(string(data), "\n") {
		f := strings.Fields(line)
		if len(f) < 2 {
			continue
		}
		n, _ := strconv.ParseInt(f[1], 10, 64)
		switch f[0] {
		case "MemTotal:":
			total = n << 10
		case "MemAvailable:":
			avail = n << 10
		}
	}
	return total - avail
}

// warm times the fill of the fork pool bench-fork, then a batch claim of
// N from it.
func (f *forkRun) warm(ctx context.Context) error {
	t0 := time.Now()
	if err := f.c.waitAvailable(ctx, "bench-fork", f.o.N, 15*time.Minute); err != nil {
		return err
	}
	fmt.Fprintf(f.w, "  fork pool warm fill of %d: %s\n", f.o.N, time.Since(t0).Round(time.Millisecond))
	t0 = time.Now()
	ids, err := f.c.batch(ctx, map[string]any{"count": f.o.N, "snapshotId": f.snap, "extensions": map[string]string{"poolRef": "bench-fork"}})
	d := time.Since(t0)
	f.all = append(f.all, ids...)
	if err != nil {
		return fmt.Errorf("warm fork: %w", err)
	}
	if err := f.check(ctx, ids, f.o.N); err != nil {
		return fmt.Errorf("warm fork: %w", err)
	}
	fmt.Fprintf(f.w, "  fork %d from a warm fork pool (one batch claim): %s\n", len(ids), d.Round(10*time.Microsecond))
	return nil
}

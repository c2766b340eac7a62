package bench

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"
)

// LoadBenchOptions configure `moat bench load`.
type LoadBenchOptions struct {
	Target
	RuntimeClass string
	// Concurrency is the number of create/exec/delete loops (default 8).
	Concurrency int
	// Duration is how long to sustain the load (default 1m); Interval is
	// the reporting period (default 10s).
	Duration, Interval time.Duration
	// ServerPID, if set, is the server process whose RSS is reported (read
	// from /proc/<pid>/status). Otherwise: this process for an in-process
	// server, else process_resident_memory_bytes from the server's /metrics.
	ServerPID int
	// Runtime is the in-process server's backend (default "oci").
	Runtime string
	// ServerRoot and ServerRunRoot, if set, are a local server's --root and
	// --run-root: each interval then also counts the server's goroutines
	// and open files (from /metrics), and the mounts under those roots,
	// sandbox netns files, allocated IPs and, with CgroupParent (the
	// server's --cgroup-parent), sandbox cgroups: what a soak must see flat.
	ServerRoot, ServerRunRoot, CgroupParent string
}

// loadStats accumulates one interval.
type loadStats struct {
	cycles                     int
	createErr, execErr, delErr int
	create, cycle, exec, del   []time.Duration
	firstErr                   string
}

// RunLoad sustains create -> first command -> delete cycles at
// o.Concurrency for o.Duration and prints, per interval: cycles/s, errors,
// create and cycle p50/p99, the server's RSS and how many sandboxes the
// server holds; then a summary with the RSS trend (first vs last third).
func RunLoad(ctx context.Context, o LoadBenchOptions, w io.Writer, log *slog.Logger) error {
	if o.Concurrency <= 0 {
		o.Concurrency = 8
	}
	if o.Duration <= 0 {
		o.Duration = time.Minute
	}
	if o.Interval <= 0 {
		o.Interval = 10 * time.Second
	}
	c, image, stop, err := o.connect(ctx, o.Runtime, 2*time.Minute, log)
	if err != nil {
		return err
	}
	defer stop()
	l := &loadRun{o: o, c: c, w: w, image: image, entry: []string{"tail", "-f", "/dev/null"}, watch: o.ServerRoot != ""}
	l.rss = l.rssReader(ctx)
	if image == "" {
		return fmt.Errorf("--image is required with --server")
	}
	// Warm-up (image pull), not counted.
	id, err := c.Create(ctx, CreateOptions{Image: image, RuntimeClass: o.RuntimeClass, Entrypoint: l.entry})
	if err != nil {
		return fmt.Errorf("warm-up create: %w", err)
	}
	c.Delete(ctx, id)
	l.base, _ = c.count(ctx)
	l.header()

	deadline := time.Now().Add(o.Duration)
	lctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	var wg sync.WaitGroup
	for range o.Concurrency {
		wg.Go(func() {
			for lctx.Err() == nil {
				l.cycle(ctx)
			}
		})
	}
	l.start = time.Now()
	l.last = l.start
	tick := time.NewTicker(o.Interval)
	for done := false; !done; {
		select {
		case <-tick.C:
			if time.Now().Before(deadline.Add(-o.Interval / 2)) {
				l.report(ctx)
			}
		case <-lctx.Done():
			done = true
		}
	}
	tick.Stop()
	wg.Wait()
	l.report(ctx)
	l.summary(ctx, time.Since(l.start))
	return nil
}

// loadRun is the state of one RunLoad: the cycles' figures of the current
// interval (cur, which mu guards: the loops add to it) and of the whole
// run (all), and the series of samples the summary's trends come from.
type loadRun struct {
	o     LoadBenchOptions
	c     *Client
	w     io.Writer
	image string
	entry []string
	rss   func() (int64, bool) // the server's RSS (see LoadBenchOptions.ServerPID)
	base  int                  // sandboxes the server held before the run
	watch bool                 // count the server's resources (ServerRoot)

	mu  sync.Mutex
	cur loadStats
	all loadStats

	rssSeries   []int64
	resSeries   []resources
	start, last time.Time // the run's start, the last report
}

// rssReader picks where the server's RSS is read: the process named,
// this one for an in-process server, else the server's /metrics.
func (l *loadRun) rssReader(ctx context.Context) func() (int64, bool) {
	switch {
	case l.o.ServerPID > 0:
		pid := l.o.ServerPID
		return func() (int64, bool) { return procRSS(strconv.Itoa(pid)) }
	case l.o.Server == "":
		return func() (int64, bool) { return procRSS("self") }
	}
	return func() (int64, bool) { return metricsRSS(ctx, l.c) }
}

// header prints the run's line and the intervals' column heads.
func (l *loadRun) header() {
	fmt.Fprintf(l.w, "moat bench load: create -> command -> delete, concurrency %d, %s, image %s, runtime class %q\n",
		l.o.Concurrency, l.o.Duration, l.image, l.o.RuntimeClass)
	fmt.Fprintf(l.w, "%7s %7s %8s %6s %6s %6s %10s %10s %10s %10s %9s %6s",
		"t", "cycles", "cycles/s", "e.crt", "e.exec", "e.del", "crt.p50", "crt.p99", "cyc.p50", "cyc.p99", "rss", "held")
	if l.watch {
		fmt.Fprintf(l.w, " %6s %5s %5s %5s %5s %5s %5s", "gor", "fds", "mnt", "netns", "cg", "ips", "load")
	}
	fmt.Fprintln(l.w)
}

// cycle runs one create -> command -> delete cycle and adds it to cur.
// The cycle runs to its end (ctx, not the loops' deadline) so that
// nothing is left behind when the deadline passes mid-cycle.
func (l *loadRun) cycle(ctx context.Context) {
	t0 := time.Now()
	id, err := l.c.Create(ctx, CreateOptions{Image: l.image, RuntimeClass: l.o.RuntimeClass, Entrypoint: l.entry})
	t1 := time.Now()
	var execErr, delErr error
	var t15 time.Time
	if err == nil || id != "" {
		if err == nil {
			var ep Endpoint
			if ep, execErr = l.c.AgentEndpoint(ctx, id); execErr == nil {
				var out string
				if out, execErr = l.c.Run(ctx, ep, "echo ok"); execErr == nil && out != "ok" {
					execErr = fmt.Errorf("command printed %q", out)
				}
			}
		}
		t15 = time.Now()
		delErr = l.c.Delete(ctx, id)
	}
	t2 := time.Now()
	if err != nil || execErr != nil || delErr != nil {
		// Do not spin on a server that is down.
		time.Sleep(100 * time.Millisecond)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	cur := &l.cur
	switch {
	case err != nil:
		cur.createErr++
		cur.setErr("create: " + err.Error())
	case execErr != nil:
		cur.execErr++
		cur.setErr("exec: " + execErr.Error())
	case delErr != nil:
		cur.delErr++
		cur.setErr("delete: " + delErr.Error())
	default:
		cur.cycles++
		cur.create = append(cur.create, t1.Sub(t0))
		cur.cycle = append(cur.cycle, t2.Sub(t0))
		cur.exec = append(cur.exec, t15.Sub(t1))
		cur.del = append(cur.del, t2.Sub(t15))
	}
}

// report prints the interval since the last report, with the server's
// RSS, the sandboxes it holds and (watch) its resources, and moves the
// interval's figures into all.
func (l *loadRun) report(ctx context.Context) {
	l.mu.Lock()
	s := l.cur
	l.cur = loadStats{}
	l.mu.Unlock()
	now := time.Now()
	el, span := now.Sub(l.start), now.Sub(l.last)
	l.last = now
	r, ok := l.rss()
	rssText := "n/a"
	if ok {
		rssText = fmt.Sprintf("%.1fMiB", float64(r)/(1<<20))
		l.rssSeries = append(l.rssSeries, r)
	}
	held := "?"
	if n, err := l.c.count(ctx); err == nil {
		held = strconv.Itoa(n - l.base)
	}
	cp, yp := Summarize(s.create), Summarize(s.cycle)
	fmt.Fprintf(l.w, "%6.0fs %7d %8.2f %6d %6d %6d %10s %10s %10s %10s %9s %6s",
		el.Seconds(), s.cycles, float64(s.cycles)/span.Seconds(), s.createErr, s.execErr, s.delErr,
		ms(cp.P50), ms(cp.P99), ms(yp.P50), ms(yp.P99), rssText, held)
	if l.watch {
		r := sampleResources(ctx, l.c, l.o)
		l.resSeries = append(l.resSeries, r)
		fmt.Fprintf(l.w, " %6d %5d %5d %5d %5d %5d %5s", r.goroutines, r.fds, r.mounts, r.netns, r.cgroups, r.ips, r.load)
	}
	fmt.Fprintln(l.w)
	if s.firstErr != "" {
		fmt.Fprintf(l.w, "        first error: %s\n", s.firstErr)
	}
	l.all.add(s)
}

// summary prints the run's totals, the RSS trend (first vs last third)
// and what the server holds after the run.
func (l *loadRun) summary(ctx context.Context, wall time.Duration) {
	w, all := l.w, &l.all
	fmt.Fprintf(w, "total: %d cycles in %s (%.2f/s), errors create=%d exec=%d delete=%d\n",
		all.cycles, wall.Round(time.Second), float64(all.cycles)/wall.Seconds(), all.createErr, all.execErr, all.delErr)
	fmt.Fprintf(w, "create: %s\n", Summarize(all.create))
	fmt.Fprintf(w, "exec:   %s\n", Summarize(all.exec))
	fmt.Fprintf(w, "delete: %s\n", Summarize(all.del))
	fmt.Fprintf(w, "cycle:  %s\n", Summarize(all.cycle))
	if n := len(l.rssSeries); n >= 3 {
		third := max(1, n/3)
		first, last := mean(l.rssSeries[:third]), mean(l.rssSeries[n-third:])
		fmt.Fprintf(w, "server RSS: first third mean %.1fMiB, last third mean %.1fMiB (%+.1f%%), min %.1fMiB, max %.1fMiB\n",
			first/(1<<20), last/(1<<20), 100*(last-first)/first, float64(minOf(l.rssSeries))/(1<<20), float64(maxOf(l.rssSeries))/(1<<20))
	}
	if n, err := l.c.count(ctx); err == nil {
		fmt.Fprintf(w, "sandboxes held by the server after the run: %d (before: %d)\n", n, l.base)
	}
	if l.watch && len(l.resSeries) >= 3 {
		l.resourceTrends(ctx)
	}
}

// resourceTrends prints each resource count's trend and its count now:
// after the final interval every cycle has ended, so what the server
// holds now is what it leaked.
func (l *loadRun) resourceTrends(ctx context.Context) {
	end := sampleResources(ctx, l.c, l.o)
	series := l.resSeries
	third := max(1, len(series)/3)
	for _, f := range resourceFields {
		all := make([]int64, len(series))
		for i, r := range series {
			all[i] = int64(f.get(r))
		}
		a, b := all[:third], all[len(series)-third:]
		fmt.Fprintf(l.w, "%-10s first third mean %8.1f, last third mean %8.1f, min %5d, max %5d, after the run %5d\n",
			f.name+":", mean(a), mean(b), minOf(all), maxOf(all), f.get(end))
	}
}

// resources are a local server's counts that must stay flat under load.
type resources struct {
	goroutines, fds, mounts, netns, cgroups, ips int
	load                                         string // 1-minute load average of the machine
}

var resourceFields = []struct {
	name string
	get  func(resources) int
}{
	{"goroutines", func(r resources) int { return r.goroutines }},
	{"open fds", func(r resources) int { return r.fds }},
	{"mounts", func(r resources) int { return r.mounts }},
	{"netns", func(r resources) int { return r.netns }},
	{"cgroups", func(r resources) int { return r.cgroups }},
	{"IPs", func(r resources) int { return r.ips }},
}

// sampleResources counts what the server at c holds (see
// LoadBenchOptions.ServerRoot). A count it cannot read is -1.
func sampleResources(ctx context.Context, c *Client, o LoadBenchOptions) resources {
	r := resources{goroutines: -1, fds: -1, mounts: -1, netns: -1, cgroups: -1, ips: -1, load: "?"}
	if m, err := scrapeMetrics(ctx, c, "go_goroutines", "process_open_fds"); err == nil {
		r.goroutines, r.fds = int(m["go_goroutines"]), int(m["process_open_fds"])
	}
	count := func(dir string, skip func(string) bool) int {
		ents, err := os.ReadDir(dir)
		if err != nil {
			return -1
		}
		n := 0
		for _, e := range ents {
			if skip == nil || !skip(e.Name()) {
				n++
			}
		}
		return n
	}
	r.netns = count(filepath.Join(o.ServerRunRoot, "netns"), nil)
	r.ips = count(filepath.Join(o.ServerRoot, "oci", "network", "ips"), func(n string) bool { return strings.HasPrefix(n, ".") || strings.HasSuffix(n, ".tmp") })
	if mi, err := os.ReadFile("/proc/self/mountinfo"); err == nil {
		r.mounts = 0
		for _, line := range strings.Split(string(mi), "\n") {
			f := strings.Fields(line)
			if len(f) > 4 && (strings.HasPrefix(f[4], o.ServerRoot+"/") || o.ServerRunRoot != "" && strings.HasPrefix(f[4], o.ServerRunRoot+"/")) {
				r.mounts++
			}
		}
	}
	if o.CgroupParent != "" {
		r.cgroups = 0
		filepath.WalkDir(filepath.Join("/sys/fs/cgroup/pids", o.CgroupParent), func(p string, d os.DirEntry, err error) error {
			if err == nil && d.IsDir() && p != filepath.Join("/sys/fs/cgroup/pids", o.CgroupParent) {
				r.cgroups++
			}
			return nil
		})
	}
	if b, err := os.ReadFile("/proc/loadavg"); err == nil {
		if f := strings.Fields(string(b)); len(f) > 0 {
			r.load = f[0]
		}
	}
	return r
}

// scrapeMetrics reads the named unlabelled samples from the server's
// /metrics.
func scrapeMetrics(ctx context.Context, c *Client, names ...string) (map[string]float64, error) {
	req, err := http.NewRequestWithContext(ctx, "GET", c.Base+"/metrics", nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("OPEN-SANDBOX-API-KEY", c.Key)
	resp, err := c.HTTP.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	out := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		for _, n := range names {
			if v, ok := strings.CutPrefix(sc.Text(), n+" "); ok {
				if f, err := strconv.ParseFloat(strings.TrimSpace(v), 64); err == nil {
					out[n] = f
				}
			}
		}
	}
	return out, sc.Err()
}

func (s *loadStats) setErr(e string) {
	if s.firstErr == "" {
		if len(e) > 300 {
			e = e[:300]
		}
		s.firstErr = e
	}
}

func ms(d time.Duration) string { return fmt.Sprintf("%.1fms", float64(d.Microseconds())/1000) }

func mean(v []int64) float64 {
	var s float64
	for _, x := range v {
		s += float64(x)
	}
	return s / float64(len(v))
}

func minOf(v []int64) int64 {
	m := v[0]
	for _, x := range v {
		m = min(m, x)
	}
	return m
}

func maxOf(v []int64) int64 {
	m := v[0]
	for _, x := range v {
		m = max(m, x)
	}
	return m
}

// count returns how many sandboxes the server lists.
func (c *Client) count(ctx context.Context) (int, error) {
	var out struct {
		Pagination struct{ TotalItems int } `json:"pagination"`
	}
	_, err := c.do(ctx, "GET", "/v1/sandboxes?pageSize=1", nil, &out)
	return out.Pagination.TotalItems, err
}

// procRSS reads VmRSS of /proc/<pid>/status, in bytes.
func procRSS(pid string) (int64, bool) {
	f, err := os.Open("/proc/" + pid + "/status")
	if err != nil {
		return 0, false
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "VmRSS:"); ok {
			f := strings.Fields(v)
			if len(f) >= 1 {
				kb, err := strconv.ParseInt(f[0], 10, 64)
				return kb << 10, err == nil
			}
		}
	}
	return 0, false
}

// metricsRSS scrapes process_resident_memory_bytes from the server's
// /metrics (absent unless the server exports process metrics).
func metricsRSS(ctx context.Context, c *Client) (int64, bool) {
	req, err := http.NewRequestWithContext(ctx, "GET", c.Base+"/metrics", nil)
	if err != nil {
		return 0, false
	}
	req.Header.Set("OPEN-SANDBOX-API-KEY", c.Key)
	resp, err := c.HTTP.Do(req)
	if err != nil {
		return 0, false
	}
	defer resp.Body.Close()
	return parseRSSMetric(resp.Body)
}

func parseRSSMetric(r io.Reader) (int64, bool) {
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "process_resident_memory_bytes "); ok {
			f, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
			return int64(f), err == nil
		}
	}
	return 0, false
}

// add adds the figures of o (its first error aside) to s.
func (s *loadStats) add(o loadStats) {
	s.cycles += o.cycles
	s.createErr += o.createErr
	s.execErr += o.execErr
	s.delErr += o.delErr
	s.create = append(s.create, o.create...)
	s.cycle = append(s.cycle, o.cycle...)
	s.exec = append(s.exec, o.exec...)
	s.del = append(s.del, o.del...)
}

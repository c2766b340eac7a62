package bench

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/moat-sandbox/moat/internal/egress/nft"
	"github.com/moat-sandbox/moat/internal/server"
	"github.com/moat-sandbox/moat/internal/testutil/localregistry"
	"github.com/moat-sandbox/moat/internal/testutil/rootfs"
)

// CreateBenchOptions configure `moat bench create`.
type CreateBenchOptions struct {
	Target
	// Classes are the runtime classes to measure (each gets N sandboxes).
	Classes []string
	// N is the number of sandboxes per class; Concurrency how many at once.
	N, Concurrency int
	// Runtime is the in-process server's backend (default "oci").
	Runtime string
}

// InProcess is a throw-away moat server on loopback for benchmarks and demos.
type InProcess struct {
	URL, Key string
	dir      string
	srv      *server.Server
	reg      *localregistry.Registry
	cancel   context.CancelFunc
	done     chan error
	Image    string
	bridge   string   // the oci server's bridge, removed by Close
	lock     *os.File // held while the server runs (benchLock)
}

// benchLock is the lock file of in-process benchmark servers: they all use
// bridge moatbench0 and subnet 10.89.0.0/16, and a second one would take
// the first one's bridge ports for leftovers and remove them.
const benchLock = "/run/moat-bench.lock"

// lockBench takes the lock file at path, or says who holds it.
func lockBench(path string) (*os.File, error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|unix.O_CLOEXEC, 0o644)
	if err != nil {
		return nil, fmt.Errorf("bench: %w", err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		holder, _ := os.ReadFile(path)
		f.Close()
		return nil, fmt.Errorf("bench: another benchmark with an in-process server is running (pid %s, lock %s): run one at a time, or point this one at a running server with --server",
			strings.TrimSpace(string(holder)), path)
	}
	f.Truncate(0)
	f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	return f, nil
}

// StartInProcess starts a server with its own state dir, bridge moatbench0
// and subnet 10.89.0.0/16, plus a loopback registry holding busybox.
func StartInProcess(ctx context.Context, runtimeName string, log *slog.Logger) (*InProcess, error) {
	lock, err := lockBench(benchLock)
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "moat-bench-")
	if err != nil {
		lock.Close()
		return nil, err
	}
	p := &InProcess{dir: dir, Key: "bench-key", lock: lock}
	cfg := server.Default()
	if runtimeName == "" || runtimeName == "oci" {
		p.bridge = "moatbench0"
	}
	cfg.Root = filepath.Join(dir, "root")
	cfg.RunRoot = filepath.Join(dir, "run")
	cfg.Bridge = "moatbench0"
	cfg.Subnet = "10.89.0.0/16"
	cfg.APIKey = p.Key
	cfg.LogLevel = "warn"
	if runtimeName != "" {
		cfg.Runtime = runtimeName
	}
	cfg.Listen = "127.0.0.1:0"
	if err := cfg.Validate(); err != nil {
		os.RemoveAll(dir)
		lock.Close()
		return nil, err
	}
	srv, err := server.New(ctx, cfg, log)
	if err != nil {
		os.RemoveAll(dir)
		lock.Close()
		return nil, err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		srv.Close()
		return nil, err
	}
	sctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	p.srv, p.cancel, p.done = srv, cancel, make(chan error, 1)
	p.URL = "http://" + ln.Addr().String()
	go func() { p.done <- srv.Serve(sctx, ln) }()

	reg, err := localregistry.Start()
	if err != nil {
		p.Close()
		return nil, err
	}
	p.reg = reg
	bb := filepath.Join(dir, "busybox")
	if err := rootfs.Busybox(bb); err != nil {
		p.Close()
		return nil, err
	}
	if p.Image, err = reg.PushDir(ctx, bb, "bench/busybox:latest", []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin"}); err != nil {
		p.Close()
		return nil, err
	}
	return p, nil
}

// Close stops the server (deleting nothing it does not own) and removes
// the state directory, and for the oci runtime the bridge and the nft
// tables of the bridge (a server keeps them across restarts; this one is
// thrown away with its state).
func (p *InProcess) Close() {
	if p.cancel != nil {
		p.cancel()
		<-p.done
	}
	if p.srv != nil {
		p.srv.Close()
	}
	if p.reg != nil {
		p.reg.Close()
	}
	if p.srv != nil && p.bridge != "" {
		ctx := context.Background()
		nft.RemoveHost(ctx, p.bridge)
		nft.RemoveIntercept(ctx, p.bridge)
		if link, err := netlink.LinkByName(p.bridge); err == nil {
			netlink.LinkDel(link)
		}
	}
	os.RemoveAll(p.dir)
	p.lock.Close()
}

// RunCreate measures create -> Running -> first command completed, for
// o.N sandboxes per class, and writes the figures to w. Every sandbox is
// deleted afterwards.
func RunCreate(ctx context.Context, o CreateBenchOptions, w io.Writer, log *slog.Logger) error {
	if o.N <= 0 {
		o.N = 100
	}
	if o.Concurrency <= 0 {
		o.Concurrency = 1
	}
	if len(o.Classes) == 0 {
		o.Classes = []string{""}
	}
	c, image, stop, err := o.connect(ctx, o.Runtime, 2*time.Minute, log)
	if err != nil {
		return err
	}
	defer stop()
	// Warm-up: the first create pulls the image; it is not counted.
	id, err := c.Create(ctx, CreateOptions{Image: image, RuntimeClass: o.Classes[0], Entrypoint: []string{"tail", "-f", "/dev/null"}})
	if err != nil {
		return fmt.Errorf("warm-up create: %w", err)
	}
	c.Delete(ctx, id)

	fmt.Fprintf(w, "moat bench create: %d sandboxes per runtime, concurrency %d, image %s\n", o.N, o.Concurrency, image)
	for _, class := range o.Classes {
		if err := runCreateClass(ctx, c, o, image, class, w); err != nil {
			return err
		}
	}
	return nil
}

// runCreateClass times o.N creates of one runtime class, o.Concurrency at
// once, then their deletes, and prints the figures.
func runCreateClass(ctx context.Context, c *Client, o CreateBenchOptions, image, class string, w io.Writer) error {
	var mu sync.Mutex
	var total, create, first, del []time.Duration
	var ids []string
	var firstErr error
	sem := make(chan struct{}, o.Concurrency)
	var wg sync.WaitGroup
	start := time.Now()
	for i := 0; i < o.N; i++ {
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			id, tc, tf, err := createOne(ctx, c, image, class, c.AgentEndpoint)
			mu.Lock()
			defer mu.Unlock()
			if id != "" {
				ids = append(ids, id)
			}
			if err != nil {
				if firstErr == nil {
					firstErr = err
				}
				return
			}
			create = append(create, tc)
			first = append(first, tf)
			total = append(total, tc+tf)
		}()
	}
	wg.Wait()
	wall := time.Since(start)
	for _, id := range ids {
		t0 := time.Now()
		if err := c.Delete(ctx, id); err == nil {
			del = append(del, time.Since(t0))
		} else if firstErr == nil {
			firstErr = err
		}
	}
	name := class
	if name == "" {
		name = "default"
	}
	fmt.Fprintf(w, "runtime=%s ok=%d/%d wall=%s\n", name, len(total), o.N, wall.Round(time.Millisecond))
	fmt.Fprintf(w, "  create->Running->first command: %s\n", Summarize(total))
	fmt.Fprintf(w, "  create (POST until Running):    %s\n", Summarize(create))
	fmt.Fprintf(w, "  first command (endpoint+exec):  %s\n", Summarize(first))
	fmt.Fprintf(w, "  delete:                         %s\n", Summarize(del))
	if firstErr != nil {
		return fmt.Errorf("runtime %s: %w", name, firstErr)
	}
	return nil
}

// createOne creates one sandbox and runs its first command at the
// endpoint resolve gives (c.AgentEndpoint: straight to the agent;
// c.ProxyEndpoint: through the server): the time until Running and the
// time of the first command. id is the sandbox's (to delete) whenever the
// create succeeded, even if the command failed.
func createOne(ctx context.Context, c *Client, image, class string, resolve func(context.Context, string) (Endpoint, error)) (id string, create, first time.Duration, err error) {
	t0 := time.Now()
	id, err = c.Create(ctx, CreateOptions{Image: image, RuntimeClass: class, Entrypoint: []string{"tail", "-f", "/dev/null"}})
	t1 := time.Now()
	if err != nil {
		return "", 0, 0, err
	}
	var ep Endpoint
	if ep, err = resolve(ctx, id); err == nil {
		var out string
		out, err = c.Run(ctx, ep, "echo ok")
		if err == nil && out != "ok" {
			err = fmt.Errorf("first command printed %q", out)
		}
	}
	return id, t1.Sub(t0), time.Since(t1), err
}

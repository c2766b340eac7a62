// Package bench is `moat bench k8s`: the time to fill a Pool of N, and the
// wall time and API writes to deliver N sandboxes as one BatchSandbox,
// from the warm pool and cold, on a throw-away control plane
// (kube-apiserver + etcd + kwok, see internal/k8s/k8stest). The controller
// runs as its own process (`moat controller` at its default flags), behind
// a loopback proxy that counts its writes, so the figures are what users
// get.
package bench

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"maps"
	"os"
	"os/exec"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	sbv1 "github.com/moat-sandbox/moat/api/v1alpha1"
	"github.com/moat-sandbox/moat/internal/k8s/controller"
	"github.com/moat-sandbox/moat/internal/k8s/k8stest"
)

// Options tune the benchmark.
type Options struct {
	// N is the pool and batch size (default 100).
	N int
	// Nodes is the number of fake nodes (default 4).
	Nodes int
	// Timeout bounds each phase (default 5m).
	Timeout time.Duration
	// Moat is the moat binary whose `controller` verb is measured
	// (default: this executable).
	Moat string
	// ControllerArgs are extra flags for `moat controller`.
	ControllerArgs []string
}

// Result is one measured delivery.
type Result struct {
	Mode string
	N    int
	Wall time.Duration
	// Writes are the controller's API writes, by "VERB resource".
	Writes map[string]int
	// ClientWrites are the writes of the requester (creating the batch).
	ClientWrites int
}

func (r Result) String() string {
	keys := slices.Sorted(maps.Keys(r.Writes))
	var parts []string
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%s=%d", k, r.Writes[k]))
	}
	return fmt.Sprintf("k8s %-4s n=%d  wall=%-9v  controller-writes=%d (%s)  client-writes=%d",
		r.Mode, r.N, r.Wall.Round(time.Millisecond), k8stest.Total(r.Writes), strings.Join(parts, " "), r.ClientWrites)
}

// Run measures a pool fill, a warm and a cold batch of o.N and prints one
// line each.
func Run(ctx context.Context, o Options, out io.Writer) (_ []Result, err error) {
	if o.N <= 0 {
		o.N = 100
	}
	if o.Nodes <= 0 {
		o.Nodes = 4
	}
	if o.Timeout <= 0 {
		o.Timeout = 5 * time.Minute
	}
	if o.Moat == "" {
		if o.Moat, err = os.Executable(); err != nil {
			return nil, err
		}
	}
	env, err := k8stest.Start(ctx, k8stest.Options{Nodes: o.Nodes})
	if err != nil {
		return nil, err
	}
	defer env.Stop()
	c, err := client.New(env.Config, client.Options{Scheme: controller.Scheme()})
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "moat-bench-k8s-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	w := &k8stest.WriteCounter{}
	proxy, err := k8stest.StartCountingProxy(env.Config, w, dir)
	if err != nil {
		return nil, err
	}
	defer proxy.Close()

	ns := "moat-bench"
	if err := c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
		return nil, err
	}
	var logs bytes.Buffer
	cctx, stop := context.WithCancel(ctx)
	cmd := exec.CommandContext(cctx, o.Moat, append([]string{"controller", "--kubeconfig", proxy.Kubeconfig,
		"--agent-image", "moat:bench", "--namespace", ns, "--log-level", "error"}, o.ControllerArgs...)...)
	cmd.Stdout, cmd.Stderr = &logs, &logs
	if err := cmd.Start(); err != nil {
		stop()
		return nil, fmt.Errorf("start moat controller: %w", err)
	}
	defer func() {
		stop()
		cmd.Wait()
		if err != nil && logs.Len() > 0 {
			err = fmt.Errorf("%w\ncontroller output:\n%s", err, logs.String())
		}
	}()

	tpl := &corev1.PodTemplateSpec{Spec: corev1.PodSpec{Containers: []corev1.Container{{
		Name: "sandbox", Image: "busybox:bench", Command: []string{"sleep", "infinity"},
	}}}}
	n := int32(o.N)
	var results []Result

	// Pool fill: from the Pool's creation to N available pods.
	before := w.Snapshot()
	start := time.Now()
	if err := c.Create(ctx, &sbv1.Pool{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "warm"},
		Spec: sbv1.PoolSpec{Template: tpl, CapacitySpec: sbv1.CapacitySpec{PoolMin: n, PoolMax: n}}}); err != nil {
		return nil, err
	}
	if err := waitFor(ctx, o.Timeout, func() (bool, error) {
		var p sbv1.Pool
		err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: "warm"}, &p)
		return err == nil && p.Status.Available == n && p.Status.Total == n, err
	}); err != nil {
		return nil, fmt.Errorf("warming the pool: %w", err)
	}
	fill := Result{Mode: "fill", N: o.N, Wall: time.Since(start), Writes: w.Since(before), ClientWrites: 1}
	results = append(results, fill)
	fmt.Fprintln(out, fill)
	time.Sleep(time.Second) // let the pool's last status write land before counting

	for _, mode := range []string{"warm", "cold"} {
		b := &sbv1.BatchSandbox{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "batch-" + mode},
			Spec:       sbv1.BatchSandboxSpec{Replicas: &n},
		}
		if mode == "warm" {
			b.Spec.PoolRef = "warm"
		} else {
			b.Spec.Template = tpl
		}
		before := w.Snapshot()
		start := time.Now()
		if err := c.Create(ctx, b); err != nil {
			return nil, err
		}
		if err := waitFor(ctx, o.Timeout, func() (bool, error) {
			err := c.Get(ctx, client.ObjectKeyFromObject(b), b)
			return err == nil && b.Status.Phase == sbv1.PhaseSucceed && b.Status.Ready == n, err
		}); err != nil {
			return nil, fmt.Errorf("%s batch: %w", mode, err)
		}
		wall := time.Since(start)
		time.Sleep(500 * time.Millisecond) // count writes that trail the allocation too
		r := Result{Mode: mode, N: o.N, Wall: wall, Writes: w.Since(before), ClientWrites: 1}
		results = append(results, r)
		fmt.Fprintln(out, r)
	}
	return results, nil
}

func waitFor(ctx context.Context, timeout time.Duration, cond func() (bool, error)) error {
	deadline := time.Now().Add(timeout)
	var last error
	for time.Now().Before(deadline) {
		ok, err := cond()
		if ok {
			return nil
		}
		last = err
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(5 * time.Millisecond):
		}
	}
	return fmt.Errorf("timed out after %v (last error %v)", timeout, last)
}

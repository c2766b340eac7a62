// Package runtimetest is the conformance suite of runtime.Runtime: what
// every sandbox backend (oci, fake, docker, ...) must do. A backend's test
// is a few lines:
//
//	func TestConformance(t *testing.T) {
//		runtimetest.Run(t, newRuntime, runtimetest.Options{Image: "busybox", Reopen: reopen})
//	}
package runtimetest

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/moat-sandbox/moat/internal/agentproto"
	"github.com/moat-sandbox/moat/internal/errdefs"
	"github.com/moat-sandbox/moat/internal/runtime"
)

// Options tune the suite for a backend.
type Options struct {
	// Image is the image reference the sandboxes are created from. It must
	// be available to the backend without a pull from outside loopback.
	Image string
	// Class is the Spec.Class to use ("" = backend default).
	Class string
	// Reopen builds a second backend instance over the same persistent
	// state as rt, simulating a server restart. Required.
	Reopen func(t *testing.T, rt runtime.Runtime) runtime.Runtime
	// AgentTimeout bounds the wait for the agent's /ping (default 10s).
	AgentTimeout time.Duration
	// CaseTimeout bounds each case (default 60s): a real cluster, where
	// every sandbox is a pod the kubelet starts, needs more.
	CaseTimeout time.Duration
	// NoCommands tells that the backend's agents run no commands (the
	// fake's, kwok's stand-in): cases check what the API reports and skip
	// the checks made by commands inside the sandbox.
	NoCommands bool
	// Egress, if set, builds the server's egress enforcement over the
	// backend's network (package egresstest) for the Egress case. Nil:
	// the backend has none (the server refuses networkPolicy, 501).
	Egress func(t *testing.T, rt runtime.Runtime) EgressHarness
	// Vault, if set, runs the Credential Vault's proxy of the backend
	// for the Vault case. Nil: the backend has none (the server refuses
	// credentialProxy, 501).
	Vault func(t *testing.T, rt runtime.Runtime) VaultHarness
	// NoDiskQuota tells that the backend cannot enforce
	// Resources.DiskBytes: the DiskQuota case then checks it refuses one
	// with ErrNotImplemented instead of ignoring it.
	NoDiskQuota bool
	// DiskQuotaEvicts tells that the backend enforces
	// Resources.DiskBytes by ending the sandbox that exceeds it (the
	// kubelet evicts a pod over its ephemeral-storage limit) rather than
	// by failing the write: the DiskQuota case then wants the sandbox
	// stopped within DiskQuotaEvictTimeout, its Status message naming
	// the eviction.
	DiskQuotaEvicts bool
	// DiskQuotaEvictTimeout bounds the wait for the eviction (default
	// 3m: the kubelet measures usage periodically).
	DiskQuotaEvictTimeout time.Duration
	// ImageExists, if set, tells whether an image SnapshotImage returned
	// is still stored (the Snapshot case wants it gone after
	// RemoveSnapshotImage).
	ImageExists func(ctx context.Context, image string) (bool, error)
	// SnapshotImagesOff tells that the backend implements
	// runtime.ImageSnapshotter but refuses it for the suite's sandboxes:
	// set up without a place for the images (the kubernetes backend with
	// a controller that has no registry), or of a class whose writes it
	// cannot see (gVisor on Kubernetes). The Snapshot case then wants
	// ErrNotImplemented and the sandbox running on.
	SnapshotImagesOff bool
	// IPv6 tells that the backend was set up dual-stack: the IPv6 case
	// then wants a global address in sandboxes, else no IPv6 at all.
	IPv6 bool
}

// Token is the agent token the suite sets on every sandbox.
const Token = "runtimetest-token"

// Run runs the suite. newRuntime returns a fresh backend with empty state;
// it must register cleanups with t for everything it creates.
func Run(t *testing.T, newRuntime func(t *testing.T) runtime.Runtime, opts Options) {
	if opts.Image == "" {
		t.Fatal("runtimetest: Options.Image is required")
	}
	if opts.Reopen == nil {
		t.Fatal("runtimetest: Options.Reopen is required")
	}
	if opts.AgentTimeout == 0 {
		opts.AgentTimeout = 10 * time.Second
	}
	s := suite{opts: opts, newRuntime: newRuntime}
	t.Run("Lifecycle", s.lifecycle)
	t.Run("UnknownID", s.unknownID)
	t.Run("InvalidSpec", s.invalidSpec)
	t.Run("Recover", s.recover)
	t.Run("Concurrent", s.concurrent)
	t.Run("StopRunningWithoutGrace", s.stopNoGrace)
	t.Run("Checkpoint", s.checkpoint)
	t.Run("Snapshot", s.snapshot)
	t.Run("Volumes", s.volumes)
	t.Run("DiskQuota", s.diskQuota)
	t.Run("InitExit", s.exitCase)
	if !opts.NoCommands {
		t.Run("Isolation", s.isolation)
		t.Run("IPv6", s.ipv6)
	}
	if opts.Egress != nil {
		t.Run("Egress", s.egressCase)
	}
	if opts.Vault != nil {
		t.Run("Vault", s.vaultCase)
	}
}

type suite struct {
	opts       Options
	newRuntime func(t *testing.T) runtime.Runtime
}

// NewID returns a fresh sandbox ID with the given prefix.
func NewID(prefix string) string {
	return fmt.Sprintf("%s-%08x", prefix, rand.Uint32())
}

func (s *suite) spec(id string) runtime.Spec {
	return runtime.Spec{
		ID:         id,
		Image:      s.opts.Image,
		Class:      s.opts.Class,
		AgentToken: Token,
		Env:        map[string]string{"RUNTIMETEST": "1"},
		Labels:     map[string]string{"suite": "runtimetest"},
		Resources:  runtime.Resources{CPUMillis: 500, MemoryBytes: 256 << 20, PidsLimit: 128},
	}
}

// ctxFor bounds one case (Options.CaseTimeout).
func (s *suite) ctxFor(t *testing.T) context.Context {
	d := s.opts.CaseTimeout
	if d == 0 {
		d = 60 * time.Second
	}
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// create creates a sandbox and registers its deletion.
func (s *suite) create(t *testing.T, ctx context.Context, rt runtime.Runtime, id string) runtime.Status {
	t.Helper()
	return s.createSpec(t, ctx, rt, s.spec(id))
}

// createSpec creates a sandbox of spec, deleted when t ends.
func (s *suite) createSpec(t *testing.T, ctx context.Context, rt runtime.Runtime, spec runtime.Spec) runtime.Status {
	t.Helper()
	id := spec.ID
	st, err := rt.Create(ctx, spec)
	if err != nil {
		t.Fatalf("Create(%s): %v", id, err)
	}
	t.Cleanup(func() { rt.Delete(context.Background(), id) })
	if st.ID != id {
		t.Errorf("Create returned ID %q, want %q", st.ID, id)
	}
	return st
}

// WaitState polls Status until it reports want.
func WaitState(t *testing.T, ctx context.Context, rt runtime.Runtime, id string, want runtime.State, timeout time.Duration) runtime.Status {
	t.Helper()
	deadline := time.Now().Add(timeout)
	var st runtime.Status
	var err error
	for time.Now().Before(deadline) {
		st, err = rt.Status(ctx, id)
		if err == nil && st.State == want {
			return st
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("sandbox %s: state %q (err %v, message %q), want %q", id, st.State, err, st.Message, want)
	return st
}

// WaitAgent polls GET /ping on the sandbox's agent until it returns 200.
func WaitAgent(t testing.TB, ctx context.Context, rt runtime.Runtime, id string, timeout time.Duration) {
	t.Helper()
	if err := PingAgent(ctx, rt, id, timeout); err != nil {
		t.Fatal(err)
	}
}

// PingAgent is WaitAgent returning an error, for benchmarks and goroutines.
func PingAgent(ctx context.Context, rt runtime.Runtime, id string, timeout time.Duration) error {
	ep, err := rt.Endpoint(ctx, id, agentproto.Port)
	if err != nil {
		return fmt.Errorf("Endpoint(%s, %d): %w", id, agentproto.Port, err)
	}
	host, _, err := net.SplitHostPort(ep)
	if err != nil {
		return fmt.Errorf("endpoint %q is not host:port: %w", ep, err)
	}
	if ip := net.ParseIP(host); ip == nil {
		return fmt.Errorf("endpoint host %q is not an IP", host)
	}
	client := &http.Client{
		Timeout:   time.Second,
		Transport: &http.Transport{DisableKeepAlives: true},
	}
	defer client.CloseIdleConnections()
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	if _, err := (&agentproto.Client{HTTP: client}).WaitReady(ctx, ep, Token); err != nil {
		return fmt.Errorf("agent of %s at %s after %v: %w", id, ep, timeout, err)
	}
	return nil
}

func listHas(t *testing.T, ctx context.Context, rt runtime.Runtime, id string) (runtime.Status, bool) {
	t.Helper()
	list, err := rt.List(ctx)
	if err != nil {
		t.Fatalf("List: %v", err)
	}
	for _, st := range list {
		if st.ID == id {
			return st, true
		}
	}
	return runtime.Status{}, false
}

func (s *suite) lifecycle(t *testing.T) {
	ctx := s.ctxFor(t)
	rt := s.newRuntime(t)
	if rt.Name() == "" {
		t.Error("Name is empty")
	}
	id := NewID("life")
	st := s.create(t, ctx, rt, id)
	if st.CreatedAt.IsZero() {
		t.Error("Create: CreatedAt is zero")
	}
	st = WaitState(t, ctx, rt, id, runtime.StateRunning, 10*time.Second)
	if st.Labels["suite"] != "runtimetest" {
		t.Errorf("Status labels = %v", st.Labels)
	}
	if caps := rt.Capabilities(); s.opts.Class != "" && !slices.Contains(caps.Classes, s.opts.Class) {
		t.Errorf("Capabilities().Classes = %v does not offer %q", caps.Classes, s.opts.Class)
	}
	WaitAgent(t, ctx, rt, id, s.opts.AgentTimeout)

	if ls, ok := listHas(t, ctx, rt, id); !ok {
		t.Errorf("List does not contain %s", id)
	} else if ls.State != runtime.StateRunning {
		t.Errorf("List reports %s as %q, want running", id, ls.State)
	}

	if _, err := rt.Create(ctx, s.spec(id)); !errdefs.IsAlreadyExists(err) {
		t.Errorf("duplicate Create = %v, want ErrAlreadyExists", err)
	}
	// The failed duplicate must not have damaged the original.
	WaitState(t, ctx, rt, id, runtime.StateRunning, time.Second)
	WaitAgent(t, ctx, rt, id, s.opts.AgentTimeout)

	if p, ok := rt.(runtime.Pauser); ok {
		s.pauseResume(t, ctx, rt, p, id)
	}
	stopAndDelete(t, ctx, rt, id)
	// The ID is free again.
	s.create(t, ctx, rt, id)
	WaitState(t, ctx, rt, id, runtime.StateRunning, 10*time.Second)
	if err := rt.Delete(ctx, id); err != nil {
		t.Fatalf("Delete of re-created: %v", err)
	}
}

// pauseResume checks Pause and Resume of the running sandbox id, and
// that each refuses the state it leaves.
func (s *suite) pauseResume(t *testing.T, ctx context.Context, rt runtime.Runtime, p runtime.Pauser, id string) {
	if err := p.Pause(ctx, id); err != nil {
		t.Fatalf("Pause: %v", err)
	}
	WaitState(t, ctx, rt, id, runtime.StatePaused, 5*time.Second)
	if err := p.Pause(ctx, id); !errdefs.IsFailedPrecondition(err) {
		t.Errorf("Pause of paused = %v, want ErrFailedPrecondition", err)
	}
	if err := p.Resume(ctx, id); err != nil {
		t.Fatalf("Resume: %v", err)
	}
	WaitState(t, ctx, rt, id, runtime.StateRunning, 5*time.Second)
	if err := p.Resume(ctx, id); !errdefs.IsFailedPrecondition(err) {
		t.Errorf("Resume of running = %v, want ErrFailedPrecondition", err)
	}
	WaitAgent(t, ctx, rt, id, s.opts.AgentTimeout)
}

// stopAndDelete checks that the running sandbox id stops and is deleted,
// each twice without error, and that List follows.
func stopAndDelete(t *testing.T, ctx context.Context, rt runtime.Runtime, id string) {
	if err := rt.Stop(ctx, id, 5*time.Second); err != nil {
		t.Fatalf("Stop: %v", err)
	}
	WaitState(t, ctx, rt, id, runtime.StateStopped, 5*time.Second)
	if err := rt.Stop(ctx, id, time.Second); err != nil {
		t.Errorf("Stop of stopped = %v, want nil", err)
	}
	if ls, ok := listHas(t, ctx, rt, id); !ok || ls.State != runtime.StateStopped {
		t.Errorf("List after Stop: %v (found %v), want stopped", ls.State, ok)
	}

	if err := rt.Delete(ctx, id); err != nil {
		t.Fatalf("Delete: %v", err)
	}
	if _, err := rt.Status(ctx, id); !errdefs.IsNotFound(err) {
		t.Errorf("Status after Delete = %v, want ErrNotFound", err)
	}
	if _, ok := listHas(t, ctx, rt, id); ok {
		t.Errorf("List still contains %s after Delete", id)
	}
	if err := rt.Delete(ctx, id); err != nil {
		t.Errorf("second Delete = %v, want nil", err)
	}
}

func (s *suite) unknownID(t *testing.T) {
	ctx := s.ctxFor(t)
	rt := s.newRuntime(t)
	id := NewID("nope")
	if _, err := rt.Status(ctx, id); !errdefs.IsNotFound(err) {
		t.Errorf("Status = %v, want ErrNotFound", err)
	}
	if err := rt.Stop(ctx, id, time.Second); !errdefs.IsNotFound(err) {
		t.Errorf("Stop = %v, want ErrNotFound", err)
	}
	if _, err := rt.Endpoint(ctx, id, agentproto.Port); !errdefs.IsNotFound(err) {
		t.Errorf("Endpoint = %v, want ErrNotFound", err)
	}
	if err := rt.Delete(ctx, id); err != nil {
		t.Errorf("Delete = %v, want nil", err)
	}
	if p, ok := rt.(runtime.Pauser); ok {
		if err := p.Pause(ctx, id); !errdefs.IsNotFound(err) {
			t.Errorf("Pause = %v, want ErrNotFound", err)
		}
		if err := p.Resume(ctx, id); !errdefs.IsNotFound(err) {
			t.Errorf("Resume = %v, want ErrNotFound", err)
		}
	}
	if _, err := rt.Status(ctx, "../../etc"); !errdefs.IsNotFound(err) && !errdefs.IsInvalidArgument(err) {
		t.Errorf("Status(path traversal) = %v, want ErrNotFound or ErrInvalidArgument", err)
	}
}

func (s *suite) invalidSpec(t *testing.T) {
	ctx := s.ctxFor(t)
	rt := s.newRuntime(t)
	for i, tc := range []struct {
		name   string
		mutate func(*runtime.Spec)
	}{
		{"empty id", func(sp *runtime.Spec) { sp.ID = "" }},
		{"uppercase id", func(sp *runtime.Spec) { sp.ID = "Bad_ID" }},
		{"path id", func(sp *runtime.Spec) { sp.ID = "../x" }},
		{"long id", func(sp *runtime.Spec) { sp.ID = strings.Repeat("a", 65) }},
		{"no image", func(sp *runtime.Spec) { sp.Image = "" }},
		{"unknown class", func(sp *runtime.Spec) { sp.Class = "no-such-class" }},
		{"negative cpu", func(sp *runtime.Spec) { sp.Resources.CPUMillis = -1 }},
		{"negative memory", func(sp *runtime.Spec) { sp.Resources.MemoryBytes = -1 }},
		{"relative workdir", func(sp *runtime.Spec) { sp.WorkingDir = "rel/dir" }},
		{"bad env name", func(sp *runtime.Spec) { sp.Env = map[string]string{"A=B": "c"} }},
	} {
		sp := s.spec(NewID("bad"))
		tc.mutate(&sp)
		if _, err := rt.Create(ctx, sp); !errdefs.IsInvalidArgument(err) {
			t.Errorf("%d %s: Create = %v, want ErrInvalidArgument", i, tc.name, err)
			rt.Delete(ctx, sp.ID)
		}
	}
	list, err := rt.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(list) != 0 {
		t.Errorf("List after invalid creates = %v, want empty", list)
	}
}

func (s *suite) recover(t *testing.T) {
	ctx := s.ctxFor(t)
	rt := s.newRuntime(t)
	id := NewID("rec")
	stopped := NewID("recstop")
	s.create(t, ctx, rt, id)
	s.create(t, ctx, rt, stopped)
	WaitState(t, ctx, rt, id, runtime.StateRunning, 10*time.Second)
	WaitState(t, ctx, rt, stopped, runtime.StateRunning, 10*time.Second)
	if err := rt.Stop(ctx, stopped, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	before, err := rt.Status(ctx, id)
	if err != nil {
		t.Fatal(err)
	}

	rt2 := s.opts.Reopen(t, rt)
	st, ok := listHas(t, ctx, rt2, id)
	if !ok {
		t.Fatalf("restarted backend does not list %s", id)
	}
	if st.State != runtime.StateRunning || st.IP != before.IP || st.Class != before.Class ||
		!st.CreatedAt.Equal(before.CreatedAt) || st.Labels["suite"] != "runtimetest" {
		t.Errorf("after restart: %+v, before: %+v", st, before)
	}
	if st, ok := listHas(t, ctx, rt2, stopped); !ok || st.State != runtime.StateStopped {
		t.Errorf("after restart, stopped sandbox: %+v (found %v)", st, ok)
	}
	WaitAgent(t, ctx, rt2, id, s.opts.AgentTimeout)
	if _, err := rt2.Create(ctx, s.spec(id)); !errdefs.IsAlreadyExists(err) {
		t.Errorf("Create of a recovered ID = %v, want ErrAlreadyExists", err)
	}
	for _, x := range []string{id, stopped} {
		if err := rt2.Delete(ctx, x); err != nil {
			t.Fatalf("Delete via restarted backend: %v", err)
		}
		if _, err := rt2.Status(ctx, x); !errdefs.IsNotFound(err) {
			t.Errorf("Status after Delete = %v", err)
		}
	}
}

func (s *suite) concurrent(t *testing.T) {
	ctx := s.ctxFor(t)
	rt := s.newRuntime(t)
	const n = 4
	ids := make([]string, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		ids[i] = NewID(fmt.Sprintf("par%d", i))
		wg.Go(func() {
			_, errs[i] = rt.Create(ctx, s.spec(ids[i]))
		})
	}
	wg.Wait()
	t.Cleanup(func() {
		for _, id := range ids {
			rt.Delete(context.Background(), id)
		}
	})
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	endpoints := map[string]bool{}
	for _, id := range ids {
		WaitState(t, ctx, rt, id, runtime.StateRunning, 10*time.Second)
		ep, err := rt.Endpoint(ctx, id, agentproto.Port)
		if err != nil {
			t.Fatal(err)
		}
		if endpoints[ep] {
			t.Errorf("agent endpoint %s given to two sandboxes", ep)
		}
		endpoints[ep] = true
		WaitAgent(t, ctx, rt, id, s.opts.AgentTimeout)
	}
	for i := range n {
		wg.Go(func() { errs[i] = rt.Delete(ctx, ids[i]) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	for _, id := range ids {
		if _, err := rt.Status(ctx, id); !errdefs.IsNotFound(err) {
			t.Errorf("Status(%s) after Delete = %v", id, err)
		}
	}
}

// stopNoGrace checks that a zero grace period still stops the sandbox
// (SIGKILL right away), and that a stopped sandbox can be deleted.
func (s *suite) stopNoGrace(t *testing.T) {
	ctx := s.ctxFor(t)
	rt := s.newRuntime(t)
	id := NewID("kill")
	s.create(t, ctx, rt, id)
	WaitState(t, ctx, rt, id, runtime.StateRunning, 10*time.Second)
	start := time.Now()
	if err := rt.Stop(ctx, id, 0); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("Stop with zero grace took %v", d)
	}
	WaitState(t, ctx, rt, id, runtime.StateStopped, 5*time.Second)
	if err := rt.Delete(ctx, id); err != nil {
		t.Fatal(err)
	}
}

// checkpoint checks runtime.Checkpointer: a class that cannot checkpoint
// says so (ErrNotImplemented); one that can leaves the source running and
// restores the checkpoint into new sandboxes, as often as asked.
func (s *suite) checkpoint(t *testing.T) {
	rt := s.newRuntime(t)
	cp, ok := rt.(runtime.Checkpointer)
	if !ok {
		t.Skipf("%s does not implement runtime.Checkpointer", rt.Name())
	}
	ctx := s.ctxFor(t)
	src := NewID("ckpt-src")
	s.create(t, ctx, rt, src)
	WaitAgent(t, ctx, rt, src, s.opts.AgentTimeout)
	name := NewID("ckpt")
	t.Cleanup(func() { cp.RemoveCheckpoint(context.Background(), name) })
	if !cp.CanCheckpoint(s.opts.Class) {
		if err := cp.Checkpoint(ctx, src, name); !errors.Is(err, errdefs.ErrNotImplemented) {
			t.Fatalf("Checkpoint with class %q that cannot checkpoint: %v, want ErrNotImplemented", s.opts.Class, err)
		}
		return
	}
	if err := cp.Checkpoint(ctx, NewID("missing"), name); !errdefs.IsNotFound(err) {
		t.Errorf("Checkpoint of an unknown sandbox: %v, want ErrNotFound", err)
	}
	if err := cp.Checkpoint(ctx, src, name); err != nil {
		t.Fatalf("Checkpoint: %v", err)
	}
	if err := cp.Checkpoint(ctx, src, name); !errdefs.IsAlreadyExists(err) {
		t.Errorf("second Checkpoint under the same name: %v, want ErrAlreadyExists", err)
	}
	// The source keeps running.
	if st, err := rt.Status(ctx, src); err != nil || st.State != runtime.StateRunning {
		t.Fatalf("source after Checkpoint: %+v %v", st, err)
	}
	WaitAgent(t, ctx, rt, src, s.opts.AgentTimeout)
	srcSt, _ := rt.Status(ctx, src)
	var ips []string
	for range 2 {
		id := NewID("ckpt-dst")
		spec := s.spec(id)
		spec.Checkpoint = name
		spec.AgentToken = "" // the restored agent holds the source's token
		st, err := rt.Create(ctx, spec)
		if err != nil {
			t.Fatalf("Create from checkpoint: %v", err)
		}
		t.Cleanup(func() { rt.Delete(context.Background(), id) })
		if st.State != runtime.StateRunning || (st.IP != "" && st.IP == srcSt.IP) {
			t.Fatalf("restored sandbox %+v (source IP %s)", st, srcSt.IP)
		}
		ips = append(ips, st.IP)
		// The restored agent answers with the source's token.
		WaitAgent(t, ctx, rt, id, s.opts.AgentTimeout)
	}
	if ips[0] != "" && ips[0] == ips[1] {
		t.Errorf("two restores share the address %s", ips[0])
	}
	WaitAgent(t, ctx, rt, src, s.opts.AgentTimeout)
	if err := cp.RemoveCheckpoint(ctx, name); err != nil {
		t.Fatalf("RemoveCheckpoint: %v", err)
	}
	if err := cp.RemoveCheckpoint(ctx, name); err != nil {
		t.Errorf("RemoveCheckpoint of a removed checkpoint: %v", err)
	}
	id := NewID("ckpt-gone")
	spec := s.spec(id)
	spec.Checkpoint = name
	if _, err := rt.Create(ctx, spec); err == nil {
		rt.Delete(context.Background(), id)
		t.Fatal("Create from a removed checkpoint succeeded")
	}
	if _, err := rt.Status(ctx, id); !errdefs.IsNotFound(err) {
		t.Errorf("a failed restore left sandbox %s behind: %v", id, err)
	}
}

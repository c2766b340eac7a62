package runtimetest

import (
	"context"
	"errors"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/moat-sandbox/moat/internal/egress/policy"
	"github.com/moat-sandbox/moat/internal/errdefs"
	"github.com/moat-sandbox/moat/internal/runtime"
)

// The cases that make every runtime equally safe: egress policy,
// sandbox-to-sandbox isolation, the disk quota and IPv6. A backend that
// cannot do one must refuse it clearly (Options.NoDiskQuota), never
// accept and ignore it.

// EgressHarness enforces network policies on a backend's sandboxes the
// way the server does (see package egresstest), against an outside host.
type EgressHarness interface {
	// Attach enforces p on sandbox id, whose address is ip.
	Attach(ctx context.Context, id string, ip netip.Addr, p policy.NetworkPolicy) error
	// Outside returns two addresses of an outside host the sandboxes
	// reach through the host; port 7000 answers on both (Banner).
	Outside() (allowed, denied string)
}

// EgressInside is an EgressHarness whose backend enforces egress inside
// the sandbox (the kubernetes runtime's sidecar): the policy goes into
// the create (Spec.Egress) and Attach then sets it as the server does.
type EgressInside interface {
	Spec(p policy.NetworkPolicy) *runtime.Egress
}

// EgressUpdater is an EgressHarness that changes a running sandbox's
// policy live (the egress API's POST /policy).
type EgressUpdater interface {
	Update(ctx context.Context, id string, p policy.NetworkPolicy) error
}

// Banner starts what the outside host of an EgressHarness answers.
const Banner = "moat-egress-test"

// egressCase: a sandbox with a policy reaches only what it allows; one
// without a policy reaches both outside addresses (so the denial is the
// policy's doing).
func (s *suite) egressCase(t *testing.T) {
	if s.opts.NoCommands {
		t.Fatal("Options.Egress needs a backend whose agents run commands")
	}
	ctx := s.ctxFor(t)
	rt := s.newRuntime(t)
	h := s.opts.Egress(t, rt)
	a, b := h.Outside()
	open := NewID("egress-open")
	s.create(t, ctx, rt, open)
	p := policy.NetworkPolicy{DefaultAction: policy.Deny, Egress: []policy.Rule{{Action: policy.Allow, Target: a + "/32"}}}
	limited := NewID("egress-pol")
	spec := s.spec(limited)
	if in, ok := h.(EgressInside); ok {
		spec.Egress = in.Spec(p)
	}
	st := s.createSpec(t, ctx, rt, spec)
	ip, err := netip.ParseAddr(st.IP)
	if err != nil {
		t.Fatalf("sandbox IP %q: %v", st.IP, err)
	}
	if err := h.Attach(ctx, limited, ip, p); err != nil {
		t.Fatalf("attach the policy: %v", err)
	}
	WaitAgent(t, ctx, rt, open, s.opts.AgentTimeout)
	WaitAgent(t, ctx, rt, limited, s.opts.AgentTimeout)
	reach := func(id, addr string) bool {
		out, _, err := Exec(ctx, rt, id, "nc -w 2 "+addr+" 7000 </dev/null")
		if err != nil {
			t.Fatalf("exec in %s: %v", id, err)
		}
		return strings.Contains(out, Banner[:10])
	}
	for _, addr := range []string{a, b} {
		if !reach(open, addr) {
			t.Fatalf("baseline: a sandbox without a policy cannot reach the outside host at %s", addr)
		}
	}
	if !reach(limited, a) {
		t.Errorf("the policy's allowed address %s is unreachable", a)
	}
	if reach(limited, b) {
		t.Errorf("a sandbox reached %s, which its policy denies", b)
	}
	up, ok := h.(EgressUpdater)
	if !ok || t.Failed() {
		return
	}
	// A live change: the other address allowed, the first denied.
	p = policy.NetworkPolicy{DefaultAction: policy.Deny, Egress: []policy.Rule{{Action: policy.Allow, Target: b + "/32"}}}
	if err := up.Update(ctx, limited, p); err != nil {
		t.Fatalf("update the policy: %v", err)
	}
	if !reach(limited, b) {
		t.Errorf("after the update, the newly allowed address %s is unreachable", b)
	}
	if reach(limited, a) {
		t.Errorf("after the update, a sandbox reached %s, which its policy now denies", a)
	}
}

// isolation (backends whose agents run commands): a sandbox cannot open a connection to another sandbox (its
// agent port), while the host can.
func (s *suite) isolation(t *testing.T) {
	ctx := s.ctxFor(t)
	rt := s.newRuntime(t)
	a, b := NewID("iso-a"), NewID("iso-b")
	s.create(t, ctx, rt, a)
	stB := s.create(t, ctx, rt, b)
	WaitAgent(t, ctx, rt, a, s.opts.AgentTimeout)
	WaitAgent(t, ctx, rt, b, s.opts.AgentTimeout) // the host reaches B
	out, code, err := Exec(ctx, rt, a, "nc -w 2 "+stB.IP+" 44772 </dev/null && echo connected")
	if err != nil {
		t.Fatal(err)
	}
	if code == 0 || strings.Contains(out, "connected") {
		t.Fatalf("sandbox %s connected to sandbox %s at %s:44772 (%q, exit %d)", a, b, stB.IP, out, code)
	}
}

// diskQuota: Resources.DiskBytes caps what a sandbox can write, or the
// backend refuses it with ErrNotImplemented naming the disk quota.
func (s *suite) diskQuota(t *testing.T) {
	ctx := s.ctxFor(t)
	rt := s.newRuntime(t)
	id := NewID("disk")
	spec := s.spec(id)
	spec.Resources.DiskBytes = 64 << 20
	_, err := rt.Create(ctx, spec)
	if s.opts.NoDiskQuota {
		if err == nil {
			rt.Delete(context.Background(), id)
			t.Fatal("Create with a disk quota succeeded on a backend that cannot enforce one")
		}
		if !errors.Is(err, errdefs.ErrNotImplemented) || !strings.Contains(strings.ToLower(err.Error()), "disk") {
			t.Fatalf("refusal of a disk quota: %v, want ErrNotImplemented naming the disk quota", err)
		}
		if _, serr := rt.Status(ctx, id); !errdefs.IsNotFound(serr) {
			t.Fatalf("a refused create left a sandbox: %v", serr)
		}
		return
	}
	if err != nil {
		t.Fatalf("Create with a disk quota: %v", err)
	}
	t.Cleanup(func() { rt.Delete(context.Background(), id) })
	if s.opts.NoCommands {
		return
	}
	WaitAgent(t, ctx, rt, id, s.opts.AgentTimeout)
	if out, code, err := Exec(ctx, rt, id, "dd if=/dev/zero of=/small bs=1M count=8 2>&1 && sync"); err != nil || code != 0 {
		t.Fatalf("writing 8 MiB under a 64 MiB quota: exit %d %v: %s", code, err, out)
	}
	if s.opts.DiskQuotaEvicts {
		s.diskQuotaEviction(t, rt, id)
		return
	}
	if out, code, err := Exec(ctx, rt, id, "dd if=/dev/zero of=/big bs=1M count=96 2>&1 && sync"); err != nil || code == 0 {
		t.Fatalf("writing 96 MiB under a 64 MiB quota succeeded (exit %d %v): %s", code, err, out)
	}
}

// diskQuotaEviction (Options.DiskQuotaEvicts): the sandbox that writes
// past its quota is ended by the backend, and Status says it was evicted;
// the write itself may succeed.
func (s *suite) diskQuotaEviction(t *testing.T, rt runtime.Runtime, id string) {
	timeout := s.opts.DiskQuotaEvictTimeout
	if timeout == 0 {
		timeout = 3 * time.Minute
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout+30*time.Second)
	defer cancel()
	if st, err := rt.Status(ctx, id); err != nil || st.State != runtime.StateRunning {
		t.Fatalf("before the write: %+v %v, want running", st, err)
	}
	// The agent may be gone before the command returns (evicted): its
	// answer does not matter, what happens to the sandbox does.
	Exec(ctx, rt, id, "dd if=/dev/zero of=/big bs=1M count=96 2>&1; sync")
	deadline := time.Now().Add(timeout)
	for {
		st, err := rt.Status(ctx, id)
		if err != nil {
			t.Fatalf("status after writing past the quota: %v", err)
		}
		if st.State != runtime.StateRunning && st.State != runtime.StateCreating {
			if st.State != runtime.StateStopped || !strings.Contains(strings.ToLower(st.Message), "evicted") {
				t.Fatalf("after writing 96 MiB under a 64 MiB quota: state %s (%q), want stopped with a message naming the eviction", st.State, st.Message)
			}
			t.Logf("evicted: %s", st.Message)
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("writing 96 MiB under a 64 MiB quota: the sandbox still %s after %v (%q), want it evicted", st.State, timeout, st.Message)
		}
		time.Sleep(time.Second)
	}
}

// ipv6 (backends whose agents run commands): without Options.IPv6 a sandbox has no IPv6 path at all; with it,
// a global IPv6 address.
func (s *suite) ipv6(t *testing.T) {
	ctx := s.ctxFor(t)
	rt := s.newRuntime(t)
	id := NewID("ipv6")
	s.create(t, ctx, rt, id)
	WaitAgent(t, ctx, rt, id, s.opts.AgentTimeout)
	// Addresses as the sandbox sees them (netlink: also gVisor's netstack).
	out, code, err := Exec(ctx, rt, id, "ip -6 addr show dev eth0")
	if err != nil || code != 0 {
		t.Fatalf("ip -6 addr in the sandbox: exit %d %v: %s", code, err, out)
	}
	if s.opts.IPv6 {
		if !strings.Contains(out, "scope global") {
			t.Fatalf("dual-stack backend: no global IPv6 address on eth0: %q", out)
		}
		return
	}
	if strings.Contains(out, "inet6") {
		t.Fatalf("IPv4-only backend: eth0 has IPv6 addresses (want no IPv6 path at all): %q", out)
	}
}

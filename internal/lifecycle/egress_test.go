package lifecycle

import (
	"context"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/moat-sandbox/moat/internal/egress/policy"
	"github.com/moat-sandbox/moat/internal/runtime"
)

// recordingEgress is an Egress that remembers what it was asked to enforce.
type recordingEgress struct {
	mu       sync.Mutex
	attached map[string]policy.NetworkPolicy
}

func (r *recordingEgress) Attach(_ context.Context, id string, _ netip.Addr, p policy.NetworkPolicy) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.attached[id] = p
	return nil
}
func (r *recordingEgress) Detach(context.Context, string) error { return nil }
func (r *recordingEgress) Get(id string) (policy.NetworkPolicy, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.attached[id], nil
}
func (r *recordingEgress) Modify(ctx context.Context, id string, fn func(policy.NetworkPolicy) (policy.NetworkPolicy, error)) (policy.NetworkPolicy, error) {
	p, _ := r.Get(id)
	next, err := fn(p)
	if err == nil {
		err = r.Attach(ctx, id, netip.Addr{}, next)
	}
	return next, err
}

// TestCreateStartsUnderPolicy: a sandbox with a network policy is created
// with it in its runtime spec (Spec.Egress, for a backend that enforces
// inside the sandbox) and its egress token, and is then attached with the
// same policy; one without a policy gets no Spec.Egress.
func TestCreateStartsUnderPolicy(t *testing.T) {
	h := newHarness(t)
	eg := &recordingEgress{attached: map[string]policy.NetworkPolicy{}}
	svc, err := New(Config{MaxTimeout: 24 * time.Hour}, Deps{Store: h.db, Runtime: h.rt, Images: fakeImages{}, Now: h.clk.Now, Egress: eg})
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	specs := map[string]*runtime.Egress{}
	h.hooks.Create = func(s runtime.Spec) error {
		mu.Lock()
		defer mu.Unlock()
		specs[s.ID] = s.Egress
		return nil
	}
	ctx := context.Background()
	r := req(time.Hour)
	r.NetworkPolicy = []byte(`{"defaultAction":"deny","egress":[{"action":"allow","target":"a.test"}]}`)
	sb, err := svc.Create(ctx, r)
	if err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	got := specs[sb.ID]
	mu.Unlock()
	if got == nil || got.Token == "" || got.Policy.DefaultAction != policy.Deny || len(got.Policy.Egress) != 1 || got.Policy.Egress[0].Target != "a.test" {
		t.Fatalf("runtime spec egress %+v", got)
	}
	if tok, _ := svc.EgressToken(ctx, sb.ID); tok != got.Token {
		t.Errorf("the spec's token is not the sandbox's egress token")
	}
	if p, _ := eg.Get(sb.ID); len(p.Egress) != 1 || p.Egress[0].Target != "a.test" {
		t.Errorf("attached %+v", p)
	}
	plain, err := svc.Create(ctx, req(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if specs[plain.ID] != nil {
		t.Errorf("a sandbox without a policy got Spec.Egress %+v", specs[plain.ID])
	}
}

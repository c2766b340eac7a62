package client

import (
	"context"
	"fmt"
	"net/http"
)

// PolicyStatus is the egress policy in force after a call.
type PolicyStatus struct {
	Status string `json:"status"`
	// Mode is "allow_all", "deny_all" or "enforcing".
	Mode            string `json:"mode"`
	EnforcementMode string `json:"enforcementMode"`
	Reason          string `json:"reason,omitempty"`
	// Policy is the sandbox's own policy.
	Policy *NetworkPolicy `json:"policy,omitempty"`
	// TenantPolicy is its tenant's egress guardrail, if any; then
	// EffectivePolicy is what is enforced (Policy within TenantPolicy) and
	// Mode is its mode.
	TenantPolicy    *NetworkPolicy `json:"tenantPolicy,omitempty"`
	EffectivePolicy *NetworkPolicy `json:"effectivePolicy,omitempty"`
}

// egressTransport resolves the egress endpoint (port 18080) once.
func (s *SandboxHandle) egressTransport(ctx context.Context) (*transport, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.egress != nil {
		return s.egress, nil
	}
	t, err := s.c.endpointTransport(ctx, s.ID, EgressPort, false)
	if err != nil {
		return nil, fmt.Errorf("sandbox %q: egress endpoint: %w", s.ID, err)
	}
	s.egress = t
	return t, nil
}

// GetPolicy returns the sandbox's egress policy.
func (s *SandboxHandle) GetPolicy(ctx context.Context) (*PolicyStatus, error) {
	t, err := s.egressTransport(ctx)
	if err != nil {
		return nil, err
	}
	var st PolicyStatus
	if err := t.json(ctx, &call{method: http.MethodGet, path: "/policy"}, nil, &st); err != nil {
		return nil, err
	}
	return &st, nil
}

// PatchPolicy adds rules ahead of the current ones (a rule for an existing
// target replaces it); the default action is unchanged.
func (s *SandboxHandle) PatchPolicy(ctx context.Context, rules []NetworkRule) (*PolicyStatus, error) {
	if len(rules) == 0 {
		return nil, fmt.Errorf("client: PatchPolicy needs at least one rule: %w", ErrInvalid)
	}
	t, err := s.egressTransport(ctx)
	if err != nil {
		return nil, err
	}
	var st PolicyStatus
	if err := t.json(ctx, &call{method: http.MethodPatch, path: "/policy", idempotent: true}, rules, &st); err != nil {
		return nil, err
	}
	return &st, nil
}

// ReplacePolicy replaces the whole policy; nil installs deny-all.
func (s *SandboxHandle) ReplacePolicy(ctx context.Context, p *NetworkPolicy) (*PolicyStatus, error) {
	t, err := s.egressTransport(ctx)
	if err != nil {
		return nil, err
	}
	if p == nil {
		p = &NetworkPolicy{}
	}
	var st PolicyStatus
	if err := t.json(ctx, &call{method: http.MethodPut, path: "/policy"}, p, &st); err != nil {
		return nil, err
	}
	return &st, nil
}

package e2b

import (
	"encoding/json"
	"slices"

	"github.com/moat-sandbox/moat/internal/egress/policy"
	"github.com/moat-sandbox/moat/internal/errdefs"
)

// networkConfig is the part of E2B's SandboxNetworkConfig moat enforces:
// allowOut and denyOut (CIDRs, addresses; domains in allowOut). The rest
// (public traffic, host masking, per-host rules, an egress proxy) is
// refused when set.
type networkConfig struct {
	AllowOut           []string        `json:"allowOut"`
	DenyOut            []string        `json:"denyOut"`
	AllowPublicTraffic *bool           `json:"allowPublicTraffic"`
	MaskRequestHost    *string         `json:"maskRequestHost"`
	HTTPSPorts         []int           `json:"httpsPorts"`
	Rules              json.RawMessage `json:"rules"`
	EgressProxy        json.RawMessage `json:"egressProxy"`
}

// allTraffic is E2B's ALL_TRAFFIC.
const allTraffic = "0.0.0.0/0"

// networkPolicy translates E2B's network settings into moat's egress
// policy (OpenSandbox networkPolicy JSON), nil when they ask for nothing:
//   - allow_internet_access false, or denyOut holding 0.0.0.0/0: default
//     deny, with allowOut as the allowed targets;
//   - otherwise default allow, with denyOut as the denied targets.
func networkPolicy(internet *bool, n *networkConfig) ([]byte, error) {
	if n != nil {
		switch {
		case n.AllowPublicTraffic != nil && !*n.AllowPublicTraffic:
			return nil, notSupported("network.allowPublicTraffic false")
		case n.MaskRequestHost != nil, len(n.HTTPSPorts) > 0:
			return nil, notSupported("network.maskRequestHost and network.httpsPorts")
		case len(n.Rules) > 0 && string(n.Rules) != "null" && string(n.Rules) != "{}":
			return nil, notSupported("network.rules")
		case len(n.EgressProxy) > 0 && string(n.EgressProxy) != "null":
			return nil, notSupported("network.egressProxy")
		}
	}
	var allow, deny []string
	if n != nil {
		allow, deny = n.AllowOut, n.DenyOut
	}
	denyAll := internet != nil && !*internet || slices.Contains(deny, allTraffic)
	if !denyAll && len(deny) == 0 {
		return nil, nil // allowOut alone allows what is allowed anyway
	}
	p := policy.NetworkPolicy{DefaultAction: policy.Allow, Egress: []policy.Rule{}}
	if denyAll {
		p.DefaultAction = policy.Deny
		for _, t := range allow {
			p.Egress = append(p.Egress, policy.Rule{Action: policy.Allow, Target: t})
		}
	} else {
		for _, t := range deny {
			p.Egress = append(p.Egress, policy.Rule{Action: policy.Deny, Target: t})
		}
	}
	b, err := json.Marshal(p)
	if err != nil {
		return nil, err
	}
	return b, nil
}

func notSupported(what string) error {
	return errdefs.WithPublic(errdefs.ErrNotImplemented, "", what+" is not supported by this server")
}

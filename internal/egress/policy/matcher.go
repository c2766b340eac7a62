package policy

import (
	"net/netip"
	"slices"
	"strings"
)

// Matcher is a compiled, immutable NetworkPolicy. It is safe for concurrent
// use; swap a *Matcher atomically to change a sandbox's policy.
type Matcher struct {
	policy NetworkPolicy
	// exact and wildcard map a domain (for wildcards: the suffix after
	// "*.") to the lowest index of a rule with that target.
	exact    map[string]int
	wildcard map[string]int
	// addrRules are the IP and CIDR rules in index order.
	addrRules []addrRule
}

type addrRule struct {
	prefix netip.Prefix // masked; a single IP is a /32 or /128
	action Action
}

// Compile validates p and builds its Matcher.
func Compile(p NetworkPolicy) (*Matcher, error) {
	n, err := Normalize(p)
	if err != nil {
		return nil, err
	}
	m := &Matcher{policy: n, exact: map[string]int{}, wildcard: map[string]int{}}
	for i, r := range n.Egress {
		_, kind, err := NormalizeTarget(r.Target)
		if err != nil {
			return nil, err // unreachable: n is normalized
		}
		switch kind {
		case KindDomain:
			if _, ok := m.exact[r.Target]; !ok {
				m.exact[r.Target] = i
			}
		case KindWildcard:
			suffix := strings.TrimPrefix(r.Target, "*.")
			if _, ok := m.wildcard[suffix]; !ok {
				m.wildcard[suffix] = i
			}
		case KindIP:
			a := netip.MustParseAddr(r.Target)
			m.addrRules = append(m.addrRules, addrRule{netip.PrefixFrom(a, a.BitLen()), r.Action})
		case KindCIDR:
			m.addrRules = append(m.addrRules, addrRule{netip.MustParsePrefix(r.Target).Masked(), r.Action})
		}
	}
	return m, nil
}

// Policy returns the normalized policy m was compiled from (a copy).
func (m *Matcher) Policy() NetworkPolicy { return m.policy.Clone() }

// Default returns the default action.
func (m *Matcher) Default() Action { return m.policy.DefaultAction }

// Evaluate returns the action for a DNS name: the first domain or wildcard
// rule (by index) that matches, else the default. IP and CIDR rules never
// match names. The cost is one map lookup per label of name.
func (m *Matcher) Evaluate(name string) Action {
	if a, ok := m.Explicit(name); ok {
		return a
	}
	return m.policy.DefaultAction
}

// Decide returns the action for a DNS name, as Evaluate, and the target
// of the rule that decided ("default" when none did).
func (m *Matcher) Decide(name string) (Action, string) {
	if i := m.explicit(name); i >= 0 {
		return m.policy.Egress[i].Action, m.policy.Egress[i].Target
	}
	return m.policy.DefaultAction, "default"
}

// Explicit returns the action of the first domain or wildcard rule that
// matches name, and false when no rule does (the default action applies).
func (m *Matcher) Explicit(name string) (Action, bool) {
	if i := m.explicit(name); i >= 0 {
		return m.policy.Egress[i].Action, true
	}
	return "", false
}

// explicit is the index of the first domain or wildcard rule matching
// name, -1 if none does.
func (m *Matcher) explicit(name string) int {
	name = NormalizeName(name)
	best := -1
	if i, ok := m.exact[name]; ok {
		best = i
	}
	if len(m.wildcard) > 0 {
		for i := 0; i < len(name); i++ {
			if name[i] != '.' {
				continue
			}
			if j, ok := m.wildcard[name[i+1:]]; ok && (best < 0 || j < best) {
				best = j
			}
		}
	}
	return best
}

// ExplicitlyAllows reports whether an allow rule (not the default) covers
// host, a DNS name or "*.suffix"; for a wildcard, a rule must cover every
// subdomain of suffix (a wildcard rule on suffix or on a parent of it).
func (m *Matcher) ExplicitlyAllows(host string) bool {
	host = NormalizeName(host)
	if suffix, ok := strings.CutPrefix(host, "*."); ok {
		// A probe subdomain that only wildcard rules can match.
		probe := "x--moat-probe." + suffix
		if _, exact := m.exact[probe]; exact {
			return false
		}
		a, ok := m.Explicit(probe)
		return ok && a == Allow
	}
	a, ok := m.Explicit(host)
	return ok && a == Allow
}

// EvaluateAddr returns the action of the first IP or CIDR rule containing
// a, or the default. This is what the static nftables sets implement.
func (m *Matcher) EvaluateAddr(a netip.Addr) Action {
	for _, r := range m.addrRules {
		if r.prefix.Contains(a) {
			return r.action
		}
	}
	return m.policy.DefaultAction
}

// Range is an inclusive address range; From and To have the same family.
type Range struct {
	From, To netip.Addr
}

// StaticSets are the IP/CIDR rules flattened into disjoint, sorted,
// non-adjacent ranges per family and action, so that an address is in
// Allow (Deny) exactly when the first IP/CIDR rule containing it allows
// (denies) it. Order between overlapping rules is thereby preserved even
// though nftables sets are unordered.
type StaticSets struct {
	Allow4, Deny4, Allow6, Deny6 []Range
}

// StaticSets computes the nftables interval set contents of m.
func (m *Matcher) StaticSets() StaticSets {
	var claimed4, claimed6 []Range // sorted, disjoint
	var s StaticSets
	for _, r := range m.addrRules {
		rg := PrefixRange(r.prefix)
		claimed := &claimed4
		dst := &s.Allow4
		if r.prefix.Addr().Is6() {
			claimed = &claimed6
			dst = &s.Allow6
			if r.action == Deny {
				dst = &s.Deny6
			}
		} else if r.action == Deny {
			dst = &s.Deny4
		}
		for _, piece := range subtract(rg, *claimed) {
			*dst = append(*dst, piece)
			*claimed = insertRange(*claimed, piece)
		}
	}
	s.Allow4, s.Deny4 = mergeRanges(s.Allow4), mergeRanges(s.Deny4)
	s.Allow6, s.Deny6 = mergeRanges(s.Allow6), mergeRanges(s.Deny6)
	return s
}

// PrefixRange returns the addresses of p as a Range.
func PrefixRange(p netip.Prefix) Range {
	from := p.Masked().Addr()
	b := from.AsSlice()
	bits := p.Bits()
	for i := range b {
		// Set every bit past the prefix length.
		lo := i * 8
		switch {
		case lo >= bits:
			b[i] = 0xff
		case lo+8 > bits:
			b[i] |= 0xff >> (bits - lo)
		}
	}
	to, _ := netip.AddrFromSlice(b)
	return Range{From: from, To: to}
}

// subtract returns the parts of r not covered by claimed (sorted,
// disjoint), in address order.
func subtract(r Range, claimed []Range) []Range {
	var out []Range
	cur := r.From
	i, _ := slices.BinarySearchFunc(claimed, r.From, func(c Range, a netip.Addr) int { return c.To.Compare(a) })
	for ; i < len(claimed) && claimed[i].From.Compare(r.To) <= 0; i++ {
		c := claimed[i]
		if c.From.Compare(cur) > 0 {
			out = append(out, Range{cur, c.From.Prev()})
		}
		if c.To.Compare(r.To) >= 0 {
			return out
		}
		cur = c.To.Next()
	}
	return append(out, Range{cur, r.To})
}

// insertRange inserts r (disjoint from all of rs) keeping rs sorted.
func insertRange(rs []Range, r Range) []Range {
	i, _ := slices.BinarySearchFunc(rs, r.From, func(c Range, a netip.Addr) int { return c.From.Compare(a) })
	return slices.Insert(rs, i, r)
}

// mergeRanges sorts disjoint ranges and joins adjacent ones.
func mergeRanges(rs []Range) []Range {
	if len(rs) == 0 {
		return nil
	}
	slices.SortFunc(rs, func(a, b Range) int { return a.From.Compare(b.From) })
	out := rs[:1]
	for _, r := range rs[1:] {
		last := &out[len(out)-1]
		if n := last.To.Next(); n.IsValid() && n == r.From {
			last.To = r.To
			continue
		}
		out = append(out, r)
	}
	return out
}

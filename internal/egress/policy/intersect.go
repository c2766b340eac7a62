package policy

import (
	"cmp"
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"github.com/moat-sandbox/moat/internal/errdefs"
)

// Tenant guardrails. A tenant's egress policy bounds every sandbox of the
// tenant: what is enforced is Intersect(tenant, sandbox), which allows
// what both allow and nothing else. Precisely, with dns+nft enforcement
// (names are answered by the DNS proxy, packets filtered by nftables):
//
//   - a DNS name is answered iff both policies' Evaluate allow it (each
//     by its first matching domain or wildcard rule, else its default);
//   - a packet to an address is dropped if either policy's first IP/CIDR
//     rule containing it denies it; accepted if both policies' first
//     containing rules allow it, or one's does and the other has no
//     containing rule and a default of allow; otherwise (some policy has
//     no rule for it) it is accepted only as an address the proxy just
//     resolved for an answered name, or when both defaults allow;
//   - the default action is allow iff both defaults are allow.
//
// The result is one ordinary NetworkPolicy (exact names first, then
// wildcards from the longest suffix, then disjoint address rules), so the
// enforcer, the egress API and the Credential Vault need nothing new. It
// has no more domain rules than the two inputs together; its address rules
// are CIDR blocks of the intersected ranges.

// Intersect returns the policy that allows exactly what both a and b
// allow (see above). It is symmetric; both inputs are validated.
func Intersect(a, b NetworkPolicy) (NetworkPolicy, error) {
	ma, err := Compile(a)
	if err != nil {
		return NetworkPolicy{}, err
	}
	mb, err := Compile(b)
	if err != nil {
		return NetworkPolicy{}, err
	}
	def := and(ma.Default(), mb.Default())
	out := NetworkPolicy{DefaultAction: def, Egress: intersectNames(ma, mb, def)}
	out.Egress = append(out.Egress, intersectAddrs(ma, mb)...)
	if len(out.Egress) > MaxRules {
		return NetworkPolicy{}, errdefs.Invalid(ErrCode, fmt.Sprintf(
			"the effective policy (tenant and sandbox policies intersected) has %d rules (max %d)", len(out.Egress), MaxRules))
	}
	return Normalize(out)
}

// Effective is what a sandbox is enforced with: its own policy (nil: none)
// under its tenant's guardrail (nil: none). Nil when neither exists (the
// sandbox is not filtered); a missing own policy allows everything.
func Effective(tenant, own *NetworkPolicy) (*NetworkPolicy, error) {
	switch {
	case tenant == nil && own == nil:
		return nil, nil
	case tenant == nil:
		p, err := Normalize(*own)
		return &p, err
	case own == nil:
		p, err := Normalize(*tenant)
		return &p, err
	}
	p, err := Intersect(*tenant, *own)
	return &p, err
}

func and(a, b Action) Action {
	if a == Allow && b == Allow {
		return Allow
	}
	return Deny
}

// belowVerdict is a policy's verdict on a name strictly below suffix that
// no exact rule names and that no wildcard longer than "*."+suffix among
// the considered targets matches: its first wildcard rule on suffix or a
// parent of it, else its default.
func belowVerdict(m *Matcher, suffix string) Action {
	best := -1
	for s := suffix; ; {
		if i, ok := m.wildcard[s]; ok && (best < 0 || i < best) {
			best = i
		}
		dot := strings.IndexByte(s, '.')
		if dot < 0 {
			break
		}
		s = s[dot+1:]
	}
	if best < 0 {
		return m.policy.DefaultAction
	}
	return m.policy.Egress[best].Action
}

// intersectNames returns the domain and wildcard rules of the
// intersection. Every name falls in one class: an exact target of either
// policy, else the longest wildcard of either matching it, else none (the
// defaults). Within a class both policies' verdicts are constant, so one
// rule per class, ordered exact first and longest wildcard first, gives
// the intersection; rules equal to what the next shorter class gives are
// dropped.
func intersectNames(ma, mb *Matcher, def Action) []Rule {
	exact := map[string]bool{}
	wild := map[string]bool{}
	for _, m := range []*Matcher{ma, mb} {
		for n := range m.exact {
			exact[n] = true
		}
		for s := range m.wildcard {
			wild[s] = true
		}
	}
	// Wildcards shortest first, so that a parent's fate is known.
	suffixes := slices.SortedFunc(func(yield func(string) bool) {
		for s := range wild {
			if !yield(s) {
				return
			}
		}
	}, func(x, y string) int { return cmp.Or(cmp.Compare(len(x), len(y)), cmp.Compare(x, y)) })
	kept := map[string]Action{}
	// parent is the verdict of the longest kept wildcard strictly above
	// name (a proper suffix of it), else the default.
	parent := func(name string) Action {
		for s := name; ; {
			dot := strings.IndexByte(s, '.')
			if dot < 0 {
				return def
			}
			s = s[dot+1:]
			if a, ok := kept[s]; ok {
				return a
			}
		}
	}
	for _, s := range suffixes {
		if v := and(belowVerdict(ma, s), belowVerdict(mb, s)); v != parent("x."+s) {
			kept[s] = v
		}
	}
	var rules []Rule
	for _, n := range slices.Sorted(func(yield func(string) bool) {
		for n := range exact {
			if !yield(n) {
				return
			}
		}
	}) {
		if v := and(ma.Evaluate(n), mb.Evaluate(n)); v != parent(n) {
			rules = append(rules, Rule{Action: v, Target: n})
		}
	}
	var ws []string
	for s := range kept {
		ws = append(ws, s)
	}
	slices.SortFunc(ws, func(x, y string) int { return cmp.Or(cmp.Compare(len(y), len(x)), cmp.Compare(x, y)) })
	for _, s := range ws {
		rules = append(rules, Rule{Action: kept[s], Target: "*." + s})
	}
	return rules
}

// addrClass is a policy's explicit verdict on an address: allow, deny or
// none (no IP/CIDR rule contains it).
type addrClass int8

const (
	classNone addrClass = iota
	classAllow
	classDeny
)

// classOf returns the explicit verdict of sets on a.
func classOf(sets StaticSets, a netip.Addr) addrClass {
	allow, deny := sets.Allow4, sets.Deny4
	if a.Is6() {
		allow, deny = sets.Allow6, sets.Deny6
	}
	if inRanges(deny, a) {
		return classDeny
	}
	if inRanges(allow, a) {
		return classAllow
	}
	return classNone
}

func inRanges(rs []Range, a netip.Addr) bool {
	_, found := slices.BinarySearchFunc(rs, a, func(r Range, a netip.Addr) int {
		if r.To.Less(a) {
			return -1
		}
		if a.Less(r.From) {
			return 1
		}
		return 0
	})
	return found
}

// combine is the intersection's explicit verdict from the two policies'
// explicit verdicts and defaults (see the package comment above).
func combine(ca, cb addrClass, defA, defB Action) addrClass {
	switch {
	case ca == classDeny || cb == classDeny:
		return classDeny
	case ca == classAllow && (cb == classAllow || defB == Allow):
		return classAllow
	case cb == classAllow && defA == Allow:
		return classAllow
	}
	return classNone // the resolved addresses and the default decide
}

// intersectAddrs returns the IP/CIDR rules of the intersection: the
// address space is cut at every boundary of either policy's ranges, each
// piece gets its combined verdict, and the allow and deny pieces become
// disjoint CIDR rules (pieces without a verdict get no rule).
func intersectAddrs(ma, mb *Matcher) []Rule {
	sa, sb := ma.StaticSets(), mb.StaticSets()
	var rules []Rule
	for _, fam := range []struct {
		hi     netip.Addr
		ranges [][]Range
	}{
		{netip.MustParseAddr("255.255.255.255"), [][]Range{sa.Allow4, sa.Deny4, sb.Allow4, sb.Deny4}},
		{netip.MustParseAddr("ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff"), [][]Range{sa.Allow6, sa.Deny6, sb.Allow6, sb.Deny6}},
	} {
		cuts := map[netip.Addr]bool{}
		for _, rs := range fam.ranges {
			for _, r := range rs {
				cuts[r.From] = true
				if n := r.To.Next(); n.IsValid() {
					cuts[n] = true
				}
			}
		}
		if len(cuts) == 0 {
			continue
		}
		starts := slices.SortedFunc(func(yield func(netip.Addr) bool) {
			for a := range cuts {
				if !yield(a) {
					return
				}
			}
		}, netip.Addr.Compare)
		type piece struct {
			r Range
			c addrClass
		}
		var pieces []piece
		for i, from := range starts {
			to := fam.hi
			if i+1 < len(starts) {
				to = starts[i+1].Prev()
			}
			c := combine(classOf(sa, from), classOf(sb, from), ma.Default(), mb.Default())
			if c == classNone {
				continue
			}
			if n := len(pieces); n > 0 && pieces[n-1].c == c && pieces[n-1].r.To.Next() == from {
				pieces[n-1].r.To = to
				continue
			}
			pieces = append(pieces, piece{Range{from, to}, c})
		}
		for _, p := range pieces {
			act := Allow
			if p.c == classDeny {
				act = Deny
			}
			for _, pfx := range RangePrefixes(p.r) {
				t := pfx.String()
				if pfx.IsSingleIP() {
					t = pfx.Addr().String()
				}
				rules = append(rules, Rule{Action: act, Target: t})
			}
		}
	}
	return rules
}

// RangePrefixes returns the fewest prefixes that cover exactly r, in
// address order.
func RangePrefixes(r Range) []netip.Prefix {
	var out []netip.Prefix
	cur := r.From
	for {
		bits := cur.BitLen()
		// The shortest prefix that starts at cur and ends within r.
		for l := 0; l <= cur.BitLen(); l++ {
			p := netip.PrefixFrom(cur, l)
			if p.Masked().Addr() != cur {
				continue
			}
			if PrefixRange(p).To.Compare(r.To) <= 0 {
				bits = l
				break
			}
		}
		p := netip.PrefixFrom(cur, bits)
		out = append(out, p)
		end := PrefixRange(p).To
		if end.Compare(r.To) >= 0 {
			return out
		}
		cur = end.Next()
	}
}

// Covers reports whether every name host denotes (a DNS name, or
// "*.suffix": every name below suffix) is allowed by m, by a rule or by
// the default. A Credential Vault binding must fall inside its tenant's
// guardrail this way.
func (m *Matcher) Covers(host string) bool {
	host = NormalizeName(host)
	suffix, wildcard := strings.CutPrefix(host, "*.")
	if !wildcard {
		return m.Evaluate(host) == Allow
	}
	if belowVerdict(m, suffix) != Allow {
		return false
	}
	// No rule below suffix may deny.
	tail := "." + suffix
	for n, i := range m.exact {
		if strings.HasSuffix(n, tail) && m.policy.Egress[i].Action == Deny {
			return false
		}
	}
	for s, i := range m.wildcard {
		if strings.HasSuffix(s, tail) && m.policy.Egress[i].Action == Deny {
			return false
		}
	}
	return true
}

// Layers is a sandbox's egress policy as the egress API shows it.
type Layers struct {
	// Own is the sandbox's own policy (allow-all when it set none).
	Own NetworkPolicy
	// Tenant is its tenant's guardrail (nil: none).
	Tenant *NetworkPolicy
	// Effective is what is enforced: Own intersected with Tenant.
	Effective NetworkPolicy
}

package policy

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"strings"
	"testing"
)

func mustParse(t *testing.T, s string) NetworkPolicy {
	t.Helper()
	p, err := Parse([]byte(s))
	if err != nil {
		t.Fatalf("parse %s: %v", s, err)
	}
	return p
}

// addrVerdict is what dns+nft does with a packet to a (resolved: the DNS
// proxy just answered an allowed name with a): the chain order of nft.
func addrVerdict(m *Matcher, a netip.Addr, resolved bool) Action {
	switch classOf(m.StaticSets(), a) {
	case classDeny:
		return Deny
	case classAllow:
		return Allow
	}
	if resolved {
		return Allow
	}
	return m.Default()
}

// TestIntersectTable: the cases the docs name.
func TestIntersectTable(t *testing.T) {
	for i, tc := range []struct {
		tenant, own string
		allowed     []string // names the effective policy answers
		denied      []string
		addrAllow   []string // addresses reachable without a resolution
		addrDeny    []string // addresses never reachable
	}{
		// 0: a tenant allow list under a sandbox without limits.
		{`{"defaultAction":"deny","egress":[{"action":"allow","target":"*.corp.test"},{"action":"allow","target":"10.0.0.0/8"}]}`,
			`{"defaultAction":"allow"}`,
			[]string{"a.corp.test", "b.a.corp.test"}, []string{"corp.test", "evil.test"}, []string{"10.1.2.3"}, nil},
		// 1: the sandbox narrows to one host.
		{`{"defaultAction":"deny","egress":[{"action":"allow","target":"*.corp.test"}]}`,
			`{"defaultAction":"deny","egress":[{"action":"allow","target":"api.corp.test"}]}`,
			[]string{"api.corp.test"}, []string{"db.corp.test", "x.api.corp.test"}, nil, nil},
		// 2: the sandbox cannot widen: its allow outside the tenant's is void.
		{`{"defaultAction":"deny","egress":[{"action":"allow","target":"*.corp.test"}]}`,
			`{"defaultAction":"allow","egress":[{"action":"allow","target":"evil.test"},{"action":"allow","target":"1.2.3.4"}]}`,
			[]string{"a.corp.test"}, []string{"evil.test"}, nil, nil},
		// 3: a tenant deny list: the sandbox keeps its own allows inside it.
		{`{"defaultAction":"allow","egress":[{"action":"deny","target":"*.evil.test"},{"action":"deny","target":"169.254.0.0/16"}]}`,
			`{"defaultAction":"deny","egress":[{"action":"allow","target":"*.evil.test"},{"action":"allow","target":"ok.test"},{"action":"allow","target":"169.254.169.254"},{"action":"allow","target":"192.168.0.0/16"}]}`,
			[]string{"ok.test"}, []string{"a.evil.test", "other.test"}, []string{"192.168.1.1"}, []string{"169.254.169.254", "169.254.1.1"}},
		// 4: first match per policy: the tenant's earlier allow shadows its deny.
		{`{"defaultAction":"deny","egress":[{"action":"allow","target":"*.corp.test"},{"action":"deny","target":"secret.corp.test"}]}`,
			`{"defaultAction":"allow","egress":[{"action":"deny","target":"*.x.corp.test"}]}`,
			[]string{"secret.corp.test", "x.corp.test"}, []string{"a.x.corp.test"}, nil, nil},
		// 5: a hole in a tenant deny: reachable only by name.
		{`{"defaultAction":"allow","egress":[{"action":"allow","target":"10.1.0.0/16"},{"action":"deny","target":"10.0.0.0/8"}]}`,
			`{"defaultAction":"deny","egress":[{"action":"allow","target":"db.test"}]}`,
			[]string{"db.test"}, []string{"x.test"}, nil, []string{"10.2.0.1", "10.0.0.1"}},
	} {
		t.Run(fmt.Sprint(i), func(t *testing.T) {
			a, b := mustParse(t, tc.tenant), mustParse(t, tc.own)
			e, err := Intersect(a, b)
			if err != nil {
				t.Fatal(err)
			}
			m, _ := Compile(e)
			for _, n := range tc.allowed {
				if m.Evaluate(n) != Allow {
					t.Errorf("%s denied by %+v", n, e)
				}
			}
			for _, n := range tc.denied {
				if m.Evaluate(n) != Deny {
					t.Errorf("%s allowed by %+v", n, e)
				}
			}
			for _, s := range tc.addrAllow {
				if addrVerdict(m, netip.MustParseAddr(s), false) != Allow {
					t.Errorf("%s unreachable under %+v", s, e)
				}
			}
			for _, s := range tc.addrDeny {
				if addrVerdict(m, netip.MustParseAddr(s), true) != Deny {
					t.Errorf("%s reachable under %+v", s, e)
				}
			}
			names, addrs := probes(a, b)
			checkIntersection(t, a, b, e, names, addrs)
		})
	}
}

// probes are names and addresses around every target of a and b.
func probes(ps ...NetworkPolicy) (names []string, addrs []netip.Addr) {
	names = []string{"unrelated.test", "x"}
	for _, p := range ps {
		for _, r := range p.Egress {
			_, kind, _ := NormalizeTarget(r.Target)
			switch kind {
			case KindDomain:
				names = append(names, r.Target, "a."+r.Target, "b.c."+r.Target)
				if i := strings.IndexByte(r.Target, '.'); i > 0 {
					names = append(names, r.Target[i+1:])
				}
			case KindWildcard:
				s := strings.TrimPrefix(r.Target, "*.")
				names = append(names, s, "p."+s, "q.p."+s)
			case KindIP, KindCIDR:
				pfx, err := netip.ParsePrefix(r.Target)
				if err != nil {
					a := netip.MustParseAddr(r.Target)
					pfx = netip.PrefixFrom(a, a.BitLen())
				}
				rg := PrefixRange(pfx)
				for _, a := range []netip.Addr{rg.From, rg.To, rg.From.Prev(), rg.To.Next(), rg.From.Next()} {
					if a.IsValid() {
						addrs = append(addrs, a)
					}
				}
			}
		}
	}
	addrs = append(addrs, netip.MustParseAddr("0.0.0.0"), netip.MustParseAddr("255.255.255.255"), netip.MustParseAddr("::"), netip.MustParseAddr("2001:db8::1"))
	return names, addrs
}

// checkIntersection compares e with the definition on the probes: a name
// is answered iff both answer it; a packet passes iff it passes both
// (with the same resolution), for resolved and unresolved addresses.
func checkIntersection(t *testing.T, a, b, e NetworkPolicy, names []string, addrs []netip.Addr) {
	t.Helper()
	ma, _ := Compile(a)
	mb, _ := Compile(b)
	me, err := Compile(e)
	if err != nil {
		t.Fatalf("effective policy does not compile: %v", err)
	}
	for _, n := range names {
		if want := and(ma.Evaluate(n), mb.Evaluate(n)); me.Evaluate(n) != want {
			t.Errorf("name %s: %s, want %s\n a %+v\n b %+v\n e %+v", n, me.Evaluate(n), want, a, b, e)
		}
	}
	for _, ad := range addrs {
		for _, res := range []bool{false, true} {
			if want := and(addrVerdict(ma, ad, res), addrVerdict(mb, ad, res)); addrVerdict(me, ad, res) != want {
				t.Errorf("addr %s (resolved %v): %s, want %s\n a %+v\n b %+v\n e %+v", ad, res, addrVerdict(me, ad, res), want, a, b, e)
			}
		}
	}
}

// randomPolicy draws a policy from a small universe, so that targets
// overlap, nest and shadow each other often.
func randomPolicy(r *rand.Rand) NetworkPolicy {
	names := []string{"a.test", "b.a.test", "test", "c.b.a.test", "x.test", "y.x.test"}
	cidrs := []string{"10.0.0.0/8", "10.1.0.0/16", "10.1.2.0/24", "10.1.2.3", "10.255.255.255", "192.168.0.0/16", "0.0.0.0/0", "fd00::/8", "fd00::1", "::/0"}
	act := func() Action {
		if r.IntN(2) == 0 {
			return Allow
		}
		return Deny
	}
	p := NetworkPolicy{DefaultAction: act()}
	for range r.IntN(7) {
		var t string
		switch r.IntN(3) {
		case 0:
			t = names[r.IntN(len(names))]
		case 1:
			t = "*." + names[r.IntN(len(names))]
		default:
			t = cidrs[r.IntN(len(cidrs))]
		}
		p.Egress = append(p.Egress, Rule{Action: act(), Target: t})
	}
	return p
}

// TestIntersectRandom holds Intersect to its definition on thousands of
// random pairs of overlapping policies, and checks that it is symmetric in
// effect, idempotent, and never larger than needed for the name rules.
func TestIntersectRandom(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for i := range 3000 {
		a, b := randomPolicy(r), randomPolicy(r)
		e, err := Intersect(a, b)
		if err != nil {
			t.Fatalf("%d: %v", i, err)
		}
		names, addrs := probes(a, b)
		checkIntersection(t, a, b, e, names, addrs)
		if e2, _ := Intersect(b, a); fmt.Sprint(e2) != fmt.Sprint(e) {
			t.Errorf("%d: not symmetric: %+v vs %+v", i, e, e2)
		}
		if ee, _ := Intersect(e, e); fmt.Sprint(ee) != fmt.Sprint(e) {
			t.Errorf("%d: not idempotent: %+v then %+v", i, e, ee)
		}
		if t.Failed() {
			t.FailNow()
		}
	}
}

func TestEffective(t *testing.T) {
	deny := DenyAll()
	if p, err := Effective(nil, nil); p != nil || err != nil {
		t.Errorf("neither: %v %v", p, err)
	}
	if p, _ := Effective(&deny, nil); p == nil || p.Mode() != ModeDenyAll {
		t.Errorf("tenant only: %v", p)
	}
	own := mustParse(t, `{"defaultAction":"allow"}`)
	if p, _ := Effective(nil, &own); p == nil || p.Mode() != ModeAllowAll {
		t.Errorf("own only: %v", p)
	}
	if p, _ := Effective(&deny, &own); p.Mode() != ModeDenyAll {
		t.Errorf("deny tenant, allow own: %v", p)
	}
	bad := NetworkPolicy{DefaultAction: "maybe"}
	if _, err := Effective(&bad, &own); err == nil {
		t.Error("a bad tenant policy was accepted")
	}
}

func TestRangePrefixes(t *testing.T) {
	for _, tc := range []struct{ from, to, want string }{
		{"10.0.0.0", "10.255.255.255", "[10.0.0.0/8]"},
		{"10.0.0.1", "10.0.0.6", "[10.0.0.1/32 10.0.0.2/31 10.0.0.4/31 10.0.0.6/32]"},
		{"0.0.0.0", "255.255.255.255", "[0.0.0.0/0]"},
		{"::", "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff", "[::/0]"},
	} {
		got := fmt.Sprint(RangePrefixes(Range{netip.MustParseAddr(tc.from), netip.MustParseAddr(tc.to)}))
		if got != tc.want {
			t.Errorf("%s-%s: %s, want %s", tc.from, tc.to, got, tc.want)
		}
	}
}

func TestCovers(t *testing.T) {
	m, _ := Compile(mustParse(t, `{"defaultAction":"deny","egress":[{"action":"deny","target":"bad.corp.test"},{"action":"allow","target":"*.corp.test"},{"action":"allow","target":"api.test"}]}`))
	for host, want := range map[string]bool{
		"api.test": true, "a.corp.test": true, "bad.corp.test": false, "*.corp.test": false, "corp.test": false,
		"*.x.corp.test": true, "other.test": false, "*.test": false,
	} {
		if got := m.Covers(host); got != want {
			t.Errorf("Covers(%s) = %v, want %v", host, got, want)
		}
	}
	allowAll, _ := Compile(AllowAll())
	if !allowAll.Covers("*.anything.test") {
		t.Error("allow-all does not cover a wildcard")
	}
}

// FuzzIntersect checks the definition on policies the fuzzer builds.
func FuzzIntersect(f *testing.F) {
	f.Add(`{"defaultAction":"deny","egress":[{"action":"allow","target":"*.a.test"}]}`, `{"defaultAction":"allow","egress":[{"action":"deny","target":"10.0.0.0/8"}]}`)
	f.Add(`{"defaultAction":"allow"}`, `{}`)
	f.Fuzz(func(t *testing.T, x, y string) {
		a, err := Parse([]byte(x))
		if err != nil {
			return
		}
		b, err := Parse([]byte(y))
		if err != nil {
			return
		}
		if len(a.Egress)+len(b.Egress) > 64 {
			return
		}
		e, err := Intersect(a, b)
		if err != nil {
			return // too many address rules: refused, not wrong
		}
		names, addrs := probes(a, b)
		checkIntersection(t, a, b, e, names, addrs)
	})
}

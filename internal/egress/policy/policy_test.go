package policy

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"reflect"
	"strings"
	"testing"

	"go.uber.org/goleak"

	"github.com/moat-sandbox/moat/internal/errdefs"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestParse(t *testing.T) {
	tests := []struct {
		name    string
		in      string
		want    NetworkPolicy
		wantErr string // substring of the public message; "" means success
	}{
		{name: "1 empty body is deny-all", in: "", want: DenyAll()},
		{name: "2 null is deny-all", in: " null ", want: DenyAll()},
		{name: "3 empty object is deny-all", in: "{}", want: DenyAll()},
		{name: "4 defaults", in: `{"egress":[{"target":"Example.COM."}]}`,
			want: NetworkPolicy{DefaultAction: Deny, Egress: []Rule{{Deny, "example.com"}}}},
		{name: "5 mixed targets canonical", in: `{"defaultAction":"ALLOW","egress":[
			{"action":"allow","target":" 10.0.0.1 "},{"action":"deny","target":"10.1.0.0/16"},
			{"action":"allow","target":"2001:DB8::1"},{"action":"deny","target":"*.Evil.com"}]}`,
			want: NetworkPolicy{DefaultAction: Allow, Egress: []Rule{
				{Allow, "10.0.0.1"}, {Deny, "10.1.0.0/16"}, {Allow, "2001:db8::1"}, {Deny, "*.evil.com"}}}},
		{name: "6 bad action", in: `{"egress":[{"action":"permit","target":"a.com"}]}`, wantErr: `unsupported action "permit"`},
		{name: "7 bad default", in: `{"defaultAction":"maybe"}`, wantErr: "defaultAction"},
		{name: "8 empty target", in: `{"egress":[{"action":"allow","target":"  "}]}`, wantErr: "egress[0]: target: must not be empty"},
		{name: "9 inner wildcard", in: `{"egress":[{"action":"allow","target":"a.*.com"}]}`, wantErr: "single leading"},
		{name: "10 double wildcard", in: `{"egress":[{"action":"allow","target":"*.*.com"}]}`, wantErr: "single leading"},
		{name: "11 suffix wildcard", in: `{"egress":[{"action":"allow","target":"*example.com"}]}`, wantErr: "single leading"},
		{name: "12 bare wildcard", in: `{"egress":[{"action":"allow","target":"*"}]}`, wantErr: "use defaultAction"},
		{name: "13 bad cidr", in: `{"egress":[{"action":"allow","target":"10.0.0.0/33"}]}`, wantErr: "invalid CIDR"},
		{name: "14 port in domain", in: `{"egress":[{"action":"allow","target":"a.com:443"}]}`, wantErr: "invalid character"},
		{name: "15 empty label", in: `{"egress":[{"action":"allow","target":"a..com"}]}`, wantErr: "empty label"},
		{name: "16 zone", in: `{"egress":[{"action":"allow","target":"fe80::1%eth0"}]}`, wantErr: "zones"},
		{name: "17 syntax", in: `{"egress":[`, wantErr: "malformed policy JSON"},
		{name: "18 wrong type", in: `{"egress":"a.com"}`, wantErr: `field "egress"`},
		{name: "19 long label", in: `{"egress":[{"target":"` + strings.Repeat("a", 64) + `.com"}]}`, wantErr: "63"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := Parse([]byte(tt.in))
			if tt.wantErr != "" {
				if err == nil {
					t.Fatalf("Parse = %+v, want error containing %q", got, tt.wantErr)
				}
				if !errdefs.IsInvalidArgument(err) {
					t.Errorf("error %v is not ErrInvalidArgument", err)
				}
				if !strings.Contains(err.Error(), tt.wantErr) {
					t.Errorf("error %q does not contain %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("Parse = %+v, want %+v", got, tt.want)
			}
		})
	}
}

func TestTooManyRules(t *testing.T) {
	p := NetworkPolicy{}
	for i := range MaxRules + 1 {
		p.Egress = append(p.Egress, Rule{Allow, fmt.Sprintf("h%d.example.com", i)})
	}
	if _, err := Normalize(p); err == nil || !strings.Contains(err.Error(), "too many") {
		t.Fatalf("Normalize(%d rules) err = %v, want too many", len(p.Egress), err)
	}
	p.Egress = p.Egress[:MaxRules]
	if _, err := Normalize(p); err != nil {
		t.Fatalf("Normalize(%d rules): %v", MaxRules, err)
	}
	if _, err := Patch(p, []Rule{{Allow, "one-more.example.com"}}); err == nil {
		t.Fatal("Patch past the cap succeeded")
	}
}

func TestJSONRoundTrip(t *testing.T) {
	p, err := Parse([]byte(`{"defaultAction":"deny","egress":[{"action":"allow","target":"*.pypi.org"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	b, err := json.Marshal(p)
	if err != nil {
		t.Fatal(err)
	}
	if want := `{"defaultAction":"deny","egress":[{"action":"allow","target":"*.pypi.org"}]}`; string(b) != want {
		t.Errorf("Marshal = %s, want %s", b, want)
	}
	b, _ = json.Marshal(DenyAll())
	if want := `{"defaultAction":"deny","egress":[]}`; string(b) != want {
		t.Errorf("Marshal(DenyAll) = %s, want %s", b, want)
	}
}

func TestEvaluate(t *testing.T) {
	m := mustCompile(t, NetworkPolicy{DefaultAction: Deny, Egress: []Rule{
		{Deny, "bad.example.com"},     // 0
		{Allow, "*.example.com"},      // 1
		{Allow, "pypi.org"},           // 2
		{Deny, "*.internal.pypi.org"}, // 3
		{Allow, "*.pypi.org"},         // 4
		{Allow, "10.0.0.0/8"},         // never matches names
		{Allow, "api.example.com"},    // 6, shadowed by 1 (also allow)
		{Deny, "x.y.example.com"},     // 7, shadowed by 1
	}})
	tests := []struct {
		name string
		want Action
	}{
		{"example.com", Deny}, // wildcard does not match the apex
		{"a.example.com", Allow},
		{"A.B.Example.COM.", Allow},
		{"bad.example.com", Deny},      // rule 0 beats rule 1
		{"sub.bad.example.com", Allow}, // exact rule 0 does not cover subdomains
		{"x.y.example.com", Allow},     // rule 1 beats rule 7
		{"pypi.org", Allow},
		{"files.pypi.org", Allow},
		{"a.internal.pypi.org", Deny}, // rule 3 beats rule 4
		{"internal.pypi.org", Allow},  // rule 3 does not match its apex; rule 4 does
		{"notpypi.org", Deny},
		{"10.0.0.1", Deny},
		{"", Deny},
		{".", Deny},
		{"org", Deny},
	}
	for i, tt := range tests {
		if got := m.Evaluate(tt.name); got != tt.want {
			t.Errorf("%d: Evaluate(%q) = %s, want %s", i, tt.name, got, tt.want)
		}
	}
	allow := mustCompile(t, NetworkPolicy{DefaultAction: Allow, Egress: []Rule{{Deny, "*.evil.com"}}})
	if got := allow.Evaluate("good.com"); got != Allow {
		t.Errorf("default allow: Evaluate(good.com) = %s", got)
	}
	if got := allow.Evaluate("a.evil.com"); got != Deny {
		t.Errorf("default allow: Evaluate(a.evil.com) = %s", got)
	}
}

func TestMode(t *testing.T) {
	tests := []struct {
		p    NetworkPolicy
		want string
	}{
		{DenyAll(), ModeDenyAll},
		{AllowAll(), ModeAllowAll},
		{NetworkPolicy{DefaultAction: Allow, Egress: []Rule{{Deny, "a.com"}}}, ModeEnforcing},
		{NetworkPolicy{DefaultAction: Deny, Egress: []Rule{{Allow, "a.com"}}}, ModeEnforcing},
	}
	for i, tt := range tests {
		if got := tt.p.Mode(); got != tt.want {
			t.Errorf("%d: Mode = %s, want %s", i, got, tt.want)
		}
	}
}

func TestPatch(t *testing.T) {
	base := NetworkPolicy{DefaultAction: Deny, Egress: []Rule{{Allow, "a.com"}, {Deny, "b.com"}, {Allow, "10.0.0.0/8"}}}
	tests := []struct {
		name    string
		patch   []Rule
		want    []Rule
		wantErr bool
	}{
		{name: "1 prepends", patch: []Rule{{Allow, "c.com"}},
			want: []Rule{{Allow, "c.com"}, {Allow, "a.com"}, {Deny, "b.com"}, {Allow, "10.0.0.0/8"}}},
		{name: "2 replaces existing target", patch: []Rule{{Allow, "B.com."}},
			want: []Rule{{Allow, "b.com"}, {Allow, "a.com"}, {Allow, "10.0.0.0/8"}}},
		{name: "3 first duplicate in patch wins", patch: []Rule{{Deny, "d.com"}, {Allow, "d.com"}},
			want: []Rule{{Deny, "d.com"}, {Allow, "a.com"}, {Deny, "b.com"}, {Allow, "10.0.0.0/8"}}},
		{name: "4 empty patch", patch: nil, wantErr: true},
		{name: "5 invalid rule", patch: []Rule{{Allow, "a.*.com"}}, wantErr: true},
		{name: "6 default action kept", patch: []Rule{{"", "10.0.0.0/8"}},
			want: []Rule{{Deny, "10.0.0.0/8"}, {Allow, "a.com"}, {Deny, "b.com"}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := Patch(base, tt.patch)
			if tt.wantErr {
				if !errdefs.IsInvalidArgument(err) {
					t.Fatalf("Patch err = %v, want invalid argument", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got.DefaultAction != Deny || !reflect.DeepEqual(got.Egress, tt.want) {
				t.Errorf("Patch = %+v, want %+v", got, tt.want)
			}
		})
	}
	if len(base.Egress) != 3 || base.Egress[0].Target != "a.com" {
		t.Errorf("Patch modified its input: %+v", base)
	}
}

func TestRemoveTargets(t *testing.T) {
	base := NetworkPolicy{DefaultAction: Allow, Egress: []Rule{{Deny, "a.com"}, {Deny, "2001:db8::1"}, {Deny, "*.b.com"}}}
	got, err := RemoveTargets(base, []string{"A.COM.", "2001:DB8:0::1", "missing.com"})
	if err != nil {
		t.Fatal(err)
	}
	if want := []Rule{{Deny, "*.b.com"}}; !reflect.DeepEqual(got.Egress, want) || got.DefaultAction != Allow {
		t.Errorf("RemoveTargets = %+v, want egress %+v", got, want)
	}
	if _, err := RemoveTargets(base, nil); !errdefs.IsInvalidArgument(err) {
		t.Errorf("RemoveTargets(nil) err = %v", err)
	}
	if _, err := RemoveTargets(base, []string{""}); !errdefs.IsInvalidArgument(err) {
		t.Errorf("RemoveTargets(empty target) err = %v", err)
	}
}

func TestParseRulesAndTargets(t *testing.T) {
	rules, err := ParseRules([]byte(`[{"action":"Allow","target":"X.com"}]`))
	if err != nil || !reflect.DeepEqual(rules, []Rule{{Allow, "x.com"}}) {
		t.Errorf("ParseRules = %+v, %v", rules, err)
	}
	for i, in := range []string{`[]`, `{}`, `[{"action":"allow","target":""}]`, `null`} {
		if _, err := ParseRules([]byte(in)); !errdefs.IsInvalidArgument(err) {
			t.Errorf("%d: ParseRules(%s) err = %v", i, in, err)
		}
	}
	if ts, err := ParseTargets([]byte(`["a.com","10.0.0.1"]`)); err != nil || len(ts) != 2 {
		t.Errorf("ParseTargets = %v, %v", ts, err)
	}
	for i, in := range []string{`[]`, `"a.com"`, `null`} {
		if _, err := ParseTargets([]byte(in)); !errdefs.IsInvalidArgument(err) {
			t.Errorf("%d: ParseTargets(%s) err = %v", i, in, err)
		}
	}
}

func TestStaticSets(t *testing.T) {
	m := mustCompile(t, NetworkPolicy{DefaultAction: Deny, Egress: []Rule{
		{Deny, "10.0.0.5"},
		{Allow, "10.0.0.0/24"},
		{Deny, "10.0.0.0/16"},
		{Allow, "10.0.1.0/24"}, // fully shadowed by the /16 deny
		{Allow, "192.168.0.0/24"},
		{Allow, "192.168.1.0/24"}, // adjacent: merged
		{Allow, "0.0.0.0/0"},
		{Deny, "2001:db8::/32"},
		{Allow, "2001:db8::1"}, // shadowed
		{Allow, "::/0"},
		{Allow, "example.com"}, // domains are not static
	}})
	r := func(a, b string) Range { return Range{netip.MustParseAddr(a), netip.MustParseAddr(b)} }
	want := StaticSets{
		Deny4: []Range{r("10.0.0.5", "10.0.0.5"), r("10.0.1.0", "10.0.255.255")},
		Allow4: []Range{r("0.0.0.0", "10.0.0.4"), r("10.0.0.6", "10.0.0.255"),
			r("10.1.0.0", "255.255.255.255")},
		Deny6:  []Range{r("2001:db8::", "2001:db8:ffff:ffff:ffff:ffff:ffff:ffff")},
		Allow6: []Range{r("::", "2001:db7:ffff:ffff:ffff:ffff:ffff:ffff"), r("2001:db9::", "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff")},
	}
	if got := m.StaticSets(); !reflect.DeepEqual(got, want) {
		t.Errorf("StaticSets =\n%+v\nwant\n%+v", got, want)
	}
}

// TestStaticSetsMatchEvaluateAddr checks the flattening against the
// first-match definition on random overlapping rule lists.
func TestStaticSetsMatchEvaluateAddr(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	randAddr := func() netip.Addr {
		// Concentrate on 10.0.0.0/22 so that rules overlap a lot.
		return netip.AddrFrom4([4]byte{10, 0, byte(rng.IntN(4)), byte(rng.IntN(256))})
	}
	for round := range 200 {
		var p NetworkPolicy
		p.DefaultAction = []Action{Allow, Deny}[rng.IntN(2)]
		for range rng.IntN(12) {
			a := []Action{Allow, Deny}[rng.IntN(2)]
			pfx := netip.PrefixFrom(randAddr(), 20+rng.IntN(13)).Masked()
			p.Egress = append(p.Egress, Rule{a, pfx.String()})
		}
		m := mustCompile(t, p)
		s := m.StaticSets()
		in := func(rs []Range, a netip.Addr) bool {
			for _, r := range rs {
				if r.From.Compare(a) <= 0 && a.Compare(r.To) <= 0 {
					return true
				}
			}
			return false
		}
		for range 300 {
			a := randAddr()
			allowed, denied := in(s.Allow4, a), in(s.Deny4, a)
			if allowed && denied {
				t.Fatalf("round %d: %s in both sets", round, a)
			}
			got := p.DefaultAction
			if allowed {
				got = Allow
			} else if denied {
				got = Deny
			}
			if want := m.EvaluateAddr(a); got != want {
				t.Fatalf("round %d: %s: sets say %s, EvaluateAddr says %s (policy %+v, sets %+v)", round, a, got, want, p, s)
			}
		}
	}
}

func mustCompile(t testing.TB, p NetworkPolicy) *Matcher {
	t.Helper()
	m, err := Compile(p)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func FuzzParsePolicy(f *testing.F) {
	for _, s := range []string{
		``, `{}`, `null`, `{"defaultAction":"allow"}`,
		`{"egress":[{"action":"allow","target":"*.example.com"}]}`,
		`{"egress":[{"action":"deny","target":"10.0.0.0/8"},{"target":"::1"}]}`,
		`{"egress":[{"action":"allow","target":"a.*.com"}]}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		p, err := Parse(data)
		if err != nil {
			if !errdefs.IsInvalidArgument(err) {
				t.Fatalf("Parse error %v is not invalid argument", err)
			}
			return
		}
		m, err := Compile(p)
		if err != nil {
			t.Fatalf("Compile(Parse output) failed: %v", err)
		}
		// Normalization is idempotent.
		if again, err := Normalize(p); err != nil || !reflect.DeepEqual(again, p) {
			t.Fatalf("Normalize not idempotent: %+v -> %+v, %v", p, again, err)
		}
		m.Evaluate(string(data))
		m.StaticSets()
	})
}

func BenchmarkEvaluate(b *testing.B) {
	var p NetworkPolicy
	p.DefaultAction = Deny
	for i := range MaxRules / 2 {
		p.Egress = append(p.Egress, Rule{Allow, fmt.Sprintf("host%d.example%d.com", i, i%50)})
		p.Egress = append(p.Egress, Rule{Allow, fmt.Sprintf("*.svc%d.internal", i)})
	}
	m := mustCompile(b, p)
	names := []string{"host17.example17.com", "a.b.c.svc99.internal", "nothing.matches.here.org"}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		m.Evaluate(names[i%len(names)])
	}
}

func TestExplicitlyAllows(t *testing.T) {
	m, err := Compile(NetworkPolicy{DefaultAction: Allow, Egress: []Rule{
		{Action: Deny, Target: "bad.example.com"},
		{Action: Allow, Target: "*.example.com"},
		{Action: Allow, Target: "api.test"},
		{Action: Deny, Target: "*.denied.test"},
		{Action: Allow, Target: "10.0.0.0/8"},
	}})
	if err != nil {
		t.Fatal(err)
	}
	for i, tc := range []struct {
		host string
		want bool
	}{
		{"api.test", true},
		{"API.test.", true},
		{"a.example.com", true},
		{"*.example.com", true},
		{"*.x.example.com", true},
		{"bad.example.com", false}, // an earlier deny rule
		{"example.com", false},     // the wildcard does not cover the apex; default allow does not count
		{"*.test", false},
		{"other.test", false}, // only the default allows it
		{"x.denied.test", false},
		{"*.denied.test", false},
	} {
		if got := m.ExplicitlyAllows(tc.host); got != tc.want {
			t.Errorf("%d: ExplicitlyAllows(%q) = %v, want %v", i, tc.host, got, tc.want)
		}
	}
}

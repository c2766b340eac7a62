package dnsproxy

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/miekg/dns"
	"go.uber.org/goleak"

	"github.com/moat-sandbox/moat/internal/egress/policy"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// FakeUpstream is an authoritative-looking DNS server on 127.0.0.1 that
// answers from a fixed map of name → records.
type fakeUpstream struct {
	addr    string
	queries atomic.Int64
}

func startUpstream(t *testing.T, records map[string][]string) *fakeUpstream {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	pc, ln, err := Listen(ctx, "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	u := &fakeUpstream{addr: pc.LocalAddr().String()}
	h := dns.HandlerFunc(func(w dns.ResponseWriter, r *dns.Msg) {
		u.queries.Add(1)
		m := new(dns.Msg)
		m.SetReply(r)
		rrs, ok := records[strings.ToLower(r.Question[0].Name)]
		if !ok {
			m.Rcode = dns.RcodeNameError
		}
		for _, s := range rrs {
			rr, err := dns.NewRR(s)
			if err != nil {
				panic(err)
			}
			if rr.Header().Rrtype == r.Question[0].Qtype || rr.Header().Rrtype == dns.TypeCNAME {
				m.Answer = append(m.Answer, rr)
			}
		}
		_ = w.WriteMsg(m)
	})
	var wg sync.WaitGroup
	t.Cleanup(func() { cancel(); wg.Wait() }) // runs after the Shutdowns below
	for _, srv := range []*dns.Server{{PacketConn: pc, Handler: h}, {Listener: ln, Handler: h}} {
		started := make(chan struct{})
		srv.NotifyStartedFunc = func() { close(started) }
		wg.Go(func() { _ = srv.ActivateAndServe() })
		<-started
		t.Cleanup(func() { _ = srv.Shutdown() })
	}
	return u
}

// startProxy runs a Server on 127.0.0.1 and returns its address.
func startProxy(t *testing.T, s *Server) string {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	pc, ln, err := Listen(ctx, "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- s.Serve(ctx, pc, ln) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	return pc.LocalAddr().String()
}

func compile(t *testing.T, js string) *policy.Matcher {
	t.Helper()
	p, err := policy.Parse([]byte(js))
	if err != nil {
		t.Fatal(err)
	}
	m, err := policy.Compile(p)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func query(t *testing.T, network, addr, name string, qtype uint16) *dns.Msg {
	t.Helper()
	c := &dns.Client{Net: network, Timeout: 2 * time.Second}
	m := new(dns.Msg)
	m.SetQuestion(dns.Fqdn(name), qtype)
	r, _, err := c.Exchange(m, addr)
	if err != nil {
		t.Fatalf("%s query %s: %v", network, name, err)
	}
	return r
}

func answerIPs(r *dns.Msg) []netip.Addr {
	var out []netip.Addr
	for _, rr := range r.Answer {
		switch v := rr.(type) {
		case *dns.A:
			a, _ := netip.AddrFromSlice(v.A.To4())
			out = append(out, a)
		case *dns.AAAA:
			a, _ := netip.AddrFromSlice(v.AAAA)
			out = append(out, a)
		}
	}
	return out
}

type resolved struct {
	name string
	ips  []netip.Addr
	ttl  time.Duration
}

func TestProxy(t *testing.T) {
	up := startUpstream(t, map[string][]string{
		"allowed.test.":     {"allowed.test. 300 IN A 10.250.9.1", "allowed.test. 300 IN AAAA fd00:250:9::1"},
		"www.wild.test.":    {"www.wild.test. 5 IN CNAME edge.cdn.test.", "edge.cdn.test. 5 IN A 10.250.9.2"},
		"long.wild.test.":   {"long.wild.test. 86400 IN A 10.250.9.3"},
		"denied.test.":      {"denied.test. 300 IN A 10.250.9.4"},
		"txt.allowed.test.": {`txt.allowed.test. 300 IN TXT "hello"`},
	})
	// The first upstream is a closed port, so every query also exercises
	// the fallback to the next one.
	dead := closedPort(t)
	s, err := New(Config{Upstreams: []string{dead, up.addr}, Timeout: time.Second, MinTTL: 30 * time.Second, MaxTTL: 10 * time.Minute, Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	var (
		mu   sync.Mutex
		seen []resolved
		hook atomic.Pointer[error]
	)
	c := NewClient(compile(t, `{"defaultAction":"deny","egress":[
		{"action":"allow","target":"allowed.test"},{"action":"allow","target":"*.wild.test"},
		{"action":"allow","target":"*.allowed.test"}]}`),
		func(ctx context.Context, name string, ips []netip.Addr, ttl time.Duration) error {
			time.Sleep(50 * time.Millisecond) // the reply must wait for us
			mu.Lock()
			seen = append(seen, resolved{name, ips, ttl})
			mu.Unlock()
			if e := hook.Load(); e != nil {
				return *e
			}
			return nil
		})
	if err := s.Register(netip.MustParseAddr("127.0.0.1"), c); err != nil {
		t.Fatal(err)
	}
	if err := s.Register(netip.MustParseAddr("::ffff:127.0.0.1"), c); err == nil {
		t.Error("duplicate Register (v4-mapped) succeeded")
	}
	addr := startProxy(t, s)
	lastSeen := func() (resolved, int) {
		mu.Lock()
		defer mu.Unlock()
		if len(seen) == 0 {
			return resolved{}, 0
		}
		return seen[len(seen)-1], len(seen)
	}

	for _, network := range []string{"udp", "tcp"} {
		t.Run(network, func(t *testing.T) {
			// 1 allowed A: hook ran before the reply, with the answer's TTL.
			_, before := lastSeen()
			r := query(t, network, addr, "Allowed.Test", dns.TypeA)
			got, n := lastSeen()
			if r.Rcode != dns.RcodeSuccess || !slices.Equal(answerIPs(r), []netip.Addr{netip.MustParseAddr("10.250.9.1")}) {
				t.Fatalf("allowed A: rcode %s answer %v", dns.RcodeToString[r.Rcode], r.Answer)
			}
			if n != before+1 || got.name != "allowed.test" || got.ttl != 300*time.Second ||
				!slices.Equal(got.ips, []netip.Addr{netip.MustParseAddr("10.250.9.1")}) {
				t.Fatalf("hook not called before reply: %+v (calls %d→%d)", got, before, n)
			}
			// 2 AAAA.
			r = query(t, network, addr, "allowed.test", dns.TypeAAAA)
			if got, _ := lastSeen(); r.Rcode != dns.RcodeSuccess || !slices.Equal(got.ips, []netip.Addr{netip.MustParseAddr("fd00:250:9::1")}) {
				t.Fatalf("allowed AAAA: rcode %d, hook %+v", r.Rcode, got)
			}
			// 3 wildcard via CNAME; TTL 5 is raised to MinTTL for the hook.
			r = query(t, network, addr, "www.wild.test", dns.TypeA)
			if got, _ := lastSeen(); r.Rcode != dns.RcodeSuccess || got.ttl != 30*time.Second ||
				!slices.Equal(got.ips, []netip.Addr{netip.MustParseAddr("10.250.9.2")}) {
				t.Fatalf("wildcard: rcode %d hook %+v", r.Rcode, got)
			}
			// 4 long TTL capped at MaxTTL in the hook and in the answer.
			r = query(t, network, addr, "long.wild.test", dns.TypeA)
			if got, _ := lastSeen(); got.ttl != 10*time.Minute || len(r.Answer) != 1 || r.Answer[0].Header().Ttl != 600 {
				t.Fatalf("ttl cap: hook %+v answer %v", got, r.Answer)
			}
			// 5 denied: NXDOMAIN, upstream never asked.
			q := up.queries.Load()
			for _, name := range []string{"denied.test", "wild.test", "sub.denied.test"} {
				r = query(t, network, addr, name, dns.TypeA)
				if r.Rcode != dns.RcodeNameError || len(r.Answer) != 0 {
					t.Errorf("denied %s: rcode %s answer %v", name, dns.RcodeToString[r.Rcode], r.Answer)
				}
			}
			if up.queries.Load() != q {
				t.Errorf("denied names reached the upstream")
			}
			// 6 no A/AAAA: no hook call, answer passed through.
			_, n = lastSeen()
			r = query(t, network, addr, "txt.allowed.test", dns.TypeTXT)
			if _, n2 := lastSeen(); r.Rcode != dns.RcodeSuccess || len(r.Answer) != 1 || n2 != n {
				t.Errorf("TXT: rcode %d answer %v hook calls %d→%d", r.Rcode, r.Answer, n, n2)
			}
		})
	}

	// 7 hook errors.
	errDenied, errBoom := ErrDenied, errors.New("boom")
	hook.Store(&errDenied)
	if r := query(t, "udp", addr, "allowed.test", dns.TypeA); r.Rcode != dns.RcodeNameError {
		t.Errorf("hook ErrDenied: rcode %s", dns.RcodeToString[r.Rcode])
	}
	hook.Store(&errBoom)
	if r := query(t, "udp", addr, "allowed.test", dns.TypeA); r.Rcode != dns.RcodeServerFailure {
		t.Errorf("hook error: rcode %s", dns.RcodeToString[r.Rcode])
	}
	hook.Store(nil)

	// 8 live policy swap flips allow and deny.
	c.SetPolicy(compile(t, `{"defaultAction":"deny","egress":[{"action":"allow","target":"denied.test"}]}`))
	if r := query(t, "udp", addr, "allowed.test", dns.TypeA); r.Rcode != dns.RcodeNameError {
		t.Errorf("after swap allowed.test: rcode %s", dns.RcodeToString[r.Rcode])
	}
	if r := query(t, "tcp", addr, "denied.test", dns.TypeA); r.Rcode != dns.RcodeSuccess || len(r.Answer) != 1 {
		t.Errorf("after swap denied.test: rcode %s", dns.RcodeToString[r.Rcode])
	}

	// 9 unknown source: REFUSED.
	s.Unregister(netip.MustParseAddr("127.0.0.1"))
	if r := query(t, "udp", addr, "denied.test", dns.TypeA); r.Rcode != dns.RcodeRefused {
		t.Errorf("unregistered client: rcode %s", dns.RcodeToString[r.Rcode])
	}
}

func TestUpstreamsDown(t *testing.T) {
	s, err := New(Config{Upstreams: []string{closedPort(t)}, Timeout: 500 * time.Millisecond, Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Register(netip.MustParseAddr("127.0.0.1"), NewClient(compile(t, `{"defaultAction":"allow"}`), nil)); err != nil {
		t.Fatal(err)
	}
	addr := startProxy(t, s)
	if r := query(t, "udp", addr, "anything.test", dns.TypeA); r.Rcode != dns.RcodeServerFailure {
		t.Errorf("rcode %s, want SERVFAIL", dns.RcodeToString[r.Rcode])
	}
}

func TestNewValidates(t *testing.T) {
	for i, cfg := range []Config{
		{},
		{Upstreams: []string{"10.0.0.1"}},
		{Upstreams: []string{"127.0.0.1:53"}, MinTTL: time.Hour, MaxTTL: time.Minute},
	} {
		if _, err := New(cfg); err == nil {
			t.Errorf("%d: New(%+v) succeeded", i, cfg)
		}
	}
}

// closedPort returns a loopback UDP address nobody listens on.
func closedPort(t *testing.T) string {
	t.Helper()
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := pc.LocalAddr().String()
	pc.Close()
	return addr
}

func testLogger(t *testing.T) *slog.Logger {
	return slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelDebug}))
}

func TestUpstreamsFromResolvConf(t *testing.T) {
	dir := t.TempDir()
	write := func(name, body string) string {
		p := dir + "/" + name
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	got, err := UpstreamsFromResolvConf(write("a", "# c\nsearch x\nnameserver 127.0.0.53\nnameserver 2001:db8::53\nnameserver fe80::1%eth0\nnameserver bogus\noptions edns0\n"))
	if err != nil || !slices.Equal(got, []string{"127.0.0.53:53", "[2001:db8::53]:53"}) {
		t.Errorf("UpstreamsFromResolvConf = %v, %v", got, err)
	}
	if _, err := UpstreamsFromResolvConf(write("b", "search x\n")); err == nil {
		t.Error("no nameserver: no error")
	}
	if _, err := UpstreamsFromResolvConf(dir + "/missing"); err == nil {
		t.Error("missing file: no error")
	}
}

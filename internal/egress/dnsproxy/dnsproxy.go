// Package dnsproxy is the filtering DNS forwarder sandboxes must use.
//
// One Server serves many sandboxes: each registered Client is keyed by the
// source IP of its queries (the sandbox's address on the bridge), so a
// single UDP+TCP listener on the bridge gateway handles every sandbox.
// Queries from unregistered sources are REFUSED.
//
// For each query the client's current policy decides: a denied name gets
// NXDOMAIN without contacting an upstream; an allowed name is forwarded to
// the configured upstream resolvers, and before the answer is sent the
// client's OnResolved hook receives the A/AAAA addresses so the firewall
// can open them first (otherwise the sandbox could race its own firewall).
//
// Source-IP identification relies on the network layer preventing address
// spoofing between sandboxes. A spoofed UDP query can at most make the
// victim's firewall open addresses the victim's own policy allows.
package dnsproxy

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/miekg/dns"

	"github.com/moat-sandbox/moat/internal/egress/policy"
	"github.com/moat-sandbox/moat/internal/errdefs"
)

// ErrDenied may be returned by an OnResolved hook to answer NXDOMAIN, e.g.
// when the policy changed between the check and the hook.
var ErrDenied = errors.New("dnsproxy: name denied")

// ResolvedFunc is told the addresses an allowed name resolved to, before the
// answer reaches the client. ttl is the answer's lowest TTL clamped to
// [Config.MinTTL, Config.MaxTTL]. An error fails the query (SERVFAIL, or
// NXDOMAIN for ErrDenied). It is called concurrently for different queries.
type ResolvedFunc func(ctx context.Context, name string, ips []netip.Addr, ttl time.Duration) error

// Client is one sandbox as the proxy sees it. Its policy can be swapped at
// any time; queries in flight keep the policy they started with.
type Client struct {
	// ID names the client in Config.OnDecision (set before Register).
	ID         string
	matcher    atomic.Pointer[policy.Matcher]
	onResolved ResolvedFunc
}

// NewClient returns a Client with policy m. onResolved may be nil.
func NewClient(m *policy.Matcher, onResolved ResolvedFunc) *Client {
	c := &Client{onResolved: onResolved}
	c.matcher.Store(m)
	return c
}

// SetPolicy atomically replaces the client's policy.
func (c *Client) SetPolicy(m *policy.Matcher) { c.matcher.Store(m) }

// Policy returns the client's current policy.
func (c *Client) Policy() *policy.Matcher { return c.matcher.Load() }

// Config configures a Server.
type Config struct {
	// Upstreams are the resolvers allowed names are forwarded to, as
	// "host:port", tried in order. Required.
	Upstreams []string
	// Timeout bounds one upstream exchange. Default 5s.
	Timeout time.Duration
	// MinTTL is the lowest TTL passed to OnResolved, so that a client has
	// time to connect after a short-TTL answer. Default 60s.
	MinTTL time.Duration
	// MaxTTL caps both the TTL passed to OnResolved and the TTLs in the
	// answer, so that a client never caches an address longer than the
	// firewall keeps it open. Default 1h.
	MaxTTL time.Duration
	// Logger receives per-query debug logs and errors. Default slog.Default().
	Logger *slog.Logger
	// Fallback, if set, serves queries from unregistered sources inside
	// FallbackPrefix (sandboxes without a network policy); other
	// unregistered sources are REFUSED.
	Fallback       *Client
	FallbackPrefix netip.Prefix
	// OnDecision, if set, is told of every query's verdict for a client
	// with an ID: the name, whether it is allowed and the target of the
	// rule that decided ("default"). It runs on the query's path and
	// must not block.
	OnDecision func(c *Client, name string, allowed bool, rule string)
	// Dialer, if set, dials the upstreams (e.g. with a socket mark the
	// firewall lets through); nil: a plain dialer bounded by Timeout.
	Dialer *net.Dialer
}

// Server is the DNS proxy. Create it with New, register clients, then Serve.
type Server struct {
	cfg Config
	log *slog.Logger

	mu      sync.RWMutex
	clients map[netip.Addr]*Client

	// ctx is the Serve context, used for upstream exchanges and hooks.
	ctx atomic.Pointer[context.Context]
}

// New validates cfg and returns a Server.
func New(cfg Config) (*Server, error) {
	if len(cfg.Upstreams) == 0 {
		return nil, fmt.Errorf("dnsproxy: no upstream resolvers: %w", errdefs.ErrInvalidArgument)
	}
	for _, u := range cfg.Upstreams {
		if _, _, err := net.SplitHostPort(u); err != nil {
			return nil, fmt.Errorf("dnsproxy: upstream %q: %v: %w", u, err, errdefs.ErrInvalidArgument)
		}
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = 5 * time.Second
	}
	if cfg.MinTTL <= 0 {
		cfg.MinTTL = 60 * time.Second
	}
	if cfg.MaxTTL <= 0 {
		cfg.MaxTTL = time.Hour
	}
	if cfg.MaxTTL < cfg.MinTTL {
		return nil, fmt.Errorf("dnsproxy: MaxTTL %v < MinTTL %v: %w", cfg.MaxTTL, cfg.MinTTL, errdefs.ErrInvalidArgument)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	return &Server{cfg: cfg, log: cfg.Logger, clients: map[netip.Addr]*Client{}}, nil
}

// Register makes queries from ip use c. It fails with ErrAlreadyExists if
// ip is taken.
func (s *Server) Register(ip netip.Addr, c *Client) error {
	ip = ip.Unmap()
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.clients[ip]; ok {
		return fmt.Errorf("dnsproxy: client %s: %w", ip, errdefs.ErrAlreadyExists)
	}
	s.clients[ip] = c
	return nil
}

// Unregister removes the client for ip, if any.
func (s *Server) Unregister(ip netip.Addr) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.clients, ip.Unmap())
}

func (s *Server) client(ip netip.Addr) *Client {
	s.mu.RLock()
	c := s.clients[ip.Unmap()]
	s.mu.RUnlock()
	if c == nil && s.cfg.Fallback != nil && s.cfg.FallbackPrefix.IsValid() && s.cfg.FallbackPrefix.Contains(ip.Unmap()) {
		return s.cfg.Fallback
	}
	return c
}

// Listen binds UDP and TCP on the same address. With port 0 it picks a
// port free for both.
func Listen(ctx context.Context, addr string) (net.PacketConn, net.Listener, error) {
	var lc net.ListenConfig
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, nil, fmt.Errorf("dnsproxy: listen address %q: %v: %w", addr, err, errdefs.ErrInvalidArgument)
	}
	for attempt := 0; ; attempt++ {
		pc, err := lc.ListenPacket(ctx, "udp", addr)
		if err != nil {
			return nil, nil, fmt.Errorf("dnsproxy: listen udp %s: %w", addr, err)
		}
		p := port
		if p == "0" {
			p = strconv.Itoa(pc.LocalAddr().(*net.UDPAddr).Port)
		}
		ln, err := lc.Listen(ctx, "tcp", net.JoinHostPort(host, p))
		if err == nil {
			return pc, ln, nil
		}
		pc.Close()
		if port != "0" || attempt == 10 {
			return nil, nil, fmt.Errorf("dnsproxy: listen tcp %s: %w", net.JoinHostPort(host, p), err)
		}
	}
}

// Serve answers queries on pc (UDP) and ln (TCP) until ctx is done, then
// shuts both down, waits for in-flight queries and returns nil. Either
// listener may be nil, not both. Serve closes the listeners.
func (s *Server) Serve(ctx context.Context, pc net.PacketConn, ln net.Listener) error {
	if pc == nil && ln == nil {
		return fmt.Errorf("dnsproxy: Serve without listeners: %w", errdefs.ErrInvalidArgument)
	}
	s.ctx.Store(&ctx)
	var servers []*dns.Server
	if pc != nil {
		servers = append(servers, &dns.Server{PacketConn: pc, Handler: dns.HandlerFunc(s.serveUDP)})
	}
	if ln != nil {
		servers = append(servers, &dns.Server{Listener: ln, Handler: dns.HandlerFunc(s.serveTCP),
			ReadTimeout: 10 * time.Second, WriteTimeout: 10 * time.Second})
	}
	errc := make(chan error, len(servers))
	var wg sync.WaitGroup
	for _, srv := range servers {
		started := make(chan struct{})
		srv.NotifyStartedFunc = func() { close(started) }
		wg.Add(1)
		go func() {
			defer wg.Done()
			errc <- srv.ActivateAndServe()
		}()
		// Shutdown before the server has started would be a no-op, so
		// wait until it runs (or failed to start).
		select {
		case <-started:
		case err := <-errc:
			errc <- err
		}
	}
	var serveErr error
	select {
	case <-ctx.Done():
	case serveErr = <-errc:
	}
	for _, srv := range servers {
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_ = srv.ShutdownContext(sctx) // "server not started" for the one that failed
		cancel()
	}
	wg.Wait()
	if serveErr != nil {
		return fmt.Errorf("dnsproxy: serve: %w", serveErr)
	}
	return nil
}

func (s *Server) serveUDP(w dns.ResponseWriter, r *dns.Msg) { s.serve(w, r, "udp") }
func (s *Server) serveTCP(w dns.ResponseWriter, r *dns.Msg) { s.serve(w, r, "tcp") }

func (s *Server) serve(w dns.ResponseWriter, r *dns.Msg, network string) {
	resp := s.answer(w.RemoteAddr(), r, network)
	if network == "udp" {
		resp.Truncate(udpSize(r))
	}
	if err := w.WriteMsg(resp); err != nil {
		s.log.Debug("dns write failed", "client", w.RemoteAddr(), "err", err)
	}
}

func (s *Server) answer(remote net.Addr, r *dns.Msg, network string) *dns.Msg {
	src := addrOf(remote)
	c := s.client(src)
	if c == nil {
		s.log.Debug("dns query from unknown client", "client", src)
		return reply(r, dns.RcodeRefused)
	}
	if r.Opcode != dns.OpcodeQuery || len(r.Question) != 1 {
		return reply(r, dns.RcodeFormatError)
	}
	q := r.Question[0]
	name := policy.NormalizeName(q.Name)
	action, rule := c.Policy().Decide(name)
	if s.cfg.OnDecision != nil && c.ID != "" {
		s.cfg.OnDecision(c, name, action == policy.Allow, rule)
	}
	if action != policy.Allow {
		s.log.Debug("dns query denied", "client", src, "name", name)
		return reply(r, dns.RcodeNameError)
	}
	ctx := context.Background()
	if p := s.ctx.Load(); p != nil {
		ctx = *p
	}
	resp, err := s.forward(ctx, r, network)
	if err != nil {
		s.log.Warn("dns upstream failed", "client", src, "name", name, "err", err)
		return reply(r, dns.RcodeServerFailure)
	}
	resp.Id = r.Id
	ips, ttl := s.addresses(resp)
	if len(ips) > 0 && c.onResolved != nil {
		hctx, cancel := context.WithTimeout(ctx, s.cfg.Timeout)
		err := c.onResolved(hctx, name, ips, ttl)
		cancel()
		switch {
		case errors.Is(err, ErrDenied):
			return reply(r, dns.RcodeNameError)
		case err != nil:
			s.log.Warn("dns resolved hook failed", "client", src, "name", name, "err", err)
			return reply(r, dns.RcodeServerFailure)
		}
	}
	return resp
}

// forward tries each upstream in order over the client's transport.
func (s *Server) forward(ctx context.Context, r *dns.Msg, network string) (*dns.Msg, error) {
	cl := &dns.Client{Net: network, Timeout: s.cfg.Timeout, UDPSize: uint16(udpSize(r)), Dialer: s.cfg.Dialer}
	var errs []error
	for _, up := range s.cfg.Upstreams {
		resp, _, err := cl.ExchangeContext(ctx, r.Copy(), up)
		if err == nil {
			return resp, nil
		}
		errs = append(errs, fmt.Errorf("%s: %w", up, err))
		if ctx.Err() != nil {
			break
		}
	}
	return nil, errors.Join(errs...)
}

// addresses collects the A/AAAA addresses of an answer, returns the TTL the
// firewall should keep them for, and caps the answer's TTLs at MaxTTL.
func (s *Server) addresses(resp *dns.Msg) ([]netip.Addr, time.Duration) {
	if resp.Rcode != dns.RcodeSuccess {
		return nil, 0
	}
	maxTTL := uint32(s.cfg.MaxTTL / time.Second)
	var ips []netip.Addr
	minTTL := maxTTL
	for _, rr := range resp.Answer {
		h := rr.Header()
		if h.Ttl > maxTTL {
			h.Ttl = maxTTL
		}
		var ip net.IP
		switch v := rr.(type) {
		case *dns.A:
			ip = v.A
		case *dns.AAAA:
			ip = v.AAAA
		case *dns.CNAME:
			minTTL = min(minTTL, h.Ttl)
			continue
		default:
			continue
		}
		a, ok := netip.AddrFromSlice(ip)
		if !ok {
			continue
		}
		if _, isA := rr.(*dns.A); isA {
			a = a.Unmap()
		}
		ips = append(ips, a)
		minTTL = min(minTTL, h.Ttl)
	}
	ttl := max(time.Duration(minTTL)*time.Second, s.cfg.MinTTL)
	return ips, ttl
}

func reply(r *dns.Msg, rcode int) *dns.Msg {
	m := new(dns.Msg)
	m.SetRcode(r, rcode)
	m.RecursionAvailable = true
	return m
}

func udpSize(r *dns.Msg) int {
	if o := r.IsEdns0(); o != nil && o.UDPSize() > dns.MinMsgSize {
		return int(o.UDPSize())
	}
	return dns.MinMsgSize
}

func addrOf(a net.Addr) netip.Addr {
	switch v := a.(type) {
	case *net.UDPAddr:
		return v.AddrPort().Addr().Unmap()
	case *net.TCPAddr:
		return v.AddrPort().Addr().Unmap()
	default:
		ap, err := netip.ParseAddrPort(a.String())
		if err != nil {
			return netip.Addr{}
		}
		return ap.Addr().Unmap()
	}
}

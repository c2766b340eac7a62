package mitm

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/moat-sandbox/moat/internal/egress/policy"
	"github.com/moat-sandbox/moat/internal/egress/vault"
	"github.com/moat-sandbox/moat/internal/errdefs"
	"github.com/moat-sandbox/moat/internal/web"
)

// Timeouts of the proxy.
const (
	peekTimeout   = 10 * time.Second // to read a ClientHello or request head
	dialTimeout   = 10 * time.Second
	maxHeadBytes  = 16 << 10 // plain-HTTP request head peeked for Host
	idleTimeout   = 2 * time.Minute
	headerTimeout = 30 * time.Second
)

// Config configures a Proxy.
type Config struct {
	// Logger receives connection-level events; it never receives a
	// credential value. Default slog.Default().
	Logger *slog.Logger
	// RootCAs verify upstream servers of intercepted connections; nil
	// means the host's roots.
	RootCAs *x509.CertPool
	// OriginalDst returns where a redirected connection was going.
	// Default: SO_ORIGINAL_DST (Linux conntrack).
	OriginalDst func(net.Conn) (netip.AddrPort, error)
	// DialContext dials upstream. Default: a net.Dialer with a 10 s timeout.
	DialContext func(ctx context.Context, network, addr string) (net.Conn, error)
	// OnInjected, if set, is told of every credential injected: the
	// sandbox, the binding's name and the host, never the value. It runs
	// on the request's path and must not block (the audit trail
	// aggregates).
	OnInjected func(ctx context.Context, sandboxID, binding, host string)
}

// Proxy is the transparent proxy of a host. One Proxy serves every vault
// sandbox of the host; sandboxes are told apart by source address.
type Proxy struct {
	cfg  Config
	log  *slog.Logger
	dial func(ctx context.Context, network, addr string) (net.Conn, error)

	roots atomic.Pointer[x509.CertPool] // Config.RootCAs, or SetRootCAs

	mu      sync.RWMutex
	clients map[netip.Addr]*Client

	connMu sync.Mutex
	conns  map[net.Conn]struct{}
	wg     sync.WaitGroup
}

// Client is one sandbox as the proxy sees it. Its rules can be swapped
// at any time (SetRules); the next request uses them.
type Client struct {
	id       string
	ca       *CA
	rules    atomic.Pointer[vault.Rules]
	resolved func(host string, ip netip.Addr) bool
	withheld atomic.Pointer[withheldReporter] // OnWithheld
}

// NewClient returns the client of sandbox id, whose connections are
// intercepted with ca. resolved reports whether the sandbox's DNS
// lookups returned ip for host (the enforcer records them); a credential
// goes only to such an address. nil resolved refuses every injection.
func NewClient(id string, ca *CA, resolved func(host string, ip netip.Addr) bool) *Client {
	return &Client{id: id, ca: ca, resolved: resolved}
}

// SetRules replaces the client's rules (nil: no bindings).
func (c *Client) SetRules(r *vault.Rules) { c.rules.Store(r) }

// Rules returns the rules in force.
func (c *Client) Rules() *vault.Rules { return c.rules.Load() }

// ID is the sandbox ID.
func (c *Client) ID() string { return c.id }

// New returns a Proxy; call Serve to accept connections.
func New(cfg Config) *Proxy {
	p := &Proxy{cfg: cfg, log: cfg.Logger, clients: map[netip.Addr]*Client{}, conns: map[net.Conn]struct{}{}}
	if p.log == nil {
		p.log = slog.Default()
	}
	if p.cfg.OriginalDst == nil {
		p.cfg.OriginalDst = OriginalDst
	}
	p.roots.Store(cfg.RootCAs)
	p.dial = cfg.DialContext
	if p.dial == nil {
		p.dial = (&net.Dialer{Timeout: dialTimeout}).DialContext
	}
	return p
}

// SetRootCAs replaces the roots that verify upstream servers (nil: the
// host's) for the connections made from now on.
func (p *Proxy) SetRootCAs(roots *x509.CertPool) { p.roots.Store(roots) }

// Register routes connections from ip to c.
func (p *Proxy) Register(ip netip.Addr, c *Client) error {
	ip = ip.Unmap()
	p.mu.Lock()
	defer p.mu.Unlock()
	if old, ok := p.clients[ip]; ok && old != c {
		return fmt.Errorf("mitm: address %s is taken by sandbox %q: %w", ip, old.id, errdefs.ErrAlreadyExists)
	}
	p.clients[ip] = c
	return nil
}

// Unregister stops serving ip; its open connections are left to finish.
func (p *Proxy) Unregister(ip netip.Addr) {
	p.mu.Lock()
	delete(p.clients, ip.Unmap())
	p.mu.Unlock()
}

func (p *Proxy) client(ip netip.Addr) *Client {
	p.mu.RLock()
	defer p.mu.RUnlock()
	return p.clients[ip.Unmap()]
}

// Serve accepts connections on ln until ctx is done, then closes ln and
// every connection and waits for their goroutines.
func (p *Proxy) Serve(ctx context.Context, ln net.Listener) error {
	stop := context.AfterFunc(ctx, func() { ln.Close() })
	defer stop()
	var err error
	for {
		var c net.Conn
		c, err = ln.Accept()
		if err != nil {
			break
		}
		p.track(c, true)
		p.wg.Add(1)
		go func() {
			defer p.wg.Done()
			defer p.track(c, false)
			defer c.Close()
			p.handle(ctx, c)
		}()
	}
	p.connMu.Lock()
	for c := range p.conns {
		c.Close()
	}
	p.connMu.Unlock()
	p.wg.Wait()
	if ctx.Err() != nil {
		return nil
	}
	return err
}

func (p *Proxy) track(c net.Conn, add bool) {
	p.connMu.Lock()
	defer p.connMu.Unlock()
	if add {
		p.conns[c] = struct{}{}
	} else {
		delete(p.conns, c)
	}
}

// handle serves one redirected connection.
func (p *Proxy) handle(ctx context.Context, c net.Conn) {
	src := addrPortOf(c.RemoteAddr())
	cl := p.client(src.Addr())
	if cl == nil {
		p.log.Debug("credential proxy: connection from an unknown address", "src", src)
		return
	}
	dst, err := p.cfg.OriginalDst(c)
	if err != nil || !dst.IsValid() || dst == addrPortOf(c.LocalAddr()) {
		p.log.Warn("credential proxy: no original destination", "sandbox", cl.id, "err", err)
		return
	}
	br := bufio.NewReaderSize(c, maxHeadBytes)
	_ = c.SetReadDeadline(time.Now().Add(peekTimeout))
	first, err := br.Peek(1)
	if err != nil {
		// Nothing sent (a server-speaks-first protocol, or an idle
		// client): not HTTP, tunnel it.
		_ = c.SetReadDeadline(time.Time{})
		p.tunnel(ctx, &prefixConn{Conn: c, r: br}, dst)
		return
	}
	port := int(dst.Port())
	if first[0] == 0x16 { // a TLS handshake record
		sni, hello := peekSNI(br)
		_ = c.SetReadDeadline(time.Time{})
		in := &prefixConn{Conn: c, r: io.MultiReader(bytes.NewReader(hello), br)}
		if sni == "" || !cl.Rules().Intercepts("https", sni, port) {
			p.tunnel(ctx, in, dst)
			return
		}
		p.intercept(ctx, cl, in, dst, "https", policy.NormalizeName(sni))
		return
	}
	host := peekHost(br)
	_ = c.SetReadDeadline(time.Time{})
	in := &prefixConn{Conn: c, r: br}
	if host == "" || !cl.Rules().Intercepts("http", host, port) {
		p.tunnel(ctx, in, dst)
		return
	}
	p.intercept(ctx, cl, in, dst, "http", host)
}

// tunnel copies bytes both ways between c and dst until both sides are done.
func (p *Proxy) tunnel(ctx context.Context, c net.Conn, dst netip.AddrPort) {
	up, err := p.dial(ctx, "tcp", dst.String())
	if err != nil {
		p.log.Debug("credential proxy: tunnel dial failed", "dst", dst, "err", err)
		return
	}
	defer up.Close()
	done := make(chan struct{})
	go func() {
		_, _ = io.Copy(up, c)
		closeWrite(up)
		close(done)
	}()
	_, _ = io.Copy(c, up)
	closeWrite(c)
	<-done
}

func closeWrite(c net.Conn) {
	type closeWriter interface{ CloseWrite() error }
	if pc, ok := c.(*prefixConn); ok {
		c = pc.Conn
	}
	if cw, ok := c.(closeWriter); ok {
		_ = cw.CloseWrite()
	} else {
		_ = c.Close()
	}
}

// intercept serves HTTP on c (after terminating TLS for https), forwarding
// each request to dst and injecting credentials where a binding matches.
func (p *Proxy) intercept(ctx context.Context, cl *Client, c net.Conn, dst netip.AddrPort, scheme, sni string) {
	if scheme == "https" {
		// HTTP/2 when the sandbox's client offers it (gRPC needs it end
		// to end; the upstream side negotiates on its own).
		tc := tls.Server(c, &tls.Config{
			MinVersion: tls.VersionTLS12,
			NextProtos: []string{"h2", "http/1.1"},
			GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) {
				return cl.ca.Leaf(sni)
			},
		})
		hctx, cancel := context.WithTimeout(ctx, peekTimeout)
		err := tc.HandshakeContext(hctx)
		cancel()
		if err != nil {
			p.log.Debug("credential proxy: TLS handshake with the sandbox failed", "sandbox", cl.id, "host", sni, "err", err)
			return
		}
		c = tc
	}
	fw := &forwarder{p: p, cl: cl, dst: dst, scheme: scheme, sni: sni, alpn: []string{"http/1.1"}}
	if tc, ok := c.(*tls.Conn); ok && tc.ConnectionState().NegotiatedProtocol == "h2" {
		// The upstream side mirrors the sandbox's protocol: HTTP/2 costs
		// more per request in Go's transport, so it is used only when
		// the client chose it (gRPC needs it end to end).
		fw.alpn = []string{"h2", "http/1.1"}
	}
	fw.transport = &http.Transport{
		DialContext:         fw.dialPlain,
		DialTLSContext:      fw.dialTLS,
		DisableCompression:  true, // bodies pass through as the upstream sent them
		MaxIdleConnsPerHost: 4,
		IdleConnTimeout:     idleTimeout,
		// With ForceAttemptHTTP2 the transport speaks HTTP/2 when dialTLS
		// offered it (fw.alpn) and the upstream picked it.
		ForceAttemptHTTP2: true,
	}
	defer fw.transport.CloseIdleConnections()
	rp := &httputil.ReverseProxy{
		Rewrite:        fw.rewrite,
		Transport:      refusingTransport{fw.transport},
		FlushInterval:  -1,
		ModifyResponse: fw.scrub,
		ErrorLog:       slog.NewLogLogger(p.log.Handler(), slog.LevelDebug),
		ErrorHandler:   fw.fail,
	}
	ln := newConnListener(c)
	srv := &http.Server{
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			fw.handlers.Add(1)
			defer fw.handlers.Done()
			web.ServeProxy(rp, w, r)
		}),
		ReadHeaderTimeout: headerTimeout,
		IdleTimeout:       idleTimeout,
		ErrorLog:          slog.NewLogLogger(p.log.Handler(), slog.LevelDebug),
		ConnState: func(_ net.Conn, s http.ConnState) {
			if s == http.StateClosed || s == http.StateHijacked {
				ln.Close()
			}
		},
		BaseContext: func(net.Listener) context.Context { return ctx },
	}
	_ = srv.Serve(ln)
	// Serve returns when the connection is closed or hijacked (a
	// WebSocket): wait for in-flight handlers, which own hijacked conns.
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
	defer cancel()
	_ = srv.Shutdown(sctx)
	fw.wait()
}

// forwarder is the upstream side of one intercepted connection.
type forwarder struct {
	p         *Proxy
	cl        *Client
	dst       netip.AddrPort
	scheme    string
	sni       string
	alpn      []string // offered to the upstream
	transport *http.Transport
	handlers  sync.WaitGroup
}

func (f *forwarder) wait() { f.handlers.Wait() }

// rewrite aims the request at the original destination and injects the
// matching binding's credential.
func (f *forwarder) rewrite(pr *httputil.ProxyRequest) {
	in, out := pr.In, pr.Out
	host := hostOnly(in.Host)
	out.URL.Scheme = f.scheme
	out.URL.Host = in.Host
	out.Host = in.Host
	// The upstream's own encoding passes through, except on bound hosts,
	// whose responses must be readable to be scrubbed.
	out.Header.Set("Accept-Encoding", "identity")
	if f.scheme == "https" && host != f.sni {
		// Host and SNI disagree: the TLS name was verified, not this one.
		f.p.log.Warn("credential proxy: Host header differs from the TLS server name; no credential injected",
			"sandbox", f.cl.id, "sni", f.sni, "host", host)
		return
	}
	inj := f.cl.Rules().Match(f.scheme, host, int(f.dst.Port()), in.Method, in.URL.EscapedPath())
	if inj == nil {
		return
	}
	dst := f.dst.Addr().Unmap()
	if (f.cl.resolved == nil || !f.cl.resolved(host, dst)) && !inj.Trusts(dst) {
		f.p.log.Warn("credential proxy: destination is not an address moat's DNS resolved for the host; no credential injected "+
			"(reach bound hosts by name through the sandbox's resolver, or name the address in the binding's match.trustedCidrs; see docs/COMPATIBILITY.md)",
			"sandbox", f.cl.id, "host", host, "dst", f.dst, "binding", inj.Binding)
		w := Withheld{Binding: inj.Binding, Host: host, Dst: dst}
		if report := f.cl.reportWithheld(w); report != nil {
			// Off the request's path; Serve waits for it. The handler
			// holds a count of p.wg, so Add cannot race Serve's Wait.
			ctx := context.WithoutCancel(in.Context())
			f.p.wg.Go(func() { report(ctx, w) })
		}
		return
	}
	if err := inj.Apply(out.Header, out.URL); err != nil {
		f.p.log.Warn("credential proxy: request refused", "sandbox", f.cl.id, "host", host, "binding", inj.Binding, "err", err)
		pr.Out = out.WithContext(context.WithValue(out.Context(), refusedKey{}, err))
		return
	}
	if inj.SubstitutesBody() && out.Body != nil && out.Body != http.NoBody {
		substituteBody(out, inj)
	}
	if fn := f.p.cfg.OnInjected; fn != nil {
		fn(in.Context(), f.cl.id, inj.Binding, host)
	}
	f.p.log.Debug("credential proxy: credential injected", "sandbox", f.cl.id, "host", host, "binding", inj.Binding)
}

// substituteBody replaces the binding's body placeholders in out's body
// when the whole body is at most vault.MaxSubstitutionBody; a larger one
// is forwarded unchanged (as upstream, which streams such bodies). The
// framing follows the new length.
func substituteBody(out *http.Request, inj *vault.Injection) {
	body, err := io.ReadAll(io.LimitReader(out.Body, vault.MaxSubstitutionBody+1))
	if err != nil || len(body) > vault.MaxSubstitutionBody {
		// Forward what was read and the rest; a read error surfaces
		// when the transport reads it again.
		out.Body = readCloser{io.MultiReader(bytes.NewReader(body), out.Body), out.Body}
		return
	}
	_ = out.Body.Close()
	if nb, changed := inj.SubstituteBody(out.Header.Get("Content-Type"), out.Header.Get("Content-Encoding"), body); changed {
		body = nb
	}
	out.Body = io.NopCloser(bytes.NewReader(body))
	out.ContentLength = int64(len(body))
	out.TransferEncoding = nil
	out.Header.Del("Content-Length")
	out.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(body)), nil }
}

type readCloser struct {
	io.Reader
	io.Closer
}

// refusedKey marks (in its context) a request rewrite refused: the
// transport answers it with a *refusedError instead of sending it.
type refusedKey struct{}

type refusedError struct{ err error }

func (e *refusedError) Error() string { return e.err.Error() }

// refusingTransport fails the requests rewrite refused, so that they
// never reach the upstream.
type refusingTransport struct{ http.RoundTripper }

func (t refusingTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	if err, ok := r.Context().Value(refusedKey{}).(error); ok {
		if r.Body != nil {
			_ = r.Body.Close()
		}
		return nil, &refusedError{err}
	}
	return t.RoundTripper.RoundTrip(r)
}

func (f *forwarder) dialPlain(ctx context.Context, _, _ string) (net.Conn, error) {
	return f.p.dial(ctx, "tcp", f.dst.String())
}

func (f *forwarder) dialTLS(ctx context.Context, _, _ string) (net.Conn, error) {
	raw, err := f.p.dial(ctx, "tcp", f.dst.String())
	if err != nil {
		return nil, err
	}
	tc := tls.Client(raw, &tls.Config{ServerName: f.sni, RootCAs: f.p.roots.Load(), NextProtos: f.alpn, MinVersion: tls.VersionTLS12})
	if err := tc.HandshakeContext(ctx); err != nil {
		raw.Close()
		return nil, &upstreamTLSError{host: f.sni, err: err}
	}
	return tc, nil
}

type upstreamTLSError struct {
	host string
	err  error
}

func (e *upstreamTLSError) Error() string { return "upstream TLS for " + e.host + ": " + e.err.Error() }
func (e *upstreamTLSError) Unwrap() error { return e.err }

// fail answers a request the upstream could not serve. The text names the
// host only: never a credential.
func (f *forwarder) fail(w http.ResponseWriter, r *http.Request, err error) {
	if errors.Is(err, context.Canceled) {
		return
	}
	var re *refusedError
	if errors.As(err, &re) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.WriteHeader(http.StatusForbidden)
		_, _ = io.WriteString(w, "moat credential proxy: "+re.Error()+"\n")
		return
	}
	msg := "moat credential proxy: the upstream server is unreachable"
	var te *upstreamTLSError
	if errors.As(err, &te) {
		msg = "moat credential proxy: the upstream server's certificate is not trusted for " + te.host
	}
	f.p.log.Warn("credential proxy: upstream request failed", "sandbox", f.cl.id, "host", hostOnly(r.Host), "err", err)
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.WriteHeader(http.StatusBadGateway)
	_, _ = io.WriteString(w, msg+"\n")
}

// scrub removes every credential value from a response of a bound host:
// headers now, the body as it streams (same length, so Content-Length
// stays true). Compressed bodies cannot be scrubbed; rewrite asks for
// identity encoding, which servers honour.
func (f *forwarder) scrub(resp *http.Response) error {
	secrets := f.cl.Rules().Secrets()
	if len(secrets) == 0 {
		return nil
	}
	for k, vs := range resp.Header {
		for i, v := range vs {
			resp.Header[k][i] = string(mask([]byte(v), secrets))
		}
	}
	if resp.Body != nil && resp.Body != http.NoBody {
		resp.Body = newScrubber(resp.Body, secrets)
	}
	return nil
}

// mask overwrites every occurrence of a secret in b with '*'.
func mask(b []byte, secrets []string) []byte {
	for _, s := range secrets {
		if s == "" {
			continue
		}
		for i := 0; ; {
			j := bytes.Index(b[i:], []byte(s))
			if j < 0 {
				break
			}
			for k := range len(s) {
				b[i+j+k] = '*'
			}
			i += j + len(s)
		}
	}
	return b
}

// scrubber is a streaming mask: it holds back only the tail of what it
// has read that could be the start of a secret, so streamed responses
// (SSE) are delayed by no more than that.
type scrubber struct {
	src     io.ReadCloser
	secrets []string
	buf     []byte // read, masked, not yet returned
	ready   int    // buf[:ready] may be returned
	err     error
}

func newScrubber(src io.ReadCloser, secrets []string) *scrubber {
	return &scrubber{src: src, secrets: secrets}
}

func (s *scrubber) Read(p []byte) (int, error) {
	for s.ready == 0 {
		if s.err != nil {
			if len(s.buf) > 0 { // EOF: the held-back tail is no secret
				s.ready = len(s.buf)
				break
			}
			return 0, s.err
		}
		chunk := make([]byte, 32<<10)
		n, err := s.src.Read(chunk)
		s.buf = mask(append(s.buf, chunk[:n]...), s.secrets)
		s.err = err
		s.ready = len(s.buf) - s.partial()
	}
	n := copy(p, s.buf[:s.ready])
	s.buf = s.buf[n:]
	s.ready -= n
	return n, nil
}

// partial is the length of the longest suffix of buf that is a proper
// prefix of some secret.
func (s *scrubber) partial() int {
	best := 0
	for _, sec := range s.secrets {
		for k := min(len(sec)-1, len(s.buf)); k > best; k-- {
			if bytes.HasSuffix(s.buf, []byte(sec[:k])) {
				best = k
				break
			}
		}
	}
	return best
}

func (s *scrubber) Close() error { return s.src.Close() }

// peekSNI reads a TLS ClientHello from br (without consuming what the
// upstream needs: every byte read is returned in hello for replay) and
// returns its server name, "" if there is none or it cannot be parsed.
func peekSNI(br *bufio.Reader) (sni string, hello []byte) {
	rec := &recordingReader{r: br}
	errStop := errors.New("stop")
	_ = tls.Server(readOnlyConn{r: rec}, &tls.Config{
		GetConfigForClient: func(h *tls.ClientHelloInfo) (*tls.Config, error) {
			sni = h.ServerName
			return nil, errStop
		},
	}).Handshake()
	return sni, rec.buf.Bytes()
}

// peekHost returns the Host of a plain HTTP request head waiting in br
// (nothing is consumed), "" if no head of at most maxHeadBytes arrives.
// It peeks only what has arrived, one more byte at a time, so it never
// waits for bytes the client is not going to send.
func peekHost(br *bufio.Reader) string {
	for n := max(br.Buffered(), 1); n <= br.Size(); n = br.Buffered() + 1 {
		b, err := br.Peek(n)
		if i := bytes.Index(b, []byte("\r\n\r\n")); i >= 0 {
			req, rerr := http.ReadRequest(bufio.NewReader(bytes.NewReader(b[:i+4])))
			if rerr != nil {
				return ""
			}
			return hostOnly(req.Host)
		}
		if err != nil {
			return ""
		}
	}
	return ""
}

// hostOnly strips the port and normalizes a Host header value.
func hostOnly(h string) string {
	if host, _, err := net.SplitHostPort(h); err == nil {
		h = host
	}
	return policy.NormalizeName(strings.Trim(h, "[]"))
}

func addrPortOf(a net.Addr) netip.AddrPort {
	if ta, ok := a.(*net.TCPAddr); ok {
		ap := ta.AddrPort()
		return netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())
	}
	ap, _ := netip.ParseAddrPort(a.String())
	return ap
}

// prefixConn is a connection whose first bytes come from r.
type prefixConn struct {
	net.Conn
	r io.Reader
}

func (c *prefixConn) Read(b []byte) (int, error) { return c.r.Read(b) }

// recordingReader keeps a copy of everything read through it.
type recordingReader struct {
	r   io.Reader
	buf bytes.Buffer
}

func (r *recordingReader) Read(p []byte) (int, error) {
	n, err := r.r.Read(p)
	r.buf.Write(p[:n])
	return n, err
}

// readOnlyConn feeds a TLS server the peeked bytes; what it would send
// back (an alert) is dropped.
type readOnlyConn struct{ r io.Reader }

func (c readOnlyConn) Read(p []byte) (int, error)     { return c.r.Read(p) }
func (readOnlyConn) Write(p []byte) (int, error)      { return len(p), nil }
func (readOnlyConn) Close() error                     { return nil }
func (readOnlyConn) LocalAddr() net.Addr              { return &net.TCPAddr{} }
func (readOnlyConn) RemoteAddr() net.Addr             { return &net.TCPAddr{} }
func (readOnlyConn) SetDeadline(time.Time) error      { return nil }
func (readOnlyConn) SetReadDeadline(time.Time) error  { return nil }
func (readOnlyConn) SetWriteDeadline(time.Time) error { return nil }

// connListener hands one connection to an http.Server, then blocks in
// Accept until closed.
type connListener struct {
	once sync.Once
	conn net.Conn
	ch   chan net.Conn
	done chan struct{}
}

func newConnListener(c net.Conn) *connListener {
	l := &connListener{conn: c, ch: make(chan net.Conn, 1), done: make(chan struct{})}
	l.ch <- c
	return l
}

func (l *connListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.ch:
		return c, nil
	case <-l.done:
		return nil, net.ErrClosed
	}
}

func (l *connListener) Close() error {
	l.once.Do(func() { close(l.done) })
	return nil
}

func (l *connListener) Addr() net.Addr { return l.conn.LocalAddr() }

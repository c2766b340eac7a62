//go:build linux

package sidecar

import (
	"context"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/moat-sandbox/moat/internal/atomicfile"
	"github.com/moat-sandbox/moat/internal/egress"
	"github.com/moat-sandbox/moat/internal/egress/dnsproxy"
	"github.com/moat-sandbox/moat/internal/egress/mitm"
	"github.com/moat-sandbox/moat/internal/egress/policy"
	"github.com/moat-sandbox/moat/internal/egress/vault"
	"github.com/moat-sandbox/moat/internal/errdefs"
)

// sandboxID names the one sandbox a sidecar enforces for in its enforcer.
const sandboxID = "pod"

// Run enforces the policy in the pod's network namespace and serves DNS
// and the egress API until ctx is done. The ruleset stays when it returns
// (fail closed: a sidecar that dies leaves the pod filtered).
func Run(ctx context.Context, o Options) error {
	if o.Token == "" {
		return fmt.Errorf("egress sidecar: %s is required: %w", EnvToken, errdefs.ErrInvalidArgument)
	}
	if len(o.Upstreams) == 0 {
		return fmt.Errorf("egress sidecar: no DNS upstream (%s): %w", EnvDNS, errdefs.ErrInvalidArgument)
	}
	if o.NetNS == "" {
		o.NetNS = "/proc/self/ns/net"
	}
	if !o.DNS.IsValid() {
		o.DNS = netip.AddrPortFrom(netip.MustParseAddr(DNS), 53)
	}
	if o.Listen == "" {
		o.Listen = ":" + strconv.Itoa(Port)
	}
	if o.StateDir == "" {
		o.StateDir = StateDir
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	state := filepath.Join(o.StateDir, "policy.json")
	raw := o.Policy
	if b, err := os.ReadFile(state); err == nil {
		raw = b // a restarted sidecar resumes the policy last set
	}
	p, err := policy.Parse(raw)
	if err != nil {
		return fmt.Errorf("egress sidecar: policy: %w", err)
	}
	var (
		sealer *vault.Sealer
		icpt   *podInterceptor
		pln    net.Listener
	)
	if len(o.VaultKey) > 0 {
		if sealer, err = vault.NewSealer(o.VaultKey); err != nil {
			return fmt.Errorf("egress sidecar: %w", err)
		}
		if pln, err = net.Listen("tcp", netip.AddrPortFrom(netip.MustParseAddr(DNS), ProxyPort).String()); err != nil {
			return fmt.Errorf("egress sidecar: credential proxy: %w", err)
		}
		defer pln.Close()
		icpt = &podInterceptor{proxy: mitm.New(mitm.Config{Logger: o.Logger, DialContext: markedDial}), port: ProxyPort}
	}
	cfg := egress.Config{
		DNS:       o.DNS,
		Upstreams: o.Upstreams,
		// Link-local holds cloud metadata services; the pod's own
		// loopback stays open (the output chain accepts lo).
		Blocked: []netip.Prefix{netip.MustParsePrefix("169.254.0.0/16"), netip.MustParsePrefix("fe80::/10")},
		Mark:    Mark,
		Logger:  o.Logger,
	}
	if icpt != nil {
		cfg.Interceptor, cfg.LocalProxy = icpt, ProxyPort
	}
	enf, err := egress.New(cfg)
	if err != nil {
		return err
	}
	defer enf.Close()
	if err := enf.Attach(ctx, sandboxID, o.NetNS, o.DNS.Addr(), p); err != nil {
		return err
	}
	pc, dl, err := dnsproxy.Listen(ctx, o.DNS.String())
	if err != nil {
		return fmt.Errorf("egress sidecar: %w", err)
	}
	ln, err := net.Listen("tcp", o.Listen)
	if err != nil {
		pc.Close()
		dl.Close()
		return fmt.Errorf("egress sidecar: %w", err)
	}
	svc := &persisted{Enforcer: enf, path: state, log: o.Logger}
	mux := http.NewServeMux()
	mux.Handle("/", egress.NewHandler(svc, sandboxID, egress.HandlerOptions{Token: o.Token, Logger: o.Logger}))
	vaultState := filepath.Join(o.StateDir, "vault.json")
	withheld := NewWithheldQueue()
	attach := func(ctx context.Context, ca *mitm.CA, rules *vault.Rules, roots *x509.CertPool) error {
		icpt.proxy.SetRootCAs(roots)
		return enf.AttachProxy(ctx, sandboxID, ca, rules, withheld.Report)
	}
	mux.Handle(VaultPath, VaultHandler(o.Token, sealer, attach, o.Logger, vaultState))
	mux.Handle(WithheldPath, WithheldHandler(o.Token, withheld))
	mux.HandleFunc("GET "+ProofPath, func(w http.ResponseWriter, r *http.Request) {
		if n := r.URL.Query().Get("nonce"); len(n) >= 16 && len(n) <= 128 {
			w.Header().Set(ProofHeader, Proof(o.Token, n))
		}
		w.WriteHeader(http.StatusNoContent)
	})
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	errc := make(chan error, 2)
	go func() { errc <- enf.Serve(ctx, pc, dl) }()
	go func() { errc <- srv.Serve(ln) }()
	if icpt != nil {
		go func() { errc <- icpt.proxy.Serve(ctx, pln) }()
		// A restarted sidecar resumes the vault last pushed (sealed).
		if b, err := os.ReadFile(vaultState); err == nil {
			if err := applyVault(ctx, b, sealer, attach); err != nil {
				o.Logger.Error("egress sidecar: resume the credential proxy", "err", err)
			}
		}
	}
	if o.Ready != nil {
		o.Ready()
	}
	o.Logger.Info("egress sidecar: enforcing", "mode", p.Mode(), "dns", o.DNS, "api", o.Listen)
	select {
	case <-ctx.Done():
	case err = <-errc:
	}
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
	defer cancel()
	srv.Shutdown(sctx)
	if errors.Is(err, http.ErrServerClosed) || ctx.Err() != nil {
		return nil
	}
	return err
}

// persisted is the enforcer with each change saved in the state file.
type persisted struct {
	*egress.Enforcer
	path string
	log  *slog.Logger
}

func (s *persisted) Modify(ctx context.Context, id string, fn func(policy.NetworkPolicy) (policy.NetworkPolicy, error)) (policy.NetworkPolicy, error) {
	p, err := s.Enforcer.Modify(ctx, id, fn)
	if err != nil {
		return p, err
	}
	b, err := json.Marshal(p)
	if err == nil {
		err = atomicfile.WriteFile(s.path, b, 0o600)
	}
	if err != nil {
		// In force now; a restart of the sidecar would resume the older
		// policy until the server sets it again (it does on recovery).
		s.log.Error("egress sidecar: save policy", "err", err)
	}
	return p, nil
}

package server

import (
	"cmp"
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/moat-sandbox/moat/internal/audit"
	"github.com/moat-sandbox/moat/internal/audit/trail"
	"github.com/moat-sandbox/moat/internal/buildinfo"
	"github.com/moat-sandbox/moat/internal/console"
	"github.com/moat-sandbox/moat/internal/e2b"
	"github.com/moat-sandbox/moat/internal/httpapi"
	"github.com/moat-sandbox/moat/internal/image"
	"github.com/moat-sandbox/moat/internal/ingress"
	"github.com/moat-sandbox/moat/internal/lifecycle"
	"github.com/moat-sandbox/moat/internal/lifecycle/idle"
	"github.com/moat-sandbox/moat/internal/metrics"
	"github.com/moat-sandbox/moat/internal/runtime"
	"github.com/moat-sandbox/moat/internal/sandbox"
	"github.com/moat-sandbox/moat/internal/store"
	"github.com/moat-sandbox/moat/internal/telemetry"
	"github.com/moat-sandbox/moat/internal/tenant"
	"github.com/moat-sandbox/moat/internal/web"
)

// Server is a wired moat server, ready to Serve.
type Server struct {
	cfg     Config
	log     *slog.Logger
	db      store.Store
	closeDB func() error
	images  *image.Store
	rt      runtime.Runtime
	closeRT func() error
	svc     *sandbox.Service
	api     *httpapi.Server
	handler http.Handler // the API, and the console under /console
	apiKey  string
	// tenants holds the API keys and tenants (nil when auth is off).
	tenants *tenant.Registry
	signer  *ingress.Signer // OSEP-0011 route keys of the gateway (nil: none)
	audit   *audit.Log
	// trail is the sandboxes' audit trails (nil: off); hooks feed it
	// from the egress layer.
	trail *trail.Store
	hooks *auditHooks
	// otel exports traces, audit records and metrics over OTLP (nil:
	// no OTEL_EXPORTER_OTLP_* endpoint configured).
	otel *telemetry.Telemetry
	// runCtx lives until Close: background services of the backend.
	runCtx  context.Context
	stopRun context.CancelFunc
	// tenantsFile is Config.TenantsFile as last read (nil: none); bg
	// counts the goroutines Close waits for.
	tenantsFile *tenantsFile
	bg          sync.WaitGroup
}

// NewLogger returns the server's structured logger at cfg.LogLevel.
func NewLogger(level string) *slog.Logger {
	var l slog.Level
	l.UnmarshalText([]byte(level))
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: l}))
}

// New opens the stores, builds the runtime and recovers the sandboxes of
// an earlier process. cfg must have been validated.
func New(ctx context.Context, cfg Config, log *slog.Logger) (_ *Server, err error) {
	if log == nil {
		log = NewLogger(cfg.LogLevel)
	}
	s := &Server{cfg: cfg, log: log, hooks: &auditHooks{}}
	defer func() {
		if err != nil {
			s.Close()
		}
	}()
	be, err := s.openBackend(ctx)
	if err != nil {
		return nil, err
	}
	if err := s.setAPIKey(ctx, be); err != nil {
		return nil, err
	}
	// GET /metrics (behind the API key); moat_sandboxes is counted at
	// scrape time, when s.svc is set.
	reg := metrics.New(metrics.Options{States: func() map[string]int { return stateCounts(s.svc) }, KnownStates: knownStates()})
	sealer, err := cfg.vaultSealer()
	if err != nil {
		return nil, fmt.Errorf("vault key: %w", err)
	}
	quotas, err := s.openTenants(ctx, be)
	if err != nil {
		return nil, err
	}
	s.svc, err = sandbox.New(sandbox.Config{Config: lifecycle.Config{MaxTimeout: cfg.MaxTimeout, SecureAccess: cfg.IngressListen != "",
		OrphanGrace: cfg.Kubernetes.OrphanGrace}, AllowedHostPaths: cfg.AllowedHostPaths}, sandbox.Deps{Deps: lifecycle.Deps{
		Store: s.db, Events: be.events, Leader: be.leader, Runtime: s.rt, Images: imagesFor(be, s.images), Egress: be.egress, Log: log,
		Metrics: reg, Quotas: quotas, Guardrails: s.guardrails()}, Committer: be.committer, Sealer: sealer,
	})
	if err != nil {
		return nil, err
	}
	if err := s.svc.Recover(ctx); err != nil {
		return nil, fmt.Errorf("recover: %w", err)
	}
	keys, err := s.routeKeysOf(ctx, be)
	if err != nil {
		return nil, fmt.Errorf("route keys: %w", err)
	}
	if s.otel, err = telemetry.New(ctx, telemetry.Options{Version: buildinfo.Read().Version, Gatherer: reg.Gatherer(), Getenv: os.Getenv, Log: log}); err != nil {
		return nil, fmt.Errorf("opentelemetry: %w", err)
	}
	if s.otel != nil {
		log.Info("exporting OpenTelemetry traces, audit records and metrics over OTLP")
	}
	if err := s.buildAPI(reg, keys); err != nil {
		return nil, err
	}
	return s, nil
}

// openBackend opens the image store, the runtime backend and the
// records: the backend's store (shared by replicas), else this server's
// own bbolt file.
func (s *Server) openBackend(ctx context.Context) (backend, error) {
	cfg := s.cfg
	if err := os.MkdirAll(cfg.Root, 0o711); err != nil {
		return backend{}, err
	}
	var err error
	if s.images, err = image.Open(ctx, filepath.Join(cfg.Root, "images"), image.WithAllowedRegistries(cfg.AllowedRegistries)); err != nil {
		return backend{}, fmt.Errorf("image store: %w", err)
	}
	factory, ok := backends()[cfg.Runtime]
	if !ok {
		return backend{}, fmt.Errorf("runtime %q is not available on this platform", cfg.Runtime)
	}
	s.runCtx, s.stopRun = context.WithCancel(context.WithoutCancel(ctx))
	d := deps{log: s.log, images: s.images, audit: s.hooks, quota: s.quotaOf}
	if cfg.TenantsFile != "" {
		s.tenantsFile = newTenantsFile(cfg.TenantsFile, cfg.fileTenants)
		d.named = s.tenantsFile.lookup
	}
	be, err := factory(ctx, s.runCtx, cfg, d)
	if err != nil {
		return backend{}, fmt.Errorf("runtime %s: %w", cfg.Runtime, err)
	}
	s.rt, s.closeRT = be.rt, be.close
	if be.store != nil {
		s.db = be.store
		return be, nil
	}
	db, err := store.Open(ctx, filepath.Join(cfg.Root, "state.db"), 5*time.Second)
	if err != nil {
		return backend{}, err
	}
	s.db, s.closeDB = db, db.Close
	return be, nil
}

// setAPIKey resolves the API key (see apiKeyOf) and says where it is.
func (s *Server) setAPIKey(ctx context.Context, be backend) error {
	key, generated, err := s.apiKeyOf(ctx, be)
	if err != nil {
		return fmt.Errorf("api key: %w", err)
	}
	s.apiKey = key
	switch {
	case s.cfg.NoAuth:
		s.log.Warn("API-key authentication is DISABLED (--insecure-no-auth)")
	case generated:
		s.log.Info("generated an API key", "file", s.cfg.APIKeyFile)
	}
	return nil
}

// openTenants opens the tenants, API keys and quotas; without auth there
// are none (one anonymous admin) and the quotas are nil.
func (s *Server) openTenants(ctx context.Context, be backend) (lifecycle.Quotas, error) {
	if s.cfg.NoAuth {
		return nil, nil
	}
	secret, err := s.keySecretOf(ctx, be)
	if err != nil {
		return nil, fmt.Errorf("key secret: %w", err)
	}
	if s.tenants, err = tenant.Open(s.db, tenant.Options{RootKey: s.apiKey, Secret: secret, FileTenants: s.cfg.fileTenants}); err != nil {
		return nil, err
	}
	if s.tenantsFile != nil {
		s.bg.Go(func() { s.watchTenantsFile(s.runCtx, s.tenantsFile, cmp.Or(s.cfg.TenantsReload, defaultTenantsReload)) })
	}
	return s.tenants, nil
}

// quotaOf is tenant t's quota (none before the tenants are open, or
// without auth).
func (s *Server) quotaOf(t string) tenant.Quota {
	if s.tenants == nil {
		return tenant.Quota{}
	}
	return s.tenants.Quota(t)
}

// guardrails are the tenants' egress guardrails (none without auth).
func (s *Server) guardrails() lifecycle.Guardrails {
	if s.tenants == nil {
		return nil
	}
	return s.tenants
}

// buildAPI builds the HTTP API over s.svc, with ingress signing, the
// audit log and the console's sessions as configured.
func (s *Server) buildAPI(reg *metrics.Registry, routeKeys string) error {
	cfg := s.cfg
	apiCfg := httpapi.Config{PublicAddress: cfg.PublicAddress, Metrics: reg, InsecureVaultWrites: cfg.VaultInsecureWrites,
		Faces:      []httpapi.Face{e2b.New(e2b.Config{Domain: cfg.E2BDomain}, s.svc, s.log).Face()},
		EdgeDomain: cfg.E2BDomain}
	if s.tenants != nil {
		apiCfg.Auth = s.tenants
	}
	var err error
	if s.signer, apiCfg.Ingress, apiCfg.Signed, err = ingressSetup(cfg, routeKeys); err != nil {
		return err
	}
	if cfg.AuditLog != "" && cfg.AuditLog != "off" {
		if s.audit, err = audit.Open(cfg.AuditLog, audit.Options{}); err != nil {
			return err
		}
		apiCfg.Audit = s.audit
	}
	var export func(trail.Record)
	if s.otel != nil {
		export = s.otel.Record
		apiCfg.Tracing = s.otel
	}
	if s.trail, err = s.openTrail(export); err != nil {
		return err
	}
	if s.trail != nil {
		apiCfg.Trail = s.trail
		s.hooks.store.Store(s.trail)
	}
	var sessions *console.Sessions
	if cfg.Console {
		// The console's sessions are the API's second credential source.
		opt := console.SessionOptions{}
		if s.tenants != nil {
			opt.Keys = s.tenants
		}
		sessions = console.NewSessions(opt)
		apiCfg.Sessions = sessions
	}
	s.api = httpapi.New(apiCfg, s.svc, s.log)
	h := s.api.Handler()
	if cfg.IngressListen == "" {
		// Signed endpoints without a gateway of its own: a signed-only
		// one on the API listener (the signature is the credential, as
		// on the gateway).
		gw := ingress.New(ingress.Config{Signer: s.signer, Credentials: s.api, SignedOnly: true}, ingressResolver{s.svc}, s.log)
		mux := http.NewServeMux()
		mux.Handle(MountPrefix+"/", http.StripPrefix(MountPrefix, gw))
		mux.Handle("/", h)
		h = mux
	}
	s.handler, err = s.withConsole(h, sessions)
	return err
}

// routeKeysOf resolves the OSEP-0011 route-signing keys: the configured
// ones, else the server's own, made once and kept like the key secret (a
// file under the root, or a Secret the kubernetes replicas share), so
// that signed endpoints work without configuration and survive restarts.
func (s *Server) routeKeysOf(ctx context.Context, be backend) (string, error) {
	if s.cfg.IngressSecureAccessKeys != "" {
		return s.cfg.IngressSecureAccessKeys, nil
	}
	var sec []byte
	var err error
	if be.shared != nil {
		var raw []byte
		raw, err = be.shared(ctx, "route-key", func() []byte {
			b := make([]byte, routeKeyLen)
			rand.Read(b)
			return []byte(hex.EncodeToString(b))
		})
		if err == nil {
			sec, err = hex.DecodeString(string(raw))
		}
	} else {
		sec, err = loadOrCreateSecret(filepath.Join(s.cfg.Root, "route-key"), routeKeyLen)
	}
	if err != nil {
		return "", err
	}
	return "m=" + base64.StdEncoding.EncodeToString(sec), nil
}

// routeKeyLen is the size of the server's own route-signing key.
const routeKeyLen = 32

// apiKeyOf resolves the server's API key: the flag, else the key file;
// without either, a backend whose replicas share secrets (kubernetes)
// gives one every replica agrees on, and other servers make the file.
func (s *Server) apiKeyOf(ctx context.Context, be backend) (string, bool, error) {
	cfg := s.cfg
	if be.shared == nil || cfg.NoAuth || cfg.APIKey != "" || fileExists(cfg.APIKeyFile) {
		return cfg.resolveAPIKey()
	}
	k, err := be.shared(ctx, "api-key", func() []byte {
		var r [24]byte
		rand.Read(r[:])
		return []byte(hex.EncodeToString(r[:]))
	})
	if err != nil {
		return "", false, err
	}
	s.log.Info("using the API key shared by the replicas (Secret " + sharedSecretHint + ")")
	return string(k), false, nil
}

// keySecretOf resolves the secret API keys are hashed with: the file,
// else (kubernetes) one shared by the replicas, else a new file.
func (s *Server) keySecretOf(ctx context.Context, be backend) ([]byte, error) {
	cfg := s.cfg
	if be.shared == nil || fileExists(cfg.KeySecretFile) {
		return cfg.loadKeySecret()
	}
	raw, err := be.shared(ctx, "key-secret", func() []byte {
		sec := make([]byte, tenant.SecretLen)
		rand.Read(sec)
		return []byte(hex.EncodeToString(sec))
	})
	if err != nil {
		return nil, err
	}
	return hex.DecodeString(string(raw))
}

// sharedSecretHint names where the kubernetes backend keeps shared secrets.
const sharedSecretHint = "moat-<scope>-shared"

func fileExists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}

// withConsole mounts the web console (internal/console) at /console in
// front of the API handler, unless it is disabled.
func (s *Server) withConsole(api http.Handler, sessions *console.Sessions) (http.Handler, error) {
	if sessions == nil {
		return api, nil
	}
	opt := console.Options{API: api, Sessions: sessions, SecureCookie: s.cfg.ConsoleSecureCookie, Log: s.log}
	if s.audit != nil {
		opt.Audit = s.audit
	}
	c, err := console.New(opt)
	if err != nil {
		return nil, err
	}
	if !c.Built() {
		s.log.Warn("this binary was built without the web console app; /console explains how to build it (make build)")
	}
	mux := http.NewServeMux()
	mux.Handle(console.Prefix, web.WithRequestID(c))
	mux.Handle(console.Prefix+"/", web.WithRequestID(c))
	mux.Handle("/", api)
	return mux, nil
}

// stateCounts counts the API-visible sandboxes of svc by state.
func stateCounts(svc *sandbox.Service) map[string]int {
	out := map[string]int{}
	if svc == nil {
		return out
	}
	items, _ := svc.List(context.Background(), lifecycle.ListFilter{}, 1, math.MaxInt32)
	for _, sb := range items {
		out[string(sb.Status.State)]++
	}
	return out
}

func knownStates() []string {
	out := make([]string, 0, len(lifecycle.AllStates))
	for _, st := range lifecycle.AllStates {
		out = append(out, string(st))
	}
	return out
}

// Handler is the root HTTP handler.
func (s *Server) Handler() http.Handler { return s.handler }

// Serve runs the reaper and serves the API on ln until ctx ends, then shuts
// down gracefully. Sandboxes keep running: a later server re-adopts them.
func (s *Server) Serve(ctx context.Context, ln net.Listener) error {
	hs := web.NewServer(ln.Addr().String(), s.Handler(), s.log)
	rctx, stopReaper := context.WithCancel(ctx)
	defer stopReaper()
	go s.svc.Run(rctx)
	if s.trail != nil {
		go s.trail.Run(rctx, trailInterval)
	}
	if budget, _ := s.cfg.imageBudgetBytes(); budget > 0 {
		go s.imageGC(rctx, budget, time.Minute)
	}
	errc := make(chan error, 3)
	if s.cfg.TLSCert != "" {
		cert, err := web.LoadCertificate(s.cfg.TLSCert, s.cfg.TLSKey)
		if err != nil {
			ln.Close()
			return err
		}
		tln := ln
		if s.cfg.TLSListen != "" {
			var lc net.ListenConfig
			if tln, err = lc.Listen(ctx, "tcp", s.cfg.TLSListen); err != nil {
				ln.Close()
				return fmt.Errorf("tls listen: %w", err)
			}
			go func() { errc <- web.ServeUntil(rctx, hs, ln) }()
			hs = web.NewServer(tln.Addr().String(), s.Handler(), s.log)
		}
		// HTTP/2 by ALPN: Serve sets up h2 for a TLS listener that offers it.
		tln = tls.NewListener(tln, cert.TLSConfig())
		go func() { errc <- web.ServeUntil(rctx, hs, tln) }()
		s.log.Info("moat serving TLS", "addr", tln.Addr().String(), "cert", s.cfg.TLSCert)
	} else {
		go func() { errc <- web.ServeUntil(rctx, hs, ln) }()
	}
	if s.cfg.IngressListen != "" {
		gw := ingress.New(ingress.Config{Domain: s.cfg.IngressDomain, Signer: s.signer, Credentials: s.api}, ingressResolver{s.svc}, s.log)
		s.svc.OnHibernationWake(func(string) { gw.CloseIdleConnections() })
		go func() {
			if err := gw.Serve(rctx, s.cfg.IngressListen); err != nil && !errors.Is(err, http.ErrServerClosed) {
				errc <- fmt.Errorf("ingress: %w", err)
			}
		}()
		s.log.Info("ingress gateway serving", "addr", s.cfg.IngressListen, "domain", s.cfg.IngressDomain)
	}
	s.log.Info("moat serving", "addr", ln.Addr().String(), "runtime", s.rt.Name(), "classes", s.rt.Capabilities().Classes)
	// The first to end (the API server when ctx ends, or a failing
	// listener) decides; rctx then stops the other.
	err := <-errc
	stopReaper()
	return err
}

func imagesFor(be backend, st *image.Store) lifecycle.Images {
	if be.images != nil {
		return be.images
	}
	return st
}

// ingressResolver resolves ingress routes through the lifecycle. It never
// hands out the agent token: only the sandbox's own access token is checked.
type ingressResolver struct{ svc *sandbox.Service }

func (r ingressResolver) Resolve(ctx context.Context, id string, port int) (ingress.Target, error) {
	ep, err := r.svc.Endpoint(ctx, id, port)
	if err != nil {
		return ingress.Target{}, err
	}
	return ingress.Target{Addr: ep.Address, AccessToken: ep.AccessToken}, nil
}

// Wake wakes an idle-paused sandbox before the gateway proxies to it.
func (r ingressResolver) Wake(ctx context.Context, id string) (func(), error) {
	return r.svc.Access(ctx, id, idle.ViaIngress)
}

func (r ingressResolver) Touch(ctx context.Context, id string) {
	go r.svc.Touch(context.WithoutCancel(ctx), id) // must not block the request
}

// Close releases the stores and the runtime (it does not stop sandboxes).
func (s *Server) Close() {
	if s.svc != nil {
		s.svc.Close()
	}
	if s.stopRun != nil {
		s.stopRun()
	}
	s.bg.Wait()
	if s.closeRT != nil {
		s.closeRT()
	}
	if s.images != nil {
		s.images.Close()
	}
	if s.closeDB != nil {
		s.closeDB()
	}
	if s.audit != nil {
		s.audit.Close()
	}
	if s.otel != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		s.otel.Shutdown(ctx)
		cancel()
	}
}

// Run is `moat serve`: check the host (preflight), New, listen on
// cfg.Listen, Serve until ctx ends.
func Run(ctx context.Context, cfg Config, log *slog.Logger) error {
	if log == nil {
		log = NewLogger(cfg.LogLevel)
	}
	if err := checkHost(ctx, cfg, Host(cfg), log); err != nil {
		return err
	}
	s, err := New(ctx, cfg, log)
	if err != nil {
		return err
	}
	defer s.Close()
	ln, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return err
	}
	return s.Serve(ctx, ln)
}

// imageGC prunes the image store down to budget bytes every interval
// until ctx ends: images no sandbox runs (their layers are leased per
// sandbox, see ociImages) and no snapshot owns, least recently used first.
func (s *Server) imageGC(ctx context.Context, budget int64, interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		res, err := s.images.Prune(ctx, image.PruneOptions{Budget: budget})
		switch {
		case err != nil && ctx.Err() == nil:
			s.log.Error("image gc", "err", err)
		case len(res.Removed) > 0:
			names := make([]string, len(res.Removed))
			for i, img := range res.Removed {
				names[i] = img.Name
			}
			s.log.Info("image gc: pruned unused images over the disk budget", "removed", names, "size", res.Size, "budget", budget)
		case res.Size > budget:
			s.log.Warn("image gc: the images in use exceed the disk budget", "size", res.Size, "budget", budget)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

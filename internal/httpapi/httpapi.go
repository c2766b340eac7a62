// Package httpapi serves the OpenSandbox Lifecycle API over HTTP: a thin
// adapter over the lifecycle service. Every route is mounted at / and at
// /v1, as the upstream server does. Errors are written once, by web.Adapter,
// as {code, message}.
package httpapi

import (
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"math"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/moat-sandbox/moat/internal/egress"
	"github.com/moat-sandbox/moat/internal/errdefs"
	"github.com/moat-sandbox/moat/internal/idempotency"
	"github.com/moat-sandbox/moat/internal/image"
	"github.com/moat-sandbox/moat/internal/ingress"
	"github.com/moat-sandbox/moat/internal/lifecycle"
	"github.com/moat-sandbox/moat/internal/lifecycle/idle"
	"github.com/moat-sandbox/moat/internal/runtime"
	"github.com/moat-sandbox/moat/internal/sandbox"
	"github.com/moat-sandbox/moat/internal/tenant"
	"github.com/moat-sandbox/moat/internal/web"
)

// Config configures the API.
type Config struct {
	// Auth holds the API keys and tenants. Nil with APIKey set: a
	// registry holding only that key (an admin of the default tenant).
	// Nil without APIKey: authentication is off and every request acts
	// as tenant.Anonymous.
	Auth *tenant.Registry
	// APIKey is the server's single key, for servers and tests without a
	// registry (see Auth).
	APIKey string
	// Sessions, if set, is a second credential source (the web console),
	// asked when a request carries no API key.
	Sessions SessionResolver
	// Extra routes are mounted at their own patterns (not under /v1),
	// behind the same authentication, role check and audit.
	Extra []ExtraRoute
	// PublicAddress is the host[:port] clients use to reach this server; it
	// is used for server-proxy endpoints. Empty means the request's Host.
	PublicAddress string
	// Metrics, if set, is served at GET /metrics (admin keys only: it
	// counts every tenant's sandboxes) and counts every request.
	Metrics Metrics
	// Ingress, if set, makes GET .../endpoints/{port} answer the ingress
	// gateway's address for the port (upstream's gateway mode) instead of
	// the sandbox's own.
	Ingress *ingress.Endpoints
	// Signed, if set with a Signer, answers signed endpoints (?expires=,
	// OSEP-0011) in its shape. Default: Ingress; without either, signed
	// endpoints are unsupported.
	Signed *ingress.Endpoints
	// Audit, if set, receives one record per mutating call (see audited).
	Audit AuditSink
	// Trail, if set, keeps each sandbox's audit trail (lifecycle calls,
	// commands, terminal sessions and file operations through the proxy)
	// and serves it at GET /sandboxes/{id}/audit.
	Trail AuditTrail
	// Tracing, if set, starts a span per request (internal/telemetry);
	// the audit trail's records carry its trace id.
	Tracing Tracing
	// InsecureVaultWrites allows Credential Vault writes (they carry
	// credential values) over plain HTTP from non-loopback clients.
	InsecureVaultWrites bool
	// Faces are other APIs served on the same listener (E2B's control
	// plane, internal/e2b); see Face.
	Faces []Face
	// EdgeDomain is the domain of E2B's <port>-<id>.<domain> sandbox
	// hosts ("": only the E2b-Sandbox-* headers route to sandboxes).
	EdgeDomain string
}

// Face is another API on the API server's listener. A request it Claims
// is routed by its own routes (full ServeMux patterns, with the access
// each needs), behind the same authentication, role check, audit and
// metrics as the Lifecycle API's; every error of such a request, the
// auth middleware's included, is written by Errors in the face's own
// envelope. Its routes should include a catch-all ("/") for its 404s.
type Face struct {
	// Name prefixes the face's route names in metrics and audit records.
	Name   string
	Claims func(*http.Request) bool
	Routes []ExtraRoute
	Errors *web.Adapter
}

// Tracing is the optional OpenTelemetry instrumentation (internal/telemetry).
type Tracing interface {
	// Middleware serves next in a span per request, named by route.
	Middleware(route func(*http.Request) string, next http.Handler) http.Handler
}

// Metrics is the optional Prometheus instrumentation (internal/metrics).
type Metrics interface {
	// Handler serves the exposition format.
	Handler() http.Handler
	// Instrument counts the requests next serves by route (the name route
	// returns for a request) and status code.
	Instrument(route func(*http.Request) string, next http.Handler) http.Handler
}

// Server is the Lifecycle API handler set.
type Server struct {
	cfg   Config
	svc   *sandbox.Service
	log   *slog.Logger
	web   *web.Adapter
	proxy *proxy
	auth  *tenant.Registry // nil: authentication off
	// idem keeps the answers of requests with an Idempotency-Key.
	idem *idempotency.Keys
}

// New returns the API server.
func New(cfg Config, svc *sandbox.Service, log *slog.Logger) *Server {
	if cfg.Signed == nil {
		cfg.Signed = cfg.Ingress
	}
	s := &Server{cfg: cfg, svc: svc, log: log, auth: cfg.Auth}
	if s.auth == nil && cfg.APIKey != "" {
		reg, err := tenant.Open(nil, tenant.Options{RootKey: cfg.APIKey})
		if err != nil {
			panic(err) // memory-only registries cannot fail to open
		}
		s.auth = reg
	}
	s.web = &web.Adapter{Log: log, Codes: codeOf}
	if svc != nil {
		s.idem = idempotency.New(svc.Deps().Store, svc.Now, idempotency.DefaultTTL, log)
	}
	s.proxy = newProxy(svc, s.web, log)
	s.proxy.egress = s.egressHandler
	if cfg.Trail != nil {
		s.proxy.trail = &agentTrail{tr: cfg.Trail, s: s, log: log}
	}
	return s
}

// reasons are the domain errors that have their own Lifecycle API code;
// every other error is answered by its class. Backends and the image
// store return classes (and these reasons) only: the wire codes live here.
var reasons = []struct {
	err  error
	code string
}{
	{image.ErrInvalidReference, "IMAGE::INVALID_REFERENCE"},
	{image.ErrUnknownImage, "IMAGE::NOT_FOUND"},
	{image.ErrRegistryNotAllowed, "IMAGE::REGISTRY_NOT_ALLOWED"},
	{image.ErrPull, "IMAGE::PULL_FAILED"},
	{runtime.ErrCheckpointMissing, "SNAPSHOT::IMAGE_MISSING"},
	{runtime.ErrSubPathUnsupported, "VOLUME::PVC_SUBPATH_UNSUPPORTED_DRIVER"},
	{runtime.ErrTenantNamespaceMissing, "TENANT::NAMESPACE_NOT_FOUND"},
}

// codeOf maps error classes (and reasons) to Lifecycle API codes.
func codeOf(err error) (int, string) {
	status, code := web.StatusOf(err)
	for _, r := range reasons {
		if errors.Is(err, r.err) {
			return status, r.code
		}
	}
	switch {
	case errors.Is(err, errdefs.ErrUnauthenticated):
		code = "INVALID_API_KEY"
	case errors.Is(err, errdefs.ErrNotImplemented):
		code = "SANDBOX::API_NOT_SUPPORTED"
	case status == http.StatusInternalServerError:
		code = "SANDBOX::UNKNOWN_ERROR"
	default:
		code = "SANDBOX::" + code
	}
	return status, code
}

// routes is the route table: every route with the access it needs (see
// tenant.Access). Each is served at / and at /v1. A route added here is
// covered by the isolation tests, which iterate Routes.
func (s *Server) routes() []route {
	h := s.web.Handle
	// idem makes a route honour Idempotency-Key (every route that makes
	// or changes something a retry must not make twice).
	idem := func(next http.Handler) http.Handler {
		if s.idem == nil {
			return next
		}
		return s.idem.Wrap(next, func(r *http.Request) string { return lifecycle.OwnerOf(r.Context()) }, s.web.WriteError)
	}
	const (
		public = tenant.AccessPublic
		data   = tenant.AccessData
		read   = tenant.AccessRead
		write  = tenant.AccessWrite
	)
	rts := []route{
		{"GET /health", public, h(s.health)},
		{"POST /metrics/events", read, h(s.metricsEvent)},
		{"POST /sandboxes", write, idem(h(s.create))},
		{"GET /sandboxes", read, h(s.list)},
		{"GET /sandboxes/{id}", read, h(s.get)},
		{"DELETE /sandboxes/{id}", write, h(s.delete)},
		{"POST /sandboxes/{id}/pause", write, idem(h(s.pause))},
		{"POST /sandboxes/{id}/resume", write, h(s.resume)},
		{"POST /sandboxes/{id}/renew-expiration", write, h(s.renew)},
		{"PATCH /sandboxes/{id}/metadata", write, h(s.patchMetadata)},
		{"GET /sandboxes/{id}/endpoints/{port}", read, h(s.endpoint)},
		{"POST /sandboxes/batch", write, idem(h(s.createBatch))},
		{"POST /sandboxes/{id}/snapshots", write, idem(h(s.createSnapshot))},
		{"POST /sandboxes/{id}/fork", write, idem(h(s.forkSandbox))},
		{"GET /operations/{operationId}", read, h(s.getOperation)},
		{"GET /snapshots", read, h(s.listSnapshots)},
		{"GET /snapshots/{snapshotId}", read, h(s.getSnapshot)},
		{"DELETE /snapshots/{snapshotId}", write, h(s.deleteSnapshot)},
		{"POST /pools", write, h(s.createPool)},
		{"GET /pools", read, h(s.listPools)},
		{"GET /pools/{name}", read, h(s.getPool)},
		{"PUT /pools/{name}", write, h(s.updatePool)},
		{"DELETE /pools/{name}", write, h(s.deletePool)},
		{"POST /templates", write, h(s.createTemplate)},
		{"GET /templates", read, h(s.listTemplates)},
		{"GET /templates/{templateId}", read, h(s.getTemplate)},
		{"DELETE /templates/{templateId}", write, h(s.deleteTemplate)},
		{"GET /volumes", read, h(s.listVolumes)},
		{"GET /volumes/{name}", read, h(s.getVolume)},
		{"DELETE /volumes/{name}", write, h(s.deleteVolume)},
		{"GET /sandboxes/{id}/diagnostics/logs", read, h(s.diagnosticLogs)},
		{"GET /sandboxes/{id}/diagnostics/events", read, h(s.diagnosticEvents)},
		{"GET /sandboxes/{id}/diagnostics/inspect", read, h(s.diagnosticInspect)},
		{"GET /sandboxes/{id}/diagnostics/summary", read, h(s.diagnosticSummary)},
		{"GET /sandboxes/{id}/audit", read, h(s.auditTrail)},
		// The egress API and the server proxy are the data plane: the
		// sandbox's own tokens protect them (as upstream); a moat
		// credential, when presented, scopes them.
		{"/sandboxes/{id}/egress/{path...}", data, h(s.egress)},
		{"/sandboxes/{id}/proxy/{port}", data, s.proxy},
		{"/sandboxes/{id}/proxy/{port}/{path...}", data, s.proxy},
	}
	return append(rts, s.accessRoutes()...)
}

// Handler returns the root handler with request IDs, panic recovery and auth.
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	access := map[string]tenant.Access{}
	for _, p := range []string{"", "/v1"} {
		for _, rt := range s.routes() {
			pattern := rt.pattern
			if m, path, ok := strings.Cut(pattern, " "); ok {
				pattern = m + " " + p + path
			} else {
				pattern = p + pattern
			}
			mux.Handle(pattern, rt.h)
			access[pattern] = rt.access
		}
	}
	for _, rt := range s.extraRoutes() {
		mux.Handle(rt.pattern, rt.h)
		access[rt.pattern] = rt.access
	}
	if m := s.cfg.Metrics; m != nil {
		mux.Handle("GET /metrics", m.Handler())
		access["GET /metrics"] = tenant.AccessPlatform // every tenant's counts
	}
	routed := web.NotFoundJSON(mux, "SANDBOX::NOT_FOUND", "SANDBOX::METHOD_NOT_ALLOWED")
	api := s.authenticate(mux, access, routed, s.web)
	type face struct {
		Face
		mux *http.ServeMux
		h   http.Handler
	}
	faces := make([]face, 0, len(s.cfg.Faces))
	for _, f := range s.cfg.Faces {
		fmux, facc := http.NewServeMux(), map[string]tenant.Access{}
		for _, rt := range f.Routes {
			fmux.Handle(rt.Pattern, rt.Handler)
			facc[rt.Pattern] = rt.Access
		}
		faces = append(faces, face{Face: f, mux: fmux, h: s.authenticate(fmux, facc, fmux, f.Errors)})
	}
	claimed := func(r *http.Request) *face {
		for i := range faces {
			if faces[i].Claims(r) {
				return &faces[i]
			}
		}
		return nil
	}
	root := web.Recover(s.log, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if t, ok, err := edgeOf(r, s.cfg.EdgeDomain); ok {
			s.serveEdge(w, r, t, err)
			return
		}
		if f := claimed(r); f != nil {
			f.h.ServeHTTP(w, r)
			return
		}
		api.ServeHTTP(w, r)
	}))
	route := func(r *http.Request) string {
		if _, ok, _ := edgeOf(r, s.cfg.EdgeDomain); ok {
			return "e2b edge"
		}
		if f := claimed(r); f != nil {
			_, p := f.mux.Handler(r)
			return f.Name + " " + p
		}
		_, p := mux.Handler(r)
		return p
	}
	if m := s.cfg.Metrics; m != nil {
		// Routes are ServeMux patterns (bounded), looked up before auth so
		// that 401s count against the route they were for.
		root = m.Instrument(route, root)
	}
	if tr := s.cfg.Trail; tr != nil {
		root = s.withTrail(tr, root)
	}
	if a := s.cfg.Audit; a != nil {
		root = s.withAudit(a, route, root)
	}
	if t := s.cfg.Tracing; t != nil {
		root = t.Middleware(route, root)
	}
	return web.WithRequestID(root)
}

func (s *Server) health(w http.ResponseWriter, r *http.Request) error {
	web.WriteJSON(w, http.StatusOK, map[string]string{"status": "healthy"})
	return nil
}

func (s *Server) create(w http.ResponseWriter, r *http.Request) error {
	var body createSandboxRequest
	if err := web.DecodeJSON(r, &body, false); err != nil {
		return err
	}
	req, err := s.createRequest(r, body)
	if err != nil {
		return err
	}
	sb, err := s.svc.Create(r.Context(), req)
	if err != nil {
		return err
	}
	w.Header().Set("Location", "/v1/sandboxes/"+sb.ID)
	web.WriteJSON(w, http.StatusAccepted, createResponse(sb))
	return nil
}

func createResponse(sb lifecycle.Sandbox) createSandboxResponse {
	resp := createSandboxResponse{
		ID: sb.ID, Status: statusJSON(sb.Status), Metadata: sb.Metadata, Platform: sb.Platform,
		CreatedAt: ts(sb.CreatedAt), Entrypoint: sb.Entrypoint,
	}
	if resp.Metadata == nil {
		resp.Metadata = map[string]string{}
	}
	if resp.Entrypoint == nil {
		resp.Entrypoint = []string{} // the wire never carries null
	}
	if sb.ExpiresAt != nil {
		resp.ExpiresAt = ts(*sb.ExpiresAt)
	}
	return resp
}

func toCreateRequest(b createSandboxRequest) (lifecycle.CreateRequest, error) {
	req := lifecycle.CreateRequest{
		SnapshotID:     b.SnapshotID,
		Entrypoint:     b.Entrypoint,
		Metadata:       b.Metadata,
		ResourceLimits: b.ResourceLimits,
		Extensions:     b.Extensions,
		Platform:       b.Platform,
		SecureAccess:   b.SecureAccess,
		HasVolumes:     len(b.Volumes) > 0,
	}
	vols, err := lifecycle.ParseVolumes(b.Volumes)
	if err != nil {
		return req, err
	}
	req.Volumes = vols
	if b.Image != nil {
		if strings.TrimSpace(b.Image.URI) == "" {
			return req, errdefs.Invalid("SANDBOX::INVALID_PARAMETER", "image.uri is required")
		}
		req.Image = b.Image.URI
		if b.Image.Auth != nil {
			req.ImageAuth = &image.Auth{Username: b.Image.Auth.Username, Password: b.Image.Auth.Password}
		}
	}
	if b.Timeout != nil {
		n, err := b.Timeout.Float64()
		if err != nil || n != math.Trunc(n) || n > math.MaxInt32 {
			return req, errdefs.Invalid("SANDBOX::INVALID_PARAMETER", "timeout must be an integer number of seconds")
		}
		if n < 60 {
			return req, errdefs.Invalid("SANDBOX::INVALID_PARAMETER", "timeout must be at least 60 seconds (omit it for manual cleanup)")
		}
		req.Timeout = time.Duration(n) * time.Second
	}
	if len(b.Env) > 0 {
		req.Env = make(map[string]string, len(b.Env))
		for k, v := range b.Env {
			if v != nil {
				req.Env[k] = *v
			}
		}
	}
	if len(b.NetworkPolicy) > 0 && string(b.NetworkPolicy) != "null" {
		req.NetworkPolicy = b.NetworkPolicy
	}
	if len(b.CredentialProxy) > 0 && string(b.CredentialProxy) != "null" {
		var cp struct {
			Enabled *bool `json:"enabled"`
		}
		if err := json.Unmarshal(b.CredentialProxy, &cp); err != nil {
			return req, errdefs.Invalid("SANDBOX::INVALID_PARAMETER", "credentialProxy must be an object {\"enabled\": bool}")
		}
		req.CredentialProxy = cp.Enabled != nil && *cp.Enabled
	}
	return req, nil
}

func (s *Server) get(w http.ResponseWriter, r *http.Request) error {
	sb, err := s.svc.Get(r.Context(), r.PathValue("id"))
	if err != nil {
		return err
	}
	web.WriteJSON(w, http.StatusOK, toJSON(sb))
	return nil
}

func (s *Server) list(w http.ResponseWriter, r *http.Request) error {
	q, err := url.ParseQuery(r.URL.RawQuery)
	if err != nil {
		return errdefs.Invalid("SANDBOX::INVALID_PARAMETER", "malformed query string")
	}
	f := lifecycle.ListFilter{States: filterStates(q, lifecycle.ParseState)}
	if m := q["metadata"]; len(m) > 0 {
		f.Metadata = map[string]string{}
		for _, raw := range m {
			vals, err := url.ParseQuery(raw)
			if err != nil {
				return errdefs.Invalid("SANDBOX::INVALID_PARAMETER", "metadata filter must be url-encoded k=v pairs")
			}
			for k, v := range vals {
				if len(v) > 0 {
					f.Metadata[k] = v[len(v)-1]
				}
			}
		}
	}
	page, size, err := pageParams(q)
	if err != nil {
		return err
	}
	items, total := s.svc.List(r.Context(), f, page, size)
	resp := listSandboxesResponse{Items: make([]sandboxJSON, 0, len(items))}
	for _, sb := range items {
		resp.Items = append(resp.Items, toJSON(sb))
	}
	resp.Pagination = pagination(page, size, total)
	web.WriteJSON(w, http.StatusOK, resp)
	return nil
}

// filterStates reads the state filter of a list query: repeated values,
// each maybe a comma-separated list, matched case-insensitively by parse.
// A value parse does not know is kept as given and so matches nothing:
// upstream's spec says new states may appear and clients must handle them
// (its Kubernetes providers report Allocated), so filtering on one is no
// error.
func filterStates[S ~string](q url.Values, parse func(string) (S, error)) []S {
	var out []S
	for _, v := range q["state"] {
		for _, part := range strings.Split(v, ",") {
			if part = strings.TrimSpace(part); part == "" {
				continue
			}
			st, err := parse(part)
			if err != nil {
				st = S(part)
			}
			out = append(out, st)
		}
	}
	return out
}

// pageParams reads the page (1-based, default 1) and pageSize (default
// 20, at most 1000) of a list query.
func pageParams(q url.Values) (page, size int, err error) {
	if page, err = intParam(q, "page", 1, 1, math.MaxInt32); err != nil {
		return 0, 0, err
	}
	if size, err = intParam(q, "pageSize", 20, 1, 1000); err != nil {
		return 0, 0, err
	}
	return page, size, nil
}

// pagination describes page of size out of total items.
func pagination(page, size, total int) paginationInfo {
	pages := (total + size - 1) / size
	return paginationInfo{Page: page, PageSize: size, TotalItems: total, TotalPages: pages, HasNextPage: page < pages}
}

func intParam(q url.Values, name string, def, lo, hi int) (int, error) {
	v := q.Get(name)
	if v == "" {
		return def, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < lo || n > hi {
		return 0, errdefs.Invalid("SANDBOX::INVALID_PARAMETER", fmt.Sprintf("%s must be an integer between %d and %d", name, lo, hi))
	}
	return n, nil
}

func (s *Server) delete(w http.ResponseWriter, r *http.Request) error {
	if err := s.svc.Delete(r.Context(), r.PathValue("id")); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// pause is the freezer pause, or with ?mode=hibernate (moat's) a
// hibernation: processes stopped and their memory freed.
func (s *Server) pause(w http.ResponseWriter, r *http.Request) error {
	op := s.svc.Pause
	switch mode := r.URL.Query().Get("mode"); mode {
	case "", "freeze":
	case "hibernate":
		op = s.svc.Hibernate
	default:
		return errdefs.Invalid("SANDBOX::INVALID_PARAMETER", fmt.Sprintf("mode %q is not freeze or hibernate", mode))
	}
	if err := op(r.Context(), r.PathValue("id")); err != nil {
		return err
	}
	w.WriteHeader(http.StatusAccepted)
	return nil
}

func (s *Server) resume(w http.ResponseWriter, r *http.Request) error {
	if err := s.svc.Resume(r.Context(), r.PathValue("id")); err != nil {
		return err
	}
	w.WriteHeader(http.StatusAccepted)
	return nil
}

func (s *Server) renew(w http.ResponseWriter, r *http.Request) error {
	var body renewRequest
	if err := web.DecodeJSON(r, &body, false); err != nil {
		return err
	}
	if body.ExpiresAt == "" {
		return errdefs.Invalid("SANDBOX::INVALID_PARAMETER", "expiresAt is required")
	}
	at, err := time.Parse(time.RFC3339Nano, body.ExpiresAt)
	if err != nil {
		return errdefs.Invalid("SANDBOX::INVALID_PARAMETER", "expiresAt must be an RFC 3339 timestamp")
	}
	got, err := s.svc.Renew(r.Context(), r.PathValue("id"), at)
	if err != nil {
		return err
	}
	web.WriteJSON(w, http.StatusOK, renewResponse{ExpiresAt: ts(got)})
	return nil
}

func (s *Server) patchMetadata(w http.ResponseWriter, r *http.Request) error {
	var raw json.RawMessage
	if err := web.DecodeJSON(r, &raw, false); err != nil {
		return err
	}
	var patch map[string]*string
	if err := json.Unmarshal(raw, &patch); err != nil || patch == nil {
		return errdefs.Invalid("SANDBOX::INVALID_PARAMETER", "metadata patch must be a JSON object of string or null values")
	}
	sb, err := s.svc.PatchMetadata(r.Context(), r.PathValue("id"), patch)
	if err != nil {
		return err
	}
	web.WriteJSON(w, http.StatusOK, toJSON(sb))
	return nil
}

func (s *Server) endpoint(w http.ResponseWriter, r *http.Request) error {
	id := r.PathValue("id")
	port, err := strconv.Atoi(r.PathValue("port"))
	if err != nil {
		return errdefs.Invalid("SANDBOX::INVALID_PORT", fmt.Sprintf("port %q is not a number", r.PathValue("port")))
	}
	q := r.URL.Query()
	useProxy := false
	if v := q.Get("use_server_proxy"); v != "" {
		useProxy, err = strconv.ParseBool(v)
		if err != nil {
			return errdefs.Invalid("SANDBOX::INVALID_PARAMETER", "use_server_proxy must be a boolean")
		}
	}
	signed, expires := false, uint64(0)
	if q.Get("expires") != "" {
		if useProxy {
			return errdefs.Invalid("SANDBOX::INVALID_PARAMETER", "expires cannot be combined with use_server_proxy")
		}
		if expires, err = strconv.ParseUint(q.Get("expires"), 10, 64); err != nil {
			return errdefs.Invalid("SANDBOX::INVALID_PARAMETER", "expires must be epoch seconds")
		}
		if s.cfg.Signed == nil || s.cfg.Signed.Signer == nil {
			return errdefs.WithPublic(errdefs.ErrNotImplemented, "SANDBOX::API_NOT_SUPPORTED", "this server signs no routes")
		}
		if now := time.Now().Unix(); expires <= uint64(max(now, 0)) {
			return errdefs.Invalid("SANDBOX::INVALID_PARAMETER", "expires must be in the future")
		}
		signed = true
	}
	host := s.cfg.PublicAddress
	if host == "" {
		host = r.Host
	}
	if port == EgressPort && !signed {
		// The egress sidecar port of upstream maps to the server's egress
		// API for sandboxes that have a network policy. moat serves it
		// itself, so both modes answer the server-proxy shape upstream
		// clients use for it, with the token.
		tok, err := s.svc.EgressToken(r.Context(), id)
		if err != nil {
			return err
		}
		if tok != "" {
			web.WriteJSON(w, http.StatusOK, withoutControlTokens(r, endpointJSON{Endpoint: fmt.Sprintf("%s/sandboxes/%s/proxy/%d", host, id, EgressPort),
				Headers: map[string]string{egress.AuthHeader: tok}}))
			return nil
		}
	}
	// A client that looks up an endpoint is about to use it (an SDK's
	// connect): an idle-paused sandbox is woken first.
	done, err := s.svc.Access(r.Context(), id, idle.ViaEndpoint)
	if err != nil {
		return err
	}
	done()
	ep, err := s.svc.Endpoint(r.Context(), id, port)
	if err != nil {
		return err
	}
	out := endpointJSON{Endpoint: ep.Address, Headers: ep.Headers}
	switch {
	case useProxy:
		out.Endpoint = fmt.Sprintf("%s/sandboxes/%s/proxy/%d", host, id, port)
	case signed:
		out = ingressEndpoint(s.cfg.Signed, r.Host, id, port, signed, expires, ep.Headers)
	case s.cfg.Ingress != nil:
		out = ingressEndpoint(s.cfg.Ingress, r.Host, id, port, signed, expires, ep.Headers)
	}
	web.WriteJSON(w, http.StatusOK, withoutControlTokens(r, out))
	return nil
}

// withoutControlTokens removes the agent and egress tokens from an
// endpoint answered to a caller that may not change the sandbox (a
// viewer): either token would let it run commands or rewrite the egress
// policy. The secure-access token stays: it opens the sandbox's own
// application, which is what a viewer looks at.
func withoutControlTokens(r *http.Request, ep endpointJSON) endpointJSON {
	if canDrive(r) || len(ep.Headers) == 0 {
		return ep
	}
	h := maps.Clone(ep.Headers)
	delete(h, "X-EXECD-ACCESS-TOKEN")
	delete(h, egress.AuthHeader)
	if len(h) == 0 {
		h = nil
	}
	ep.Headers = h
	return ep
}

// ingressEndpoint is the gateway-mode answer for a sandbox port: the
// gateway address in the configured route shape, with the sandbox's own
// headers (agent token, secure-access token) plus the routing header.
func ingressEndpoint(e *ingress.Endpoints, reqHost, id string, port int, signed bool, expires uint64, own map[string]string) endpointJSON {
	addr, hdr := e.Endpoint(reqHost, id, port, signed, expires)
	merged := maps.Clone(own)
	if signed {
		// The signature stands in for the secure-access token: as
		// upstream, a signed endpoint never carries the token.
		delete(merged, ingress.HeaderSecureAccess)
	}
	if merged == nil {
		merged = map[string]string{}
	}
	maps.Copy(merged, hdr)
	if len(merged) == 0 {
		merged = nil
	}
	return endpointJSON{Endpoint: addr, Headers: merged}
}

// EgressPort is the OpenSandbox egress sidecar port.
const EgressPort = 18080

// egress serves the OpenSandbox egress API (/policy, /credential-vault)
// of one sandbox at /sandboxes/{id}/egress/ (moat's earlier shape; the
// endpoint of port 18080 answers /sandboxes/{id}/proxy/18080, which
// serves the same handler, see proxy.serve).
func (s *Server) egress(w http.ResponseWriter, r *http.Request) error {
	id := r.PathValue("id")
	h, err := s.egressHandler(r, id)
	if err != nil {
		return err
	}
	if h == nil {
		return errdefs.WithPublic(errdefs.ErrNotFound, "SANDBOX::NO_NETWORK_POLICY", "sandbox has no network policy")
	}
	serveEgress(w, r, h)
	return nil
}

// egressHandler returns the egress API of sandbox id, nil if it has no
// network policy. Its token is the sandbox's egress token; a holder of
// the API key may present that instead (the SDKs do in server-proxy
// mode).
func (s *Server) egressHandler(r *http.Request, id string) (http.Handler, error) {
	tok, err := s.svc.EgressToken(r.Context(), id)
	if err != nil || tok == "" {
		return nil, err
	}
	return egress.NewHandler(s.svc.EgressPolicies(r.Context()), id, egress.HandlerOptions{
		Token: tok, Authorized: canDrive, Logger: s.log,
		Vault: s.svc.CredentialVaults(), InsecureVaultWrites: s.cfg.InsecureVaultWrites,
	}), nil
}

// serveEgress runs the egress API on the path under the route's prefix.
func serveEgress(w http.ResponseWriter, r *http.Request, h http.Handler) {
	r2 := r.Clone(r.Context())
	r2.URL.Path = "/" + r.PathValue("path")
	r2.URL.RawPath = ""
	h.ServeHTTP(w, r2)
}

// Package e2b serves E2B's control-plane REST API (the routes the e2b
// SDKs call: /sandboxes, /v2/sandboxes, /snapshots, /templates) as a
// client of the sandbox service: one sandbox, two views. A sandbox made
// here is an ordinary moat sandbox, listed, used and deleted through the
// Lifecycle API too, and the other way round; both go through the one
// state machine, store and quota. Templates (internal/lifecycle/template)
// name what E2B's templateID creates from.
//
// The API is a face of the API server (httpapi.Face): it is served on the
// same listener, with the same keys, tenants, roles, audit and metrics.
// Claims says which requests are E2B's; errors are E2B's {code, message}.
// docs/E2B.md says what works and what differs.
package e2b

import (
	"errors"
	"log/slog"
	"net/http"
	"strings"
	"time"

	"github.com/moat-sandbox/moat/internal/errdefs"
	"github.com/moat-sandbox/moat/internal/httpapi"
	"github.com/moat-sandbox/moat/internal/sandbox"
	"github.com/moat-sandbox/moat/internal/tenant"
	"github.com/moat-sandbox/moat/internal/web"
)

// Config tunes the API.
type Config struct {
	// Domain, if set, is the base domain of the sandboxes' hosts
	// ("<port>-<id>.<domain>"), returned as the domain of every sandbox
	// (the SDKs then reach envd there); empty omits it, and the SDKs use
	// their own E2B_DOMAIN or sandboxUrl.
	Domain string
}

// API is the E2B control plane over the sandbox service.
type API struct {
	cfg  Config
	svc  *sandbox.Service
	log  *slog.Logger
	web  *web.Adapter
	http *http.Client
	now  func() time.Time
}

// New returns the API.
func New(cfg Config, svc *sandbox.Service, log *slog.Logger) *API {
	if log == nil {
		log = slog.Default()
	}
	a := &API{cfg: cfg, svc: svc, log: log, now: svc.Now,
		http: &http.Client{Timeout: 5 * time.Second}}
	a.web = &web.Adapter{Log: log, Codes: codeOf, Envelope: envelope}
	return a
}

// errorBody is E2B's error envelope (infra apierrors): the HTTP status
// as a number, a message, and a machine code for some server errors.
type errorBody struct {
	Code      int    `json:"code"`
	Message   string `json:"message"`
	ErrorCode string `json:"error_code,omitempty"`
}

func envelope(status int, code, msg string) any {
	b := errorBody{Code: status, Message: msg}
	if status >= 500 && status != http.StatusNotImplemented {
		b.ErrorCode = "internal_server_error"
	}
	return b
}

// codeOf keeps the class's status; E2B has no string codes to map to. A
// tenant over its quota is E2B's 429 (a team at its concurrent sandbox
// limit), which the SDKs report as a rate limit.
func codeOf(err error) (int, string) {
	status, code := web.StatusOf(err)
	if p, ok := errdefs.PublicOf(err); ok && p.Code == tenant.CodeQuotaExceeded {
		return http.StatusTooManyRequests, code
	}
	if errors.Is(err, errdefs.ErrResourceExhausted) {
		// A full host: E2B's sandbox_capacity_unavailable, which its SDK
		// reads as "service busy" (503) as well.
		code = "sandbox_capacity_unavailable"
	}
	return status, code
}

// Face is the API as a face of the API server.
func (a *API) Face() httpapi.Face {
	return httpapi.Face{Name: "e2b", Claims: Claims, Routes: a.routes(), Errors: a.web}
}

// Claims reports whether r is a request of the E2B API: everything under
// /v2/ (the Lifecycle API has no /v2), and a request on one of E2B's
// root paths (/sandboxes, /snapshots, /templates) that carries E2B's
// X-API-KEY and not OPEN-SANDBOX-API-KEY. OpenSandbox clients that send
// X-API-Key do so under /v1, which stays the Lifecycle API's.
func Claims(r *http.Request) bool {
	p := r.URL.Path
	if strings.HasPrefix(p, "/v2/") {
		return true
	}
	if r.Header.Get("X-API-Key") == "" || r.Header.Get("OPEN-SANDBOX-API-KEY") != "" {
		return false
	}
	for _, root := range []string{"/sandboxes", "/snapshots", "/templates"} {
		if p == root || strings.HasPrefix(p, root+"/") {
			return true
		}
	}
	return false
}

func (a *API) routes() []httpapi.ExtraRoute {
	h := a.web.Handle
	const (
		read  = tenant.AccessRead
		write = tenant.AccessWrite
	)
	rts := []struct {
		p   string
		acc tenant.Access
		h   web.HandlerFunc
	}{
		{"POST /sandboxes", write, a.createV1},
		{"POST /v2/sandboxes", write, a.createV2},
		{"GET /sandboxes", read, a.listV1},
		{"GET /v2/sandboxes", read, a.listV2},
		{"GET /sandboxes/metrics", read, a.metricsMany},
		{"GET /sandboxes/{id}", read, a.get},
		{"DELETE /sandboxes/{id}", write, a.kill},
		{"POST /sandboxes/{id}/connect", write, a.connectV1},
		{"POST /v2/sandboxes/{id}/connect", write, a.connectV2},
		{"POST /sandboxes/{id}/resume", write, a.resume},
		{"POST /sandboxes/{id}/pause", write, a.pause},
		{"POST /sandboxes/{id}/timeout", write, a.setTimeout},
		{"POST /sandboxes/{id}/refreshes", write, a.refresh},
		{"GET /sandboxes/{id}/metrics", read, a.metrics},
		{"GET /sandboxes/{id}/logs", read, a.logsV1},
		{"GET /v2/sandboxes/{id}/logs", read, a.logsV2},
		{"PUT /sandboxes/{id}/network", write, a.notSupported("changing a sandbox's network config")},
		{"POST /sandboxes/{id}/fork", write, a.notSupported("fork (snapshot the sandbox, then create from the snapshot)")},
		{"POST /sandboxes/{id}/snapshots", write, a.createSnapshot},
		{"GET /snapshots", read, a.listSnapshots},
		{"GET /templates", read, a.listTemplates},
		{"GET /templates/aliases/{alias}", read, a.templateAlias},
		{"GET /templates/{id}", read, a.getTemplate},
		{"DELETE /templates/{id}", write, a.deleteTemplate},
		{"/", read, a.unknownRoute},
	}
	out := make([]httpapi.ExtraRoute, 0, len(rts))
	for _, rt := range rts {
		out = append(out, httpapi.ExtraRoute{Pattern: rt.p, Access: rt.acc, Handler: h(rt.h)})
	}
	return out
}

func (a *API) unknownRoute(w http.ResponseWriter, r *http.Request) error {
	return errdefs.WithPublic(errdefs.ErrNotFound, "", "no E2B route "+r.Method+" "+r.URL.Path+" on this server")
}

func (a *API) notSupported(what string) web.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) error {
		return errdefs.WithPublic(errdefs.ErrNotImplemented, "", what+" is not supported by this server")
	}
}

// invalid is a 400 with msg.
func invalid(msg string) error { return errdefs.Invalid("", msg) }

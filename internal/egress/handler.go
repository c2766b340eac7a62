package egress

import (
	"context"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"strings"

	"github.com/moat-sandbox/moat/internal/egress/policy"
	"github.com/moat-sandbox/moat/internal/errdefs"
)

// EnforcementMode is reported as PolicyStatusResponse.enforcementMode.
const EnforcementMode = "dns+nft"

// AuthHeader carries the egress API token (OpenSandbox
// OPENSANDBOX_EGRESS_TOKEN).
const AuthHeader = "OPENSANDBOX-EGRESS-AUTH"

// maxBody bounds request bodies (OpenSandbox uses the same 1 MiB).
const maxBody = 1 << 20

// PolicyService is what the egress API handler needs from the enforcer.
// Modify must apply fn to the current policy and install the result
// atomically (no lost updates between concurrent PATCH/DELETE calls).
// Errors are classified with errdefs.
type PolicyService interface {
	Get(id string) (policy.NetworkPolicy, error)
	Modify(ctx context.Context, id string, fn func(policy.NetworkPolicy) (policy.NetworkPolicy, error)) (policy.NetworkPolicy, error)
}

// LayeredService is implemented by policy services whose sandboxes may
// sit under a tenant guardrail (the lifecycle's): /policy answers then
// show the guardrail and the effective policy too (a moat extension), and
// mode is the effective policy's.
type LayeredService interface {
	Layers(id string) (policy.Layers, error)
}

// PolicyStatusResponse is the body of every successful /policy call.
// Policy is the sandbox's own policy (what /policy sets); under a tenant
// guardrail, TenantPolicy and EffectivePolicy (what is enforced) are set.
type PolicyStatusResponse struct {
	Status          string                `json:"status"`
	Mode            string                `json:"mode"`
	EnforcementMode string                `json:"enforcementMode"`
	Reason          string                `json:"reason,omitempty"`
	Policy          *policy.NetworkPolicy `json:"policy,omitempty"`
	TenantPolicy    *policy.NetworkPolicy `json:"tenantPolicy,omitempty"`
	EffectivePolicy *policy.NetworkPolicy `json:"effectivePolicy,omitempty"`
}

// HandlerOptions configures NewHandler.
type HandlerOptions struct {
	// Token, if set, must be sent in AuthHeader on /policy requests; it is
	// compared in constant time.
	Token string
	// Authorized, if set, admits a request without the token (e.g. one the
	// server authenticated with an API key that may drive the sandbox).
	Authorized func(*http.Request) bool
	// Logger receives internal errors. Default slog.Default().
	Logger *slog.Logger
	// Vault serves the Credential Vault routes; nil answers them with
	// 412 CREDENTIAL_VAULT::NOT_ENABLED.
	Vault VaultService
	// InsecureVaultWrites allows Credential Vault writes over plain HTTP
	// from non-loopback clients.
	InsecureVaultWrites bool
}

// NewHandler returns the OpenSandbox egress sidecar API for sandbox id:
//
//	GET    /policy   current policy
//	POST   /policy   replace (PUT too); empty body, {} or null = deny-all
//	PATCH  /policy   JSON rule array merged ahead of the current rules
//	DELETE /policy   JSON target array removed from the rules
//	GET    /healthz  "ok"
//	…      /credential-vault…  the Credential Vault (see mountVault)
//
// /policy errors are text/plain, as upstream: "unauthorized", "invalid
// policy: …"; Credential Vault errors are JSON {code, message}.
// The server mounts it per sandbox (strip any path prefix first).
func NewHandler(svc PolicyService, id string, opts HandlerOptions) http.Handler {
	h := &handler{svc: svc, id: id, token: opts.Token, authorizedFn: opts.Authorized, log: opts.Logger, vault: opts.Vault, insecureWrites: opts.InsecureVaultWrites}
	if h.log == nil {
		h.log = slog.Default()
	}
	mux := http.NewServeMux()
	mux.Handle("GET /policy", h.wrap(h.get))
	mux.Handle("POST /policy", h.wrap(h.replace))
	mux.Handle("PUT /policy", h.wrap(h.replace))
	mux.Handle("PATCH /policy", h.wrap(h.patch))
	mux.Handle("DELETE /policy", h.wrap(h.remove))
	h.mountVault(mux)
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		_, _ = io.WriteString(w, "ok")
	})
	return mux
}

type handler struct {
	svc            PolicyService
	id             string
	token          string
	authorizedFn   func(*http.Request) bool
	log            *slog.Logger
	vault          VaultService
	insecureWrites bool
}

// wrap adds authentication and turns a returned error into the plain-text
// error response.
func (h *handler) wrap(fn func(w http.ResponseWriter, r *http.Request) error) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !h.authorized(r) {
			http.Error(w, "unauthorized", http.StatusUnauthorized)
			return
		}
		if err := fn(w, r); err != nil {
			h.writeError(w, r, err)
		}
	})
}

func (h *handler) authorized(r *http.Request) bool {
	if h.token == "" || (h.authorizedFn != nil && h.authorizedFn(r)) {
		return true
	}
	return HasToken(r, h.token)
}

// HasToken reports whether r carries token, which must not be empty, in
// AuthHeader.
func HasToken(r *http.Request, token string) bool {
	got := r.Header.Get(AuthHeader)
	// ConstantTimeCompare returns early only on a length mismatch, which
	// leaks the token length at most.
	return token != "" && got != "" && subtle.ConstantTimeCompare([]byte(got), []byte(token)) == 1
}

func (h *handler) writeError(w http.ResponseWriter, r *http.Request, err error) {
	var tooBig *http.MaxBytesError
	switch {
	case errors.As(err, &tooBig):
		http.Error(w, "request body too large", http.StatusRequestEntityTooLarge)
	case errdefs.IsInvalidArgument(err):
		msg := "invalid policy"
		if p, ok := errdefs.PublicOf(err); ok {
			msg += ": " + p.Message
		}
		http.Error(w, msg, http.StatusBadRequest)
	case errdefs.IsNotFound(err):
		http.Error(w, "sandbox not found", http.StatusNotFound)
	default:
		h.log.Error("egress policy request failed", "sandbox", h.id, "method", r.Method, "err", err)
		http.Error(w, "failed to apply policy", http.StatusInternalServerError)
	}
}

func (h *handler) get(w http.ResponseWriter, _ *http.Request) error {
	p, err := h.svc.Get(h.id)
	if err != nil {
		return err
	}
	h.writeStatus(w, p, "")
	return nil
}

func (h *handler) replace(w http.ResponseWriter, r *http.Request) error {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxBody))
	if err != nil {
		return err
	}
	next, err := policy.Parse(body)
	if err != nil {
		return err
	}
	reason := ""
	if t := strings.TrimSpace(string(body)); t == "" || t == "{}" || t == "null" {
		reason = "policy reset to default deny-all"
	}
	got, err := h.svc.Modify(r.Context(), h.id, func(policy.NetworkPolicy) (policy.NetworkPolicy, error) { return next, nil })
	if err != nil {
		return err
	}
	h.writeStatus(w, got, reason)
	return nil
}

func (h *handler) patch(w http.ResponseWriter, r *http.Request) error {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxBody))
	if err != nil {
		return err
	}
	rules, err := policy.ParseRules(body)
	if err != nil {
		return err
	}
	got, err := h.svc.Modify(r.Context(), h.id, func(cur policy.NetworkPolicy) (policy.NetworkPolicy, error) {
		return policy.Patch(cur, rules)
	})
	if err != nil {
		return err
	}
	h.writeStatus(w, got, "")
	return nil
}

func (h *handler) remove(w http.ResponseWriter, r *http.Request) error {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxBody))
	if err != nil {
		return err
	}
	targets, err := policy.ParseTargets(body)
	if err != nil {
		return err
	}
	got, err := h.svc.Modify(r.Context(), h.id, func(cur policy.NetworkPolicy) (policy.NetworkPolicy, error) {
		return policy.RemoveTargets(cur, targets)
	})
	if err != nil {
		return err
	}
	h.writeStatus(w, got, "")
	return nil
}

func (h *handler) writeStatus(w http.ResponseWriter, p policy.NetworkPolicy, reason string) {
	if p.Egress == nil {
		p.Egress = []policy.Rule{}
	}
	resp := PolicyStatusResponse{Status: "ok", Mode: p.Mode(), EnforcementMode: EnforcementMode, Reason: reason, Policy: &p}
	if ls, ok := h.svc.(LayeredService); ok {
		if l, err := ls.Layers(h.id); err == nil && l.Tenant != nil {
			resp.TenantPolicy, resp.EffectivePolicy, resp.Mode = l.Tenant, &l.Effective, l.Effective.Mode()
		}
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusOK)
	_ = json.NewEncoder(w).Encode(resp)
}

package egress

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"net/netip"

	"github.com/moat-sandbox/moat/internal/egress/vault"
	"github.com/moat-sandbox/moat/internal/errdefs"
)

// VaultService is what the Credential Vault routes need. Implementations
// persist every change before returning and apply it to the sandbox's
// credential proxy; errors are classified with errdefs (vault.ErrNotFound,
// vault.ErrExists, vault.ErrNotEnabled, conflicts and invalid arguments
// with public messages).
type VaultService interface {
	CreateVault(ctx context.Context, id string, req vault.CreateRequest) (vault.View, error)
	// GetVault returns the vault of sandbox id (immutable; read only its
	// sanitized views).
	GetVault(ctx context.Context, id string) (*vault.State, error)
	PatchVault(ctx context.Context, id string, req vault.PatchRequest) (vault.View, error)
	DeleteVault(ctx context.Context, id string) error
}

// Codes of vault errors that are not the service's.
const (
	codeVaultUnauthorized = "CREDENTIAL_VAULT::UNAUTHORIZED"
	codeVaultInsecure     = "CREDENTIAL_VAULT::INSECURE_TRANSPORT"
	codeVaultTooLarge     = "CREDENTIAL_VAULT::REQUEST_TOO_LARGE"
	codeVaultInternal     = "CREDENTIAL_VAULT::INTERNAL_ERROR"
	codeVaultUnsupported  = "CREDENTIAL_VAULT::NOT_SUPPORTED"
)

// mountVault adds the Credential Vault routes (OSEP-0012):
//
//	POST   /credential-vault                     create (201)
//	GET    /credential-vault                     sanitized state
//	PATCH  /credential-vault                     add/replace/delete, expectedRevision
//	DELETE /credential-vault                     (204)
//	GET    /credential-vault/credentials[/{name}]
//	GET    /credential-vault/bindings[/{name}]
//
// Unlike /policy, errors are JSON {code, message}, which the SDKs parse.
// Writes carry credential values, so they need TLS or a loopback peer
// (as upstream) unless opts.InsecureVaultWrites.
func (h *handler) mountVault(mux *http.ServeMux) {
	mux.Handle("POST /credential-vault", h.vaultRoute(true, h.vaultCreate))
	mux.Handle("GET /credential-vault", h.vaultRoute(false, h.vaultGet))
	mux.Handle("PATCH /credential-vault", h.vaultRoute(true, h.vaultPatch))
	mux.Handle("DELETE /credential-vault", h.vaultRoute(false, h.vaultDelete))
	mux.Handle("GET /credential-vault/credentials", h.vaultRoute(false, h.vaultRead(func(s *vault.State, _ string) (any, error) {
		return s.CredentialList(), nil
	})))
	mux.Handle("GET /credential-vault/credentials/{name}", h.vaultRoute(false, h.vaultRead(func(s *vault.State, name string) (any, error) {
		return s.Credential(name)
	})))
	mux.Handle("GET /credential-vault/bindings", h.vaultRoute(false, h.vaultRead(func(s *vault.State, _ string) (any, error) {
		return s.BindingList(), nil
	})))
	mux.Handle("GET /credential-vault/bindings/{name}", h.vaultRoute(false, h.vaultRead(func(s *vault.State, name string) (any, error) {
		return s.Binding(name)
	})))
}

func (h *handler) vaultRoute(write bool, fn func(w http.ResponseWriter, r *http.Request) error) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !h.authorized(r) {
			writeVaultError(w, http.StatusUnauthorized, codeVaultUnauthorized, "unauthorized")
			return
		}
		if h.vault == nil {
			h.writeVaultErr(w, r, vault.ErrNotEnabled)
			return
		}
		if write && !h.insecureWrites && !secureTransport(r) {
			writeVaultError(w, http.StatusForbidden, codeVaultInsecure,
				"Credential Vault writes need TLS or a loopback client (the request carries credential values)")
			return
		}
		if err := fn(w, r); err != nil {
			h.writeVaultErr(w, r, err)
		}
	})
}

// secureTransport reports a TLS request or one from a loopback peer.
func secureTransport(r *http.Request) bool {
	if r.TLS != nil {
		return true
	}
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		return false
	}
	ip, err := netip.ParseAddr(host)
	return err == nil && ip.Unmap().IsLoopback()
}

func (h *handler) vaultCreate(w http.ResponseWriter, r *http.Request) error {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxBody))
	if err != nil {
		return err
	}
	req, err := vault.DecodeCreate(body)
	clear(body)
	if err != nil {
		return err
	}
	v, err := h.vault.CreateVault(r.Context(), h.id, req)
	if err != nil {
		return err
	}
	writeVaultJSON(w, http.StatusCreated, v)
	return nil
}

func (h *handler) vaultGet(w http.ResponseWriter, r *http.Request) error {
	s, err := h.vault.GetVault(r.Context(), h.id)
	if err != nil {
		return err
	}
	writeVaultJSON(w, http.StatusOK, s.View())
	return nil
}

func (h *handler) vaultPatch(w http.ResponseWriter, r *http.Request) error {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxBody))
	if err != nil {
		return err
	}
	req, err := vault.DecodePatch(body)
	clear(body)
	if err != nil {
		return err
	}
	v, err := h.vault.PatchVault(r.Context(), h.id, req)
	if err != nil {
		return err
	}
	writeVaultJSON(w, http.StatusOK, v)
	return nil
}

func (h *handler) vaultDelete(w http.ResponseWriter, r *http.Request) error {
	if err := h.vault.DeleteVault(r.Context(), h.id); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

func (h *handler) vaultRead(view func(s *vault.State, name string) (any, error)) func(w http.ResponseWriter, r *http.Request) error {
	return func(w http.ResponseWriter, r *http.Request) error {
		s, err := h.vault.GetVault(r.Context(), h.id)
		if err != nil {
			return err
		}
		v, err := view(s, r.PathValue("name"))
		if err != nil {
			return err
		}
		writeVaultJSON(w, http.StatusOK, v)
		return nil
	}
}

// writeVaultErr maps an error class to a status; messages are the
// errors' public text only (which never quotes a credential value).
func (h *handler) writeVaultErr(w http.ResponseWriter, r *http.Request, err error) {
	var tooBig *http.MaxBytesError
	if errors.As(err, &tooBig) {
		writeVaultError(w, http.StatusRequestEntityTooLarge, codeVaultTooLarge, "request body larger than 1 MiB")
		return
	}
	status, code := http.StatusInternalServerError, codeVaultInternal
	switch {
	case errdefs.IsInvalidArgument(err):
		status, code = http.StatusBadRequest, vault.CodeInvalid
	case errdefs.IsNotFound(err):
		status, code = http.StatusNotFound, vault.CodeNotFound
	case errdefs.IsAlreadyExists(err):
		status, code = http.StatusConflict, vault.CodeExists
	case errdefs.IsConflict(err):
		status, code = http.StatusConflict, vault.CodeConflict
	case errdefs.IsFailedPrecondition(err):
		status, code = http.StatusPreconditionFailed, vault.CodeNotEnabled
	case errdefs.IsNotImplemented(err):
		status, code = http.StatusNotImplemented, codeVaultUnsupported
	}
	msg := http.StatusText(status)
	if status == http.StatusInternalServerError {
		msg = "the credential vault could not be changed"
	}
	if p, ok := errdefs.PublicOf(err); ok {
		code, msg = p.Code, p.Message
	}
	if status == http.StatusInternalServerError {
		// The error is internal (storage, proxy); it carries no credential.
		h.log.Error("credential vault request failed", "sandbox", h.id, "method", r.Method, "err", err)
	}
	writeVaultError(w, status, code, msg)
}

type vaultErrorBody struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

func writeVaultError(w http.ResponseWriter, status int, code, msg string) {
	writeVaultJSON(w, status, vaultErrorBody{Code: code, Message: msg})
}

func writeVaultJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

package sidecar

import (
	"context"
	"crypto/subtle"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"

	"github.com/moat-sandbox/moat/internal/egress"
	"github.com/moat-sandbox/moat/internal/egress/mitm"
	"github.com/moat-sandbox/moat/internal/egress/vault"
)

// The Credential Vault in a pod: the server pushes the sandbox's CA and
// vault to the sidecar with a PUT of VaultPath (token in the egress API's
// auth header, on a connection proved as for /policy). Both travel sealed
// (vault.SealState, the CA key as its extra) under the pod's own vault
// key, which only the sidecar and the server hold (EnvVaultKey, from the
// egress Secret), for VaultAD: a value is in the clear only in the
// sidecar's memory, never on the wire, in the pod spec or in the sandbox
// container.
const (
	VaultPath   = "/moat/v1/vault"
	EnvVaultKey = "MOAT_EGRESS_VAULT_KEY" // hex vault.KeySize key
	VaultAD     = "moat-egress-sidecar"   // the sealing's sandbox ID
)

// VaultRequest is the body of a PUT of VaultPath.
type VaultRequest struct {
	// CACert is the sandbox CA's certificate (PEM).
	CACert []byte `json:"caCert"`
	// Sealed is vault.SealState(key, VaultAD, state, CA key DER); a nil
	// state is a proxy without bindings.
	Sealed []byte `json:"sealed"`
}

// ProxyAttacher starts or updates the pod's credential proxy
// (egress.Enforcer.AttachProxy for the pod's sandbox).
type ProxyAttacher func(ctx context.Context, ca *mitm.CA, rules *vault.Rules) error

// VaultHandler serves PUT VaultPath for a sidecar holding token and
// sealer's key. It answers 204 once the rules are in force, 401 without
// the token, 400 for a body that does not open, 501 when attach cannot
// intercept. Nothing of the body is logged.
func VaultHandler(token string, sealer *vault.Sealer, attach ProxyAttacher, log *slog.Logger) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPut {
			w.WriteHeader(http.StatusMethodNotAllowed)
			return
		}
		if subtle.ConstantTimeCompare([]byte(r.Header.Get(egress.AuthHeader)), []byte(token)) != 1 || token == "" {
			w.WriteHeader(http.StatusUnauthorized)
			return
		}
		if sealer == nil {
			http.Error(w, "this sidecar has no vault key", http.StatusNotImplemented)
			return
		}
		var req VaultRequest
		body, err := io.ReadAll(io.LimitReader(r.Body, 8<<20))
		if err == nil {
			err = json.Unmarshal(body, &req)
		}
		clear(body)
		if err != nil {
			http.Error(w, "bad vault request", http.StatusBadRequest)
			return
		}
		state, key, err := vault.OpenState(sealer, VaultAD, req.Sealed)
		if err != nil {
			http.Error(w, "sealed vault does not open", http.StatusBadRequest)
			return
		}
		ca, err := mitm.ParseCA(req.CACert, key)
		clear(key)
		if err != nil {
			http.Error(w, "bad sandbox CA", http.StatusBadRequest)
			return
		}
		if err := attach(r.Context(), ca, state.Compile()); err != nil {
			log.Error("egress sidecar: credential proxy", "err", err)
			http.Error(w, "credential proxy not available", http.StatusNotImplemented)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	})
}

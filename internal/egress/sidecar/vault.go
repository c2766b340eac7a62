package sidecar

import (
	"context"
	"crypto/x509"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"

	"github.com/moat-sandbox/moat/internal/atomicfile"
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
	// UpstreamCAAD is the sealing's sandbox ID of
	// VaultRequest.UpstreamCA.
	UpstreamCAAD = "moat-egress-sidecar/upstream-ca"
)

// VaultRequest is the body of a PUT of VaultPath.
type VaultRequest struct {
	// CACert is the sandbox CA's certificate (PEM).
	CACert []byte `json:"caCert"`
	// Sealed is vault.SealState(key, VaultAD, state, CA key DER); a nil
	// state is a proxy without bindings.
	Sealed []byte `json:"sealed"`
	// UpstreamCA, if set, is Seal(key, UpstreamCAAD, PEM certificates):
	// the server's --vault-upstream-ca, which the proxy trusts for
	// upstream servers besides the sidecar image's roots. Sealed, so
	// that nothing on the way can have the proxy trust another CA.
	UpstreamCA []byte `json:"upstreamCA,omitempty"`
}

// ProxyAttacher starts or updates the pod's credential proxy
// (egress.Enforcer.AttachProxy for the pod's sandbox) with roots for
// upstream servers (nil: the image's).
type ProxyAttacher func(ctx context.Context, ca *mitm.CA, rules *vault.Rules, roots *x509.CertPool) error

// errVaultBody: a PUT whose body does not open under the sidecar's key.
var errVaultBody = errors.New("sealed vault does not open")

// applyVault opens body (a VaultRequest) with sealer and puts it in force.
func applyVault(ctx context.Context, body []byte, sealer *vault.Sealer, attach ProxyAttacher) error {
	var req VaultRequest
	if err := json.Unmarshal(body, &req); err != nil {
		return errVaultBody
	}
	state, key, err := vault.OpenState(sealer, VaultAD, req.Sealed)
	if err != nil {
		return errVaultBody
	}
	ca, err := mitm.ParseCA(req.CACert, key)
	clear(key)
	if err != nil {
		return errVaultBody
	}
	var roots *x509.CertPool
	if len(req.UpstreamCA) > 0 {
		pem, err := sealer.Open(UpstreamCAAD, req.UpstreamCA)
		if err != nil {
			return errVaultBody
		}
		if roots, err = x509.SystemCertPool(); err != nil {
			roots = x509.NewCertPool()
		}
		if !roots.AppendCertsFromPEM(pem) {
			return errVaultBody
		}
	}
	return attach(ctx, ca, state.Compile(), roots)
}

// VaultHandler serves PUT VaultPath for a sidecar holding token and
// sealer's key. It answers 204 once the rules are in force, 401 without
// the token, 400 for a body that does not open, 501 when attach cannot
// intercept. The body, still sealed, is kept at statePath (if set) for a
// restarted sidecar. Nothing of it is logged or answered.
func VaultHandler(token string, sealer *vault.Sealer, attach ProxyAttacher, log *slog.Logger, statePath string) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPut {
			w.WriteHeader(http.StatusMethodNotAllowed)
			return
		}
		if !egress.HasToken(r, token) {
			w.WriteHeader(http.StatusUnauthorized)
			return
		}
		if sealer == nil {
			http.Error(w, "this sidecar has no vault key", http.StatusNotImplemented)
			return
		}
		body, err := io.ReadAll(io.LimitReader(r.Body, 8<<20))
		if err != nil {
			http.Error(w, "bad vault request", http.StatusBadRequest)
			return
		}
		switch err := applyVault(r.Context(), body, sealer, attach); {
		case errors.Is(err, errVaultBody):
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		case err != nil:
			log.Error("egress sidecar: credential proxy", "err", err)
			http.Error(w, "credential proxy not available", http.StatusNotImplemented)
			return
		}
		if statePath != "" {
			if err := atomicfile.WriteFile(statePath, body, 0o600); err != nil {
				// In force now; a restarted sidecar waits for the server.
				log.Error("egress sidecar: save the sealed vault", "err", err)
			}
		}
		w.WriteHeader(http.StatusNoContent)
	})
}

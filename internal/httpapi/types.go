package httpapi

import (
	"encoding/json"
	"time"

	"github.com/moat-sandbox/moat/internal/lifecycle"
)

// Wire types of the OpenSandbox Lifecycle API (specs/sandbox-lifecycle.yml).
// Optional fields are omitted, never null, as server 0.1.9 does.

type imageSpec struct {
	URI  string     `json:"uri"`
	Auth *imageAuth `json:"auth,omitempty"`
}

type imageAuth struct {
	Username string `json:"username"`
	Password string `json:"password"`
}

type createSandboxRequest struct {
	Image          *imageSpec          `json:"image"`
	SnapshotID     string              `json:"snapshotId"`
	Entrypoint     []string            `json:"entrypoint"`
	Timeout        *json.Number        `json:"timeout"`
	ResourceLimits map[string]string   `json:"resourceLimits"`
	Env            map[string]*string  `json:"env"`
	Metadata       map[string]string   `json:"metadata"`
	Extensions     map[string]string   `json:"extensions"`
	Platform       *lifecycle.Platform `json:"platform"`
	NetworkPolicy  json.RawMessage     `json:"networkPolicy"`
	SecureAccess   bool                `json:"secureAccess"`
	Volumes        []json.RawMessage   `json:"volumes"`
	// CredentialProxy is accepted and ignored (upstream's Credential Vault
	// MITM); it is declared so that the spec conformance test sees it.
	CredentialProxy json.RawMessage `json:"credentialProxy"`
}

type sandboxStatus struct {
	State            string `json:"state"`
	Reason           string `json:"reason,omitempty"`
	Message          string `json:"message,omitempty"`
	LastTransitionAt string `json:"lastTransitionAt,omitempty"`
}

type sandboxJSON struct {
	ID         string              `json:"id"`
	Image      *imageSpec          `json:"image,omitempty"`
	SnapshotID string              `json:"snapshotId,omitempty"`
	Platform   *lifecycle.Platform `json:"platform,omitempty"`
	Status     sandboxStatus       `json:"status"`
	Metadata   map[string]string   `json:"metadata"`
	Entrypoint []string            `json:"entrypoint"`
	ExpiresAt  string              `json:"expiresAt,omitempty"`
	CreatedAt  string              `json:"createdAt"`
}

type createSandboxResponse struct {
	ID         string              `json:"id"`
	Status     sandboxStatus       `json:"status"`
	Metadata   map[string]string   `json:"metadata"`
	Platform   *lifecycle.Platform `json:"platform,omitempty"`
	ExpiresAt  string              `json:"expiresAt,omitempty"`
	CreatedAt  string              `json:"createdAt"`
	Entrypoint []string            `json:"entrypoint"`
}

type paginationInfo struct {
	Page        int  `json:"page"`
	PageSize    int  `json:"pageSize"`
	TotalItems  int  `json:"totalItems"`
	TotalPages  int  `json:"totalPages"`
	HasNextPage bool `json:"hasNextPage"`
}

type listSandboxesResponse struct {
	Items      []sandboxJSON  `json:"items"`
	Pagination paginationInfo `json:"pagination"`
}

type renewRequest struct {
	ExpiresAt string `json:"expiresAt"`
}

type renewResponse struct {
	ExpiresAt string `json:"expiresAt"`
}

type endpointJSON struct {
	Endpoint string            `json:"endpoint"`
	Headers  map[string]string `json:"headers,omitempty"`
}

func ts(t time.Time) string { return t.UTC().Format(time.RFC3339Nano) }

func statusJSON(s lifecycle.Status) sandboxStatus {
	out := sandboxStatus{State: string(s.State), Reason: s.Reason, Message: s.Message}
	if !s.LastTransitionAt.IsZero() {
		out.LastTransitionAt = ts(s.LastTransitionAt)
	}
	return out
}

func toJSON(sb lifecycle.Sandbox) sandboxJSON {
	out := sandboxJSON{
		ID:         sb.ID,
		SnapshotID: sb.SnapshotID,
		Platform:   sb.Platform,
		Status:     statusJSON(sb.Status),
		Metadata:   sb.Metadata,
		Entrypoint: sb.Entrypoint,
		CreatedAt:  ts(sb.CreatedAt),
	}
	if out.Metadata == nil {
		out.Metadata = map[string]string{}
	}
	if out.Entrypoint == nil {
		out.Entrypoint = []string{}
	}
	if sb.Image != "" {
		out.Image = &imageSpec{URI: sb.Image}
	}
	if sb.ExpiresAt != nil {
		out.ExpiresAt = ts(*sb.ExpiresAt)
	}
	return out
}

package httpapi

import (
	"encoding/json"
	"time"

	"github.com/moat-sandbox/moat/internal/gen/lifecycleapi"
	"github.com/moat-sandbox/moat/internal/lifecycle"
)

// Wire types of the OpenSandbox Lifecycle API (specs/sandbox-lifecycle.yml).
// Optional fields are omitted, never null, as server 0.1.9 does. Where a
// generated model (internal/gen/lifecycleapi, from api/openapi) has the
// shape the handlers need, the name below is an alias of it; the remaining
// structs are checked against the models by wire_conformance_test.go.

type (
	imageSpec             = lifecycleapi.ImageSpec
	paginationInfo        = lifecycleapi.PaginationInfo
	sandboxJSON           = lifecycleapi.Sandbox
	listSandboxesResponse = lifecycleapi.ListSandboxesResponse
)

type createSandboxRequest struct {
	Image          *imageSpec          `json:"image"`
	SnapshotID     string              `json:"snapshotId"`
	TemplateID     string              `json:"templateId"`
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
	// CredentialProxy is {enabled: bool}: the Credential Vault's
	// intercepting proxy (requires networkPolicy).
	CredentialProxy json.RawMessage `json:"credentialProxy"`
}

// sandboxStatus and createSandboxResponse are still built by createResponse
// in httpapi.go; toJSON uses the generated lifecycleapi.SandboxStatus.
type sandboxStatus struct {
	State            string `json:"state"`
	Reason           string `json:"reason,omitempty"`
	Message          string `json:"message,omitempty"`
	LastTransitionAt string `json:"lastTransitionAt,omitempty"`
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
		SnapshotID: optString(sb.SnapshotID),
		Platform:   platformModel(sb.Platform),
		Status:     statusModel(sb.Status),
		Metadata:   sb.Metadata,
		Entrypoint: sb.Entrypoint,
		CreatedAt:  sb.CreatedAt.UTC(),
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
		at := sb.ExpiresAt.UTC()
		out.ExpiresAt = &at
	}
	return out
}

// statusModel is statusJSON in the generated model's type.
func statusModel(s lifecycle.Status) lifecycleapi.SandboxStatus {
	out := lifecycleapi.SandboxStatus{State: lifecycleapi.SandboxState(s.State), Reason: optString(s.Reason), Message: optString(s.Message)}
	if !s.LastTransitionAt.IsZero() {
		at := s.LastTransitionAt.UTC()
		out.LastTransitionAt = &at
	}
	return out
}

// platformModel omits an unset os or arch instead of writing "".
func platformModel(p *lifecycle.Platform) *lifecycleapi.Platform {
	if p == nil {
		return nil
	}
	out := &lifecycleapi.Platform{}
	if p.OS != "" {
		os := lifecycleapi.PlatformOs(p.OS)
		out.Os = &os
	}
	if p.Arch != "" {
		arch := lifecycleapi.PlatformArch(p.Arch)
		out.Arch = &arch
	}
	return out
}

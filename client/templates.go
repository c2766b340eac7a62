package client

import (
	"context"
	"net/http"
	"net/url"
	"time"
)

// TemplateSpec is the body of CreateTemplate: a named set of sandbox
// defaults (the same templates E2B's templateID names). Set Image or Pool.
type TemplateSpec struct {
	// ID is 1 to 63 characters of [a-z0-9._-].
	ID    string `json:"id"`
	Image string `json:"image,omitempty"`
	// Entrypoint is the start command (default tail -f /dev/null).
	Entrypoint     []string          `json:"entrypoint,omitempty"`
	Env            map[string]string `json:"env,omitempty"`
	ResourceLimits map[string]string `json:"resourceLimits,omitempty"`
	// User and Workdir are E2B's default user and working directory.
	User    string `json:"user,omitempty"`
	Workdir string `json:"workdir,omitempty"`
	// TimeoutSeconds is the lifetime of a sandbox whose create gives none.
	TimeoutSeconds int `json:"timeoutSeconds,omitempty"`
	// Pool is a warm pool creates from the template claim from.
	Pool string `json:"pool,omitempty"`
}

// Template is a template as the server reports it.
type Template struct {
	TemplateSpec
	// Tenant owns the template ("" for a built-in).
	Tenant    string    `json:"tenant,omitempty"`
	BuiltIn   bool      `json:"builtIn,omitempty"`
	CreatedAt time.Time `json:"createdAt,omitzero"`
}

func templatePath(id string) string { return "/templates/" + url.PathEscape(id) }

// CreateTemplate creates a template in the caller's tenant (never retried).
func (c *Client) CreateTemplate(ctx context.Context, spec TemplateSpec) (*Template, error) {
	var t Template
	if err := c.lc.json(ctx, &call{method: http.MethodPost, path: "/templates"}, spec, &t); err != nil {
		return nil, err
	}
	return &t, nil
}

// GetTemplate returns one template.
func (c *Client) GetTemplate(ctx context.Context, id string) (*Template, error) {
	var t Template
	if err := c.lc.json(ctx, &call{method: http.MethodGet, path: templatePath(id)}, nil, &t); err != nil {
		return nil, err
	}
	return &t, nil
}

// ListTemplates returns the templates the caller can create from.
func (c *Client) ListTemplates(ctx context.Context) ([]Template, error) {
	var out struct {
		Items []Template `json:"items"`
	}
	if err := c.lc.json(ctx, &call{method: http.MethodGet, path: "/templates"}, nil, &out); err != nil {
		return nil, err
	}
	return out.Items, nil
}

// DeleteTemplate deletes a template of the caller's tenant.
func (c *Client) DeleteTemplate(ctx context.Context, id string) error {
	return c.lc.json(ctx, &call{method: http.MethodDelete, path: templatePath(id)}, nil, nil)
}

package client

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"sort"
	"strconv"
	"strings"
	"time"
)

// AgentPort is the port of the in-sandbox agent (execd).
const AgentPort = 44772

// EgressPort is the port of the egress policy API.
const EgressPort = 18080

// Sandbox states.
const (
	StatePending    = "Pending"
	StateRunning    = "Running"
	StatePausing    = "Pausing"
	StatePaused     = "Paused"
	StateResuming   = "Resuming"
	StateStopping   = "Stopping"
	StateTerminated = "Terminated"
	StateFailed     = "Failed"
)

// ImageSpec is an OCI image reference with optional registry credentials.
type ImageSpec struct {
	URI  string     `json:"uri"`
	Auth *ImageAuth `json:"auth,omitempty"`
}

// ImageAuth holds per-request registry credentials (never echoed back).
type ImageAuth struct {
	Username string `json:"username"`
	Password string `json:"password"`
}

// Platform is an OS/architecture pair.
type Platform struct {
	OS   string `json:"os,omitempty"`
	Arch string `json:"arch,omitempty"`
}

// NetworkRule is one egress rule.
type NetworkRule struct {
	// Action is "allow" or "deny" (server default: deny).
	Action string `json:"action,omitempty"`
	// Target is a domain, "*.domain", an IP or a CIDR.
	Target string `json:"target"`
}

// NetworkPolicy is an egress policy: first matching rule wins, else
// DefaultAction.
type NetworkPolicy struct {
	DefaultAction string        `json:"defaultAction,omitempty"`
	Egress        []NetworkRule `json:"egress,omitempty"`
}

// CreateRequest describes a sandbox to create. Set Image, SnapshotID or
// TemplateID.
type CreateRequest struct {
	Image      *ImageSpec `json:"image,omitempty"`
	SnapshotID string     `json:"snapshotId,omitempty"`
	// TemplateID creates from a template (see CreateTemplate): what the
	// request leaves unset comes from it.
	TemplateID string `json:"templateId,omitempty"`
	// Entrypoint is required with Image.
	Entrypoint []string `json:"entrypoint,omitempty"`
	// Timeout until the sandbox expires (at least a minute); 0 means no
	// expiry (manual cleanup). Sent as whole seconds.
	Timeout time.Duration `json:"-"`
	// ResourceLimits uses Kubernetes quantities: "cpu", "memory", "pids", "disk".
	ResourceLimits map[string]string `json:"resourceLimits,omitempty"`
	Env            map[string]string `json:"env,omitempty"`
	Metadata       map[string]string `json:"metadata,omitempty"`
	// Extensions: "poolRef", "access.renew.extend.seconds", "moat.runtime".
	Extensions    map[string]string `json:"extensions,omitempty"`
	Platform      *Platform         `json:"platform,omitempty"`
	NetworkPolicy *NetworkPolicy    `json:"networkPolicy,omitempty"`
	// CredentialProxy turns on the Credential Vault's intercepting proxy
	// (needs NetworkPolicy); see SandboxHandle.CreateCredentialVault.
	CredentialProxy *CredentialProxy `json:"credentialProxy,omitempty"`
	// Volumes are host paths or named volumes (pvc) to mount.
	Volumes []Volume `json:"volumes,omitempty"`
}

// createWire is CreateRequest as sent, with the timeout in seconds.
type createWire struct {
	CreateRequest
	Timeout *int64 `json:"timeout,omitempty"`
	Count   int    `json:"count,omitempty"`
}

func (r CreateRequest) wire(count int) createWire {
	w := createWire{CreateRequest: r, Count: count}
	if r.Timeout > 0 {
		s := int64((r.Timeout + time.Second - 1) / time.Second)
		w.Timeout = &s
	}
	return w
}

// SandboxStatus is the state of a sandbox.
type SandboxStatus struct {
	State            string    `json:"state"`
	Reason           string    `json:"reason,omitempty"`
	Message          string    `json:"message,omitempty"`
	LastTransitionAt time.Time `json:"lastTransitionAt,omitzero"`
}

// Sandbox is a sandbox as the server reports it. Image and SnapshotID are
// not set on the result of CreateSandbox and CreateBatch.
type Sandbox struct {
	ID         string            `json:"id"`
	Image      *ImageSpec        `json:"image,omitempty"`
	SnapshotID string            `json:"snapshotId,omitempty"`
	Platform   *Platform         `json:"platform,omitempty"`
	Status     SandboxStatus     `json:"status"`
	Metadata   map[string]string `json:"metadata"`
	Entrypoint []string          `json:"entrypoint"`
	// ExpiresAt is nil for manual-cleanup sandboxes.
	ExpiresAt *time.Time `json:"expiresAt,omitempty"`
	CreatedAt time.Time  `json:"createdAt"`
}

// Pagination describes one page of a list.
type Pagination struct {
	Page        int  `json:"page"`
	PageSize    int  `json:"pageSize"`
	TotalItems  int  `json:"totalItems"`
	TotalPages  int  `json:"totalPages"`
	HasNextPage bool `json:"hasNextPage"`
}

// SandboxList is one page of sandboxes.
type SandboxList struct {
	Items      []Sandbox  `json:"items"`
	Pagination Pagination `json:"pagination"`
}

// ListOptions filters ListSandboxes. Zero values mean no filter and the
// server defaults (page 1, 20 per page).
type ListOptions struct {
	// States are ORed, matched case-insensitively.
	States []string
	// Metadata pairs must all match.
	Metadata map[string]string
	Page     int
	PageSize int
}

// Endpoint is how to reach a port inside a sandbox.
type Endpoint struct {
	// Address is host[:port][/path], normally without a scheme.
	Address string `json:"endpoint"`
	// Headers must be sent with every request to the endpoint.
	Headers map[string]string `json:"headers,omitempty"`
}

func sandboxPath(id string, rest ...string) string {
	p := "/sandboxes/" + url.PathEscape(id)
	for _, r := range rest {
		p += "/" + r
	}
	return p
}

// CreateSandbox creates a sandbox and returns once it is provisioned
// (normally Running). It is never retried.
func (c *Client) CreateSandbox(ctx context.Context, req CreateRequest) (*Sandbox, error) {
	var sb Sandbox
	if err := c.lc.json(ctx, &call{method: http.MethodPost, path: "/sandboxes"}, req.wire(0), &sb); err != nil {
		return nil, err
	}
	return &sb, nil
}

// CreateBatch creates count identical sandboxes in one call (all or
// nothing). With Extensions["poolRef"], idle sandboxes of that pool are
// claimed first.
func (c *Client) CreateBatch(ctx context.Context, req CreateRequest, count int) ([]Sandbox, error) {
	if count < 1 {
		return nil, fmt.Errorf("client: batch count %d: %w", count, ErrInvalid)
	}
	var out struct {
		Items []Sandbox `json:"items"`
	}
	if err := c.lc.json(ctx, &call{method: http.MethodPost, path: "/sandboxes/batch"}, req.wire(count), &out); err != nil {
		return nil, err
	}
	return out.Items, nil
}

// GetSandbox returns one sandbox.
func (c *Client) GetSandbox(ctx context.Context, id string) (*Sandbox, error) {
	var sb Sandbox
	if err := c.lc.json(ctx, &call{method: http.MethodGet, path: sandboxPath(id)}, nil, &sb); err != nil {
		return nil, err
	}
	return &sb, nil
}

// ListSandboxes returns one page of sandboxes.
func (c *Client) ListSandboxes(ctx context.Context, opts ListOptions) (*SandboxList, error) {
	q := url.Values{}
	for _, s := range opts.States {
		q.Add("state", s)
	}
	if len(opts.Metadata) > 0 {
		keys := make([]string, 0, len(opts.Metadata))
		for k := range opts.Metadata {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		pairs := make([]string, 0, len(keys))
		for _, k := range keys {
			pairs = append(pairs, url.QueryEscape(k)+"="+url.QueryEscape(opts.Metadata[k]))
		}
		q.Set("metadata", strings.Join(pairs, "&"))
	}
	if opts.Page > 0 {
		q.Set("page", strconv.Itoa(opts.Page))
	}
	if opts.PageSize > 0 {
		q.Set("pageSize", strconv.Itoa(opts.PageSize))
	}
	var out SandboxList
	if err := c.lc.json(ctx, &call{method: http.MethodGet, path: "/sandboxes", query: q}, nil, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// DeleteSandbox deletes a sandbox.
func (c *Client) DeleteSandbox(ctx context.Context, id string) error {
	return c.lc.json(ctx, &call{method: http.MethodDelete, path: sandboxPath(id)}, nil, nil)
}

// Pause freezes a running sandbox (synchronous: Paused on return).
func (c *Client) Pause(ctx context.Context, id string) error {
	return c.lc.json(ctx, &call{method: http.MethodPost, path: sandboxPath(id, "pause")}, nil, nil)
}

// Hibernate hibernates a running sandbox (moat's pause?mode=hibernate):
// its processes are stopped and their memory freed; Resume wakes it. On
// gVisor the processes continue where they were, on runc and crun they
// start afresh on the kept writable layer.
func (c *Client) Hibernate(ctx context.Context, id string) error {
	return c.lc.json(ctx, &call{method: http.MethodPost, path: sandboxPath(id, "pause"),
		query: url.Values{"mode": {"hibernate"}}}, nil, nil)
}

// Resume thaws a paused sandbox.
func (c *Client) Resume(ctx context.Context, id string) error {
	return c.lc.json(ctx, &call{method: http.MethodPost, path: sandboxPath(id, "resume")}, nil, nil)
}

// Renew moves the expiry of a sandbox to at and returns the new expiry.
func (c *Client) Renew(ctx context.Context, id string, at time.Time) (time.Time, error) {
	in := struct {
		ExpiresAt string `json:"expiresAt"`
	}{at.UTC().Format(time.RFC3339Nano)}
	var out struct {
		ExpiresAt time.Time `json:"expiresAt"`
	}
	err := c.lc.json(ctx, &call{method: http.MethodPost, path: sandboxPath(id, "renew-expiration"), idempotent: true}, in, &out)
	return out.ExpiresAt, err
}

// PatchMetadata applies a JSON Merge Patch to the sandbox metadata: a
// non-nil value adds or replaces a key, nil deletes it.
func (c *Client) PatchMetadata(ctx context.Context, id string, patch map[string]*string) (*Sandbox, error) {
	if patch == nil {
		patch = map[string]*string{}
	}
	var sb Sandbox
	cl := &call{method: http.MethodPatch, path: sandboxPath(id, "metadata"), contentType: "application/merge-patch+json", idempotent: true}
	if err := c.lc.json(ctx, cl, patch, &sb); err != nil {
		return nil, err
	}
	return &sb, nil
}

// Endpoint resolves how to reach port inside a sandbox; with
// useServerProxy the address goes through the server's proxy route.
func (c *Client) Endpoint(ctx context.Context, id string, port int, useServerProxy bool) (*Endpoint, error) {
	q := url.Values{}
	if useServerProxy {
		q.Set("use_server_proxy", "true")
	}
	var ep Endpoint
	if err := c.lc.json(ctx, &call{method: http.MethodGet, path: sandboxPath(id, "endpoints", strconv.Itoa(port)), query: q}, nil, &ep); err != nil {
		return nil, err
	}
	return &ep, nil
}

// endpointURL turns an endpoint address into an absolute URL. An address
// without a scheme gets the base URL's scheme when it names the server's
// host, else http.
func (c *Client) endpointURL(addr string) (string, error) {
	addr = strings.TrimSuffix(addr, "/")
	if strings.HasPrefix(addr, "http://") || strings.HasPrefix(addr, "https://") {
		return addr, nil
	}
	scheme := "http"
	host, _, _ := strings.Cut(addr, "/")
	if host == c.base.Host {
		scheme = c.base.Scheme
	}
	u := scheme + "://" + addr
	if _, err := url.Parse(u); err != nil {
		return "", fmt.Errorf("client: endpoint %q: %w", addr, err)
	}
	return u, nil
}

// endpointTransport resolves a port of a sandbox into a transport.
func (c *Client) endpointTransport(ctx context.Context, id string, port int, useServerProxy bool) (*transport, error) {
	ep, err := c.Endpoint(ctx, id, port, useServerProxy)
	if err != nil {
		return nil, err
	}
	base, err := c.endpointURL(ep.Address)
	if err != nil {
		return nil, err
	}
	h := http.Header{}
	for k, v := range ep.Headers {
		h.Set(k, v)
	}
	return &transport{hc: c.lc.hc, base: base, header: h, retry: c.lc.retry}, nil
}

package mcp

import (
	"context"
	"fmt"
	"strings"
	"time"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/moat-sandbox/moat/client"
)

// CreateInput are the arguments of sandbox_create.
type CreateInput struct {
	Image          string            `json:"image" jsonschema:"OCI image reference to boot, e.g. docker.io/library/python:3.12 or docker.io/library/ubuntu:24.04"`
	Entrypoint     []string          `json:"entrypoint,omitempty" jsonschema:"Main process as argv (optional). The default keeps the sandbox idle and alive (tail -f /dev/null) so you can exec into it; only set this to run a long-lived service."`
	TimeoutSeconds int               `json:"timeout_seconds,omitempty" jsonschema:"Seconds until the sandbox expires and is deleted automatically (at least 60). Omit for the server's MCP default."`
	Env            map[string]string `json:"env,omitempty" jsonschema:"Environment variables of the sandbox, visible to every command run in it."`
	Metadata       map[string]string `json:"metadata,omitempty" jsonschema:"Labels to find the sandbox again with sandbox_list (keys and values as Kubernetes labels)."`
	Resources      map[string]string `json:"resources,omitempty" jsonschema:"Resource limits as Kubernetes quantities; keys cpu (e.g. 500m or 2), memory (e.g. 512Mi), pids (e.g. 256), disk (e.g. 2Gi)."`
}

// SandboxInfo describes one sandbox.
type SandboxInfo struct {
	ID        string            `json:"id" jsonschema:"Sandbox id: pass it as sandbox_id to the other tools."`
	State     string            `json:"state" jsonschema:"Pending, Running, Pausing, Paused, Resuming, Stopping, Terminated or Failed."`
	Reason    string            `json:"reason,omitempty" jsonschema:"Machine reason of the last state change (set for Failed)."`
	Message   string            `json:"message,omitempty" jsonschema:"Human explanation of the last state change."`
	Image     string            `json:"image,omitempty" jsonschema:"Image the sandbox booted from."`
	Metadata  map[string]string `json:"metadata,omitempty" jsonschema:"Labels of the sandbox."`
	CreatedAt string            `json:"created_at,omitempty" jsonschema:"Creation time (RFC 3339)."`
	ExpiresAt string            `json:"expires_at,omitempty" jsonschema:"When the sandbox expires (RFC 3339); absent when it never expires."`
}

// IDInput names one sandbox.
type IDInput struct {
	SandboxID string `json:"sandbox_id" jsonschema:"Id returned by sandbox_create or sandbox_list."`
}

// ListInput are the arguments of sandbox_list.
type ListInput struct {
	States   []string          `json:"states,omitempty" jsonschema:"Only sandboxes in one of these states (e.g. [\"Running\",\"Paused\"]). Default: all."`
	Metadata map[string]string `json:"metadata,omitempty" jsonschema:"Only sandboxes whose labels include all of these pairs."`
	Page     int               `json:"page,omitempty" jsonschema:"1-based page number (default 1)."`
	PageSize int               `json:"page_size,omitempty" jsonschema:"Sandboxes per page, 1 to 200 (default 50)."`
}

// ListOutput is the result of sandbox_list.
type ListOutput struct {
	Sandboxes []SandboxInfo `json:"sandboxes" jsonschema:"The sandboxes of this page."`
	Total     int           `json:"total" jsonschema:"Number of sandboxes matching the filters, over all pages."`
	HasMore   bool          `json:"has_more" jsonschema:"True when a further page exists."`
}

// DeleteOutput is the result of sandbox_delete.
type DeleteOutput struct {
	SandboxID string `json:"sandbox_id"`
	Deleted   bool   `json:"deleted" jsonschema:"True once the sandbox and its filesystem are gone."`
}

// hint returns a pointer for the optional ToolAnnotations hints.
func hint(b bool) *bool { return &b }

func (s *Server) addTools() {
	sdk.AddTool(s.srv, &sdk.Tool{
		Name:  "sandbox_create",
		Title: "Create sandbox",
		Description: "Create an isolated Linux sandbox from an OCI image and wait until it is Running (this can take a while the first time an image is pulled). " +
			"Returns the sandbox, whose id the other tools take as sandbox_id. The sandbox expires after timeout_seconds; delete it with sandbox_delete when done.",
		Annotations: &sdk.ToolAnnotations{DestructiveHint: hint(false), OpenWorldHint: hint(true)},
	}, s.create)
	sdk.AddTool(s.srv, &sdk.Tool{
		Name:        "sandbox_list",
		Title:       "List sandboxes",
		Description: "List sandboxes on the server, optionally filtered by state and metadata labels. Use it to find sandboxes created earlier.",
		Annotations: &sdk.ToolAnnotations{ReadOnlyHint: true, OpenWorldHint: hint(false)},
	}, s.list)
	sdk.AddTool(s.srv, &sdk.Tool{
		Name:        "sandbox_get",
		Title:       "Get sandbox",
		Description: "Get the state, image, labels and expiry of one sandbox.",
		Annotations: &sdk.ToolAnnotations{ReadOnlyHint: true, OpenWorldHint: hint(false)},
	}, s.get)
	sdk.AddTool(s.srv, &sdk.Tool{
		Name:        "sandbox_delete",
		Title:       "Delete sandbox",
		Description: "Delete a sandbox: kills every process in it and discards its filesystem. This cannot be undone.",
		Annotations: &sdk.ToolAnnotations{DestructiveHint: hint(true), IdempotentHint: true, OpenWorldHint: hint(false)},
	}, s.delete)
	sdk.AddTool(s.srv, &sdk.Tool{
		Name:        "sandbox_pause",
		Title:       "Pause sandbox",
		Description: "Freeze every process of a Running sandbox (memory and files are kept; exec does not work while Paused). Resume it with sandbox_resume.",
		Annotations: &sdk.ToolAnnotations{DestructiveHint: hint(false), OpenWorldHint: hint(false)},
	}, s.pause)
	sdk.AddTool(s.srv, &sdk.Tool{
		Name:        "sandbox_resume",
		Title:       "Resume sandbox",
		Description: "Thaw a Paused sandbox so it runs again.",
		Annotations: &sdk.ToolAnnotations{DestructiveHint: hint(false), OpenWorldHint: hint(false)},
	}, s.resume)
	s.addExecTools()
	s.addFileTools()
}

func info(sb *client.Sandbox) SandboxInfo {
	out := SandboxInfo{ID: sb.ID, State: sb.Status.State, Reason: sb.Status.Reason, Message: sb.Status.Message}
	if sb.Image != nil {
		out.Image = sb.Image.URI
	}
	if len(sb.Metadata) > 0 {
		out.Metadata = sb.Metadata
	}
	if !sb.CreatedAt.IsZero() {
		out.CreatedAt = sb.CreatedAt.UTC().Format(time.RFC3339)
	}
	if sb.ExpiresAt != nil {
		out.ExpiresAt = sb.ExpiresAt.UTC().Format(time.RFC3339)
	}
	return out
}

// minSandboxTimeout is the API's lower bound on a sandbox timeout.
const minSandboxTimeout = 60

func (s *Server) create(ctx context.Context, _ *sdk.CallToolRequest, in CreateInput) (*sdk.CallToolResult, SandboxInfo, error) {
	in.Image = strings.TrimSpace(in.Image)
	switch {
	case in.Image == "":
		return nil, SandboxInfo{}, invalidf("image is required, e.g. docker.io/library/python:3.12")
	case in.TimeoutSeconds < 0 || in.TimeoutSeconds > 0 && in.TimeoutSeconds < minSandboxTimeout:
		return nil, SandboxInfo{}, invalidf("timeout_seconds must be at least %d", minSandboxTimeout)
	}
	for _, w := range in.Entrypoint {
		if w == "" {
			return nil, SandboxInfo{}, invalidf("entrypoint words must not be empty")
		}
	}
	req := client.CreateRequest{
		Image:          &client.ImageSpec{URI: in.Image},
		Entrypoint:     in.Entrypoint,
		Timeout:        s.opts.SandboxTimeout,
		Env:            in.Env,
		Metadata:       in.Metadata,
		ResourceLimits: in.Resources,
	}
	if len(req.Entrypoint) == 0 {
		// The API requires an entrypoint with an image; this one keeps the
		// sandbox alive until it is deleted or expires.
		req.Entrypoint = []string{"tail", "-f", "/dev/null"}
	}
	if in.TimeoutSeconds > 0 {
		req.Timeout = time.Duration(in.TimeoutSeconds) * time.Second
	}
	sb, err := s.opts.Client.CreateSandbox(ctx, req)
	if err != nil {
		return nil, SandboxInfo{}, toToolError(ctx, err)
	}
	running, err := s.waitRunning(ctx, sb)
	if err != nil {
		// Do not leak a sandbox the caller never got an id for.
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		derr := s.opts.Client.DeleteSandbox(dctx, sb.ID)
		cancel()
		te := classify(ctx, err)
		if derr == nil || client.IsNotFound(derr) {
			te.Message += " (the sandbox was deleted)"
		} else {
			te.Message += fmt.Sprintf(" (deleting sandbox %s failed too: %v)", sb.ID, derr)
		}
		return nil, SandboxInfo{}, te
	}
	out := info(running)
	if out.Image == "" {
		out.Image = in.Image
	}
	return nil, out, nil
}

// waitRunning polls sb until it is Running; Failed or Terminated end the
// wait with an error, as does Options.WaitTimeout.
func (s *Server) waitRunning(ctx context.Context, sb *client.Sandbox) (*client.Sandbox, error) {
	ctx, cancel := context.WithTimeout(ctx, s.opts.WaitTimeout)
	defer cancel()
	delay := 100 * time.Millisecond
	for {
		switch sb.Status.State {
		case client.StateRunning:
			return sb, nil
		case client.StateFailed, client.StateTerminated:
			msg := fmt.Sprintf("sandbox %s is %s", sb.ID, sb.Status.State)
			for _, d := range []string{sb.Status.Reason, sb.Status.Message} {
				if d != "" {
					msg += ": " + d
				}
			}
			return nil, &toolError{Code: codeSandboxFailed, Message: msg}
		}
		select {
		case <-ctx.Done():
			return nil, &toolError{Code: codeTimeout, Message: fmt.Sprintf("sandbox %s still %s after %s", sb.ID, sb.Status.State, s.opts.WaitTimeout)}
		case <-time.After(delay):
		}
		delay = min(delay*2, 2*time.Second)
		next, err := s.opts.Client.GetSandbox(ctx, sb.ID)
		if err != nil {
			if ctx.Err() != nil {
				return nil, &toolError{Code: codeTimeout, Message: fmt.Sprintf("sandbox %s still %s after %s", sb.ID, sb.Status.State, s.opts.WaitTimeout)}
			}
			return nil, err
		}
		sb = next
	}
}

const (
	defaultPageSize = 50
	maxPageSize     = 200
)

func (s *Server) list(ctx context.Context, _ *sdk.CallToolRequest, in ListInput) (*sdk.CallToolResult, ListOutput, error) {
	switch {
	case in.Page < 0:
		return nil, ListOutput{}, invalidf("page must be at least 1")
	case in.PageSize < 0 || in.PageSize > maxPageSize:
		return nil, ListOutput{}, invalidf("page_size must be between 1 and %d", maxPageSize)
	}
	if in.PageSize == 0 {
		in.PageSize = defaultPageSize
	}
	l, err := s.opts.Client.ListSandboxes(ctx, client.ListOptions{States: in.States, Metadata: in.Metadata, Page: in.Page, PageSize: in.PageSize})
	if err != nil {
		return nil, ListOutput{}, toToolError(ctx, err)
	}
	out := ListOutput{Sandboxes: make([]SandboxInfo, 0, len(l.Items)), Total: l.Pagination.TotalItems, HasMore: l.Pagination.HasNextPage}
	for i := range l.Items {
		out.Sandboxes = append(out.Sandboxes, info(&l.Items[i]))
	}
	return nil, out, nil
}

func checkID(id string) error {
	if strings.TrimSpace(id) == "" {
		return invalidf("sandbox_id is required (the id returned by sandbox_create or sandbox_list)")
	}
	return nil
}

func (s *Server) get(ctx context.Context, _ *sdk.CallToolRequest, in IDInput) (*sdk.CallToolResult, SandboxInfo, error) {
	if err := checkID(in.SandboxID); err != nil {
		return nil, SandboxInfo{}, err
	}
	sb, err := s.opts.Client.GetSandbox(ctx, in.SandboxID)
	if err != nil {
		return nil, SandboxInfo{}, toToolError(ctx, err)
	}
	return nil, info(sb), nil
}

func (s *Server) delete(ctx context.Context, _ *sdk.CallToolRequest, in IDInput) (*sdk.CallToolResult, DeleteOutput, error) {
	if err := checkID(in.SandboxID); err != nil {
		return nil, DeleteOutput{}, err
	}
	if err := s.opts.Client.DeleteSandbox(ctx, in.SandboxID); err != nil {
		return nil, DeleteOutput{}, toToolError(ctx, err)
	}
	return nil, DeleteOutput{SandboxID: in.SandboxID, Deleted: true}, nil
}

// transition runs a synchronous state change and reports the new state.
func (s *Server) transition(ctx context.Context, id string, op func(context.Context, string) error) (SandboxInfo, error) {
	if err := checkID(id); err != nil {
		return SandboxInfo{}, err
	}
	if err := op(ctx, id); err != nil {
		return SandboxInfo{}, toToolError(ctx, err)
	}
	sb, err := s.opts.Client.GetSandbox(ctx, id)
	if err != nil {
		return SandboxInfo{}, toToolError(ctx, err)
	}
	return info(sb), nil
}

func (s *Server) pause(ctx context.Context, _ *sdk.CallToolRequest, in IDInput) (*sdk.CallToolResult, SandboxInfo, error) {
	out, err := s.transition(ctx, in.SandboxID, s.opts.Client.Pause)
	return nil, out, err
}

func (s *Server) resume(ctx context.Context, _ *sdk.CallToolRequest, in IDInput) (*sdk.CallToolResult, SandboxInfo, error) {
	out, err := s.transition(ctx, in.SandboxID, s.opts.Client.Resume)
	return nil, out, err
}

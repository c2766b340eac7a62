package agentproto

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"time"

	"github.com/moat-sandbox/moat/internal/errdefs"
)

// Client drives agents. Endpoints are "host:port" (a runtime's Endpoint
// for Port). Every method returns an errdefs class: ErrUnavailable when the
// agent cannot be reached or answers with an unexpected status,
// ErrDeadlineExceeded when WaitReady gives up.
type Client struct {
	// HTTP sends the requests (nil: http.DefaultClient).
	HTTP *http.Client
}

func (c *Client) http() *http.Client {
	if c == nil || c.HTTP == nil {
		return http.DefaultClient
	}
	return c.HTTP
}

// Ping asks the agent at endpoint whether it serves, with token ("" for an
// agent without auth), and returns what it reports about itself.
func (c *Client) Ping(ctx context.Context, endpoint, token string) (Info, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+endpoint+PingPath, nil)
	if err != nil {
		return Info{}, fmt.Errorf("agent %s: %v: %w", endpoint, err, errdefs.ErrInvalidArgument)
	}
	if token != "" {
		req.Header.Set(TokenHeader, token)
	}
	resp, err := c.http().Do(req)
	if err != nil {
		return Info{}, fmt.Errorf("agent %s: %v: %w", endpoint, err, errdefs.ErrUnavailable)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return Info{}, fmt.Errorf("agent %s: /ping status %d: %w", endpoint, resp.StatusCode, errdefs.ErrUnavailable)
	}
	v, ok := ParseVersion(resp.Header.Get(VersionHeader))
	if !ok {
		return Info{}, fmt.Errorf("agent %s: bad %s %q: %w", endpoint, VersionHeader, resp.Header.Get(VersionHeader), errdefs.ErrUnavailable)
	}
	return Info{Version: v}, nil
}

// WaitReady polls Ping until the agent answers 200 or ctx is done (then
// ErrDeadlineExceeded with the last failure). The first polls are a few
// hundred microseconds apart: a fresh agent is up within milliseconds.
func (c *Client) WaitReady(ctx context.Context, endpoint, token string) (Info, error) {
	const fastAttempts = 16
	delay := 250 * time.Microsecond
	attempt := 0
	var last error
	for {
		info, err := c.Ping(ctx, endpoint, token)
		if err == nil {
			return info, nil
		}
		if last == nil || ctx.Err() == nil {
			last = err // not the failure the deadline itself caused
		}
		t := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
			return Info{}, fmt.Errorf("not ready: %v: %w", last, errdefs.ErrDeadlineExceeded)
		case <-t.C:
		}
		// Every 250 µs for the first few milliseconds (an agent usually
		// listens within them), then backing off to every 2 ms.
		if attempt++; attempt > fastAttempts && delay < 2*time.Millisecond {
			delay *= 2
		}
	}
}

// SetEnv adds env to the environment of every later command of the agent
// (POST EnvPath).
func (c *Client) SetEnv(ctx context.Context, endpoint, token string, env map[string]string) error {
	return c.post(ctx, endpoint, token, EnvPath, SetEnvRequest{Envs: env})
}

// RotateToken replaces the agent's access token old with token (POST
// TokenPath, authorized by old).
func (c *Client) RotateToken(ctx context.Context, endpoint, old, token string) error {
	return c.post(ctx, endpoint, old, TokenPath, SetTokenRequest{Token: token})
}

// post sends body as JSON to path and wants 200.
func (c *Client) post(ctx context.Context, endpoint, token, path string, body any) error {
	data, err := json.Marshal(body)
	if err != nil {
		return fmt.Errorf("agent %s: %v: %w", endpoint, err, errdefs.ErrInvalidArgument)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+endpoint+path, bytes.NewReader(data))
	if err != nil {
		return fmt.Errorf("agent %s: %v: %w", endpoint, err, errdefs.ErrInvalidArgument)
	}
	req.Header.Set("Content-Type", "application/json")
	if token != "" {
		req.Header.Set(TokenHeader, token)
	}
	resp, err := c.http().Do(req)
	if err != nil {
		return fmt.Errorf("agent %s: %v: %w", endpoint, err, errdefs.ErrUnavailable)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("agent %s: %s status %d: %w", endpoint, path, resp.StatusCode, errdefs.ErrUnavailable)
	}
	return nil
}

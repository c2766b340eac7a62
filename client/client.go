// Package client is the Go SDK for moat, an OpenSandbox-compatible sandbox
// server. It speaks the wire contract in api/openapi (lifecycle.yaml,
// execd.yaml, egress.yaml) with the standard library, plus coder/websocket for
// PTY sessions (pty.go).
//
// A Client talks to the lifecycle server (`moat serve`); a SandboxHandle,
// returned by Client.Sandbox, talks to the agent (execd) inside one sandbox
// and to its egress policy API, through the endpoints the server resolves.
//
// Every method that does I/O takes a context first. Errors returned by the
// server are *APIError values; use IsNotFound, IsConflict, IsInvalid or
// errors.Is with ErrNotFound, ErrConflict, ErrInvalid, ErrUnauthorized.
package client

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
)

// APIKeyHeader is the lifecycle API key header.
const APIKeyHeader = "OPEN-SANDBOX-API-KEY"

// Option configures a Client.
type Option func(*Client) error

// WithAPIKey sends key in OPEN-SANDBOX-API-KEY on every lifecycle call.
func WithAPIKey(key string) Option {
	return func(c *Client) error {
		c.lc.header.Set(APIKeyHeader, key)
		return nil
	}
}

// WithHTTPClient replaces the HTTP client (default: a new http.Client with
// no overall timeout, since command output streams for as long as it runs).
func WithHTTPClient(hc *http.Client) Option {
	return func(c *Client) error {
		if hc == nil {
			return errors.New("client: nil http.Client")
		}
		c.lc.hc = hc
		return nil
	}
}

// WithRetry retries idempotent calls (GET, PUT, DELETE and calls documented
// as idempotent) up to max more times after the first attempt, when the
// answer is 429, 502, 503 or 504 or the connection fails. The wait before
// retry n (1-based) is backoff*2^(n-1) (doubling stops at 30s), or the
// Retry-After of the answer if it is longer. Creates, pause, resume, command runs and uploads are never
// retried.
func WithRetry(max int, backoff time.Duration) Option {
	return func(c *Client) error {
		if max < 0 || backoff < 0 {
			return errors.New("client: WithRetry needs max >= 0 and backoff >= 0")
		}
		c.lc.retry = retryPolicy{max: max, backoff: backoff}
		return nil
	}
}

// WithHeader adds a header to every lifecycle call (not to sandbox
// endpoints, which get the headers the server hands out).
func WithHeader(key, value string) Option {
	return func(c *Client) error {
		c.lc.header.Add(key, value)
		return nil
	}
}

// WithServerProxy makes Client.Sandbox reach the agent through the server's
// proxy route (use_server_proxy=true) instead of the sandbox address, which
// is reachable only from the server host.
func WithServerProxy() Option {
	return func(c *Client) error {
		c.serverProxy = true
		return nil
	}
}

// Client is a lifecycle API client. It is safe for concurrent use.
type Client struct {
	base        *url.URL // scheme://host[/prefix], without the /v1 suffix
	lc          *transport
	serverProxy bool
	// streamSilence overrides defaultStreamSilence (tests).
	streamSilence time.Duration
}

// New returns a client for the server at baseURL (e.g.
// "http://127.0.0.1:8080"; a trailing "/v1" is accepted).
func New(baseURL string, opts ...Option) (*Client, error) {
	u, err := url.Parse(baseURL)
	if err != nil {
		return nil, fmt.Errorf("client: base URL: %w", err)
	}
	if (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("client: base URL %q must be http(s)://host[:port]", baseURL)
	}
	u.Path = strings.TrimSuffix(strings.TrimSuffix(u.Path, "/"), "/v1")
	u.RawQuery, u.Fragment = "", ""
	c := &Client{base: u, lc: &transport{hc: &http.Client{}, base: u.String() + "/v1", header: http.Header{}}}
	for _, o := range opts {
		if err := o(c); err != nil {
			return nil, err
		}
	}
	return c, nil
}

type retryPolicy struct {
	max     int
	backoff time.Duration
}

// maxBackoff caps the doubling of the retry wait.
const maxBackoff = 30 * time.Second

// wait returns the pause before retry n (1-based): backoff doubled n-1
// times, no longer doubled once it reaches maxBackoff.
func (p retryPolicy) wait(n int) time.Duration {
	d := p.backoff
	for i := 1; i < n && d < maxBackoff; i++ {
		d *= 2
	}
	return d
}

// transport sends requests to one base URL with fixed headers and retries.
type transport struct {
	hc     *http.Client
	base   string // absolute URL prefix, no trailing slash
	header http.Header
	retry  retryPolicy
}

// call is one API request.
type call struct {
	method      string
	path        string // appended to the base
	query       url.Values
	body        []byte // replayable body
	stream      io.Reader
	contentType string
	header      http.Header
	idempotent  bool  // retry allowed (GET/PUT/DELETE are implicitly)
	want        []int // accepted statuses; default 2xx
}

func (t *transport) canRetry(c *call) bool {
	if c.stream != nil {
		return false
	}
	switch c.method {
	case http.MethodGet, http.MethodHead, http.MethodPut, http.MethodDelete:
		return true
	}
	return c.idempotent
}

func retryable(status int) bool {
	switch status {
	case http.StatusTooManyRequests, http.StatusBadGateway, http.StatusServiceUnavailable, http.StatusGatewayTimeout:
		return true
	}
	return false
}

// do sends c and returns the response if its status is accepted; otherwise
// the body is read into an *APIError. The caller closes the body.
func (t *transport) do(ctx context.Context, c *call) (*http.Response, error) {
	attempts := 1
	if t.canRetry(c) {
		attempts += t.retry.max
	}
	u := t.base + c.path
	if len(c.query) > 0 {
		u += "?" + c.query.Encode()
	}
	var lastErr error
	for i := range attempts {
		if i > 0 {
			wait := t.retry.wait(i)
			var ae *APIError
			if errors.As(lastErr, &ae) && ae.retryAfter > wait {
				wait = ae.retryAfter
			}
			if err := sleep(ctx, wait); err != nil {
				return nil, err
			}
		}
		resp, err := t.once(ctx, c, u)
		if err != nil {
			if ctx.Err() != nil {
				return nil, err
			}
			lastErr = err
			continue // connection error
		}
		if accepted(resp.StatusCode, c.want) {
			return resp, nil
		}
		lastErr = readAPIError(resp)
		if !retryable(resp.StatusCode) {
			return nil, lastErr
		}
	}
	return nil, lastErr
}

func (t *transport) once(ctx context.Context, c *call, u string) (*http.Response, error) {
	var body io.Reader
	switch {
	case c.stream != nil:
		body = c.stream
	case c.body != nil:
		body = bytes.NewReader(c.body)
	}
	req, err := http.NewRequestWithContext(ctx, c.method, u, body)
	if err != nil {
		return nil, fmt.Errorf("client: %s %s: %w", c.method, c.path, err)
	}
	for k, vs := range t.header {
		req.Header[k] = append([]string(nil), vs...)
	}
	for k, vs := range c.header {
		req.Header[k] = append([]string(nil), vs...)
	}
	if c.contentType != "" {
		req.Header.Set("Content-Type", c.contentType)
	}
	resp, err := t.hc.Do(req)
	if err != nil {
		return nil, fmt.Errorf("client: %s %s: %w", c.method, c.path, err)
	}
	return resp, nil
}

func accepted(status int, want []int) bool {
	if len(want) == 0 {
		return status >= 200 && status < 300
	}
	for _, w := range want {
		if status == w {
			return true
		}
	}
	return false
}

func sleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// json sends a JSON call and decodes a JSON answer into out (nil: discard).
func (t *transport) json(ctx context.Context, c *call, in, out any) error {
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return fmt.Errorf("client: encode %s %s: %w", c.method, c.path, err)
		}
		c.body = b
		if c.contentType == "" {
			c.contentType = "application/json"
		}
	}
	resp, err := t.do(ctx, c)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if out == nil {
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<20))
		return nil
	}
	if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
		return fmt.Errorf("client: decode %s %s: %w", c.method, c.path, err)
	}
	return nil
}

// retryAfter parses a Retry-After header in seconds.
func retryAfter(h http.Header) time.Duration {
	n, err := strconv.Atoi(h.Get("Retry-After"))
	if err != nil || n < 0 {
		return 0
	}
	return time.Duration(n) * time.Second
}

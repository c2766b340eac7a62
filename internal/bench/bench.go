// Package bench is the `moat bench` harness: it drives a moat server over
// its public HTTP APIs (the Lifecycle API and the agent's execd API) and
// prints latency figures. With no server given, it starts one in-process
// on loopback with a throw-away state directory and a busybox image served
// by an in-process registry, so a figure needs nothing but this binary.
package bench

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	goruntime "runtime"
	"sort"
	"strings"
	"time"
)

// Client is a minimal Lifecycle + execd client for the harness.
type Client struct {
	Base string // http://host:port
	Key  string
	HTTP *http.Client
}

func (c *Client) do(ctx context.Context, method, path string, body, into any) (int, error) {
	var r io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return 0, err
		}
		r = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.Base+path, r)
	if err != nil {
		return 0, err
	}
	req.Header.Set("OPEN-SANDBOX-API-KEY", c.Key)
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := c.HTTP.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode >= 300 {
		return resp.StatusCode, fmt.Errorf("%s %s: %d %s", method, path, resp.StatusCode, strings.TrimSpace(string(b)))
	}
	if into != nil {
		return resp.StatusCode, json.Unmarshal(b, into)
	}
	return resp.StatusCode, nil
}

// CreateOptions describe the sandboxes to create.
type CreateOptions struct {
	Image        string
	RuntimeClass string // "" = server default
	Entrypoint   []string
	// Memory is the memory limit ("256Mi"); "" is the server's default.
	Memory  string
	poolRef string
}

// Create creates one sandbox and returns its id.
func (c *Client) Create(ctx context.Context, o CreateOptions) (string, error) {
	body := map[string]any{}
	if o.Image != "" {
		body["image"] = map[string]string{"uri": o.Image}
		body["entrypoint"] = o.Entrypoint
	}
	if o.Memory != "" {
		body["resourceLimits"] = map[string]string{"memory": o.Memory}
	}
	ext := map[string]string{}
	if o.RuntimeClass != "" {
		ext["moat.runtime"] = o.RuntimeClass
	}
	if o.poolRef != "" {
		ext["poolRef"] = o.poolRef
	}
	if len(ext) > 0 {
		body["extensions"] = ext
	}
	var out struct {
		ID     string
		Status struct{ State string }
	}
	if _, err := c.do(ctx, "POST", "/v1/sandboxes", body, &out); err != nil {
		return "", err
	}
	if out.Status.State != "Running" {
		return out.ID, fmt.Errorf("sandbox %s is %s after create", out.ID, out.Status.State)
	}
	return out.ID, nil
}

// Delete deletes a sandbox.
func (c *Client) Delete(ctx context.Context, id string) error {
	_, err := c.do(ctx, "DELETE", "/v1/sandboxes/"+id, nil, nil)
	return err
}

// Endpoint is a resolved agent endpoint.
type Endpoint struct {
	Endpoint string            `json:"endpoint"`
	Headers  map[string]string `json:"headers"`
}

// AgentEndpoint resolves the agent port of a sandbox.
func (c *Client) AgentEndpoint(ctx context.Context, id string) (Endpoint, error) {
	var ep Endpoint
	_, err := c.do(ctx, "GET", "/v1/sandboxes/"+id+"/endpoints/44772", nil, &ep)
	return ep, err
}

// ProxyEndpoint resolves the agent port of a sandbox in server-proxy
// mode, as the SDKs do with use_server_proxy: requests go through the
// server (which records them in the sandbox's audit trail), with the API
// key as well as the agent's token.
func (c *Client) ProxyEndpoint(ctx context.Context, id string) (Endpoint, error) {
	var ep Endpoint
	if _, err := c.do(ctx, "GET", "/v1/sandboxes/"+id+"/endpoints/44772?use_server_proxy=true", nil, &ep); err != nil {
		return ep, err
	}
	if ep.Headers == nil {
		ep.Headers = map[string]string{}
	}
	ep.Headers["OPEN-SANDBOX-API-KEY"] = c.Key
	return ep, nil
}

// Run runs a foreground command through the agent and returns its stdout.
func (c *Client) Run(ctx context.Context, ep Endpoint, command string) (string, error) {
	b, _ := json.Marshal(map[string]string{"command": command})
	req, err := http.NewRequestWithContext(ctx, "POST", "http://"+ep.Endpoint+"/command", bytes.NewReader(b))
	if err != nil {
		return "", err
	}
	req.Header.Set("Content-Type", "application/json")
	for k, v := range ep.Headers {
		req.Header.Set(k, v)
	}
	resp, err := c.HTTP.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		b, _ := io.ReadAll(resp.Body)
		return "", fmt.Errorf("command: %d %s", resp.StatusCode, b)
	}
	var out []string
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := strings.TrimPrefix(sc.Text(), "data: ")
		if line == "" {
			continue
		}
		var ev struct{ Type, Text string }
		if err := json.Unmarshal([]byte(line), &ev); err != nil {
			return "", fmt.Errorf("bad event %q", line)
		}
		switch ev.Type {
		case "stdout":
			out = append(out, ev.Text)
		case "error":
			return "", errors.New("command failed: " + line)
		case "execution_complete":
			return strings.Join(out, "\n"), nil
		}
	}
	return "", errors.New("stream ended without execution_complete")
}

// Percentiles summarizes durations.
type Percentiles struct {
	N                       int
	Min, P50, P90, P99, Max time.Duration
	Mean                    time.Duration
}

// Summarize computes percentiles (nearest-rank) of ds.
func Summarize(ds []time.Duration) Percentiles {
	if len(ds) == 0 {
		return Percentiles{}
	}
	s := append([]time.Duration(nil), ds...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	rank := func(p float64) time.Duration {
		i := int(p*float64(len(s))+0.999999) - 1
		return s[max(0, min(i, len(s)-1))]
	}
	var sum time.Duration
	for _, d := range s {
		sum += d
	}
	return Percentiles{N: len(s), Min: s[0], P50: rank(0.50), P90: rank(0.90), P99: rank(0.99), Max: s[len(s)-1], Mean: sum / time.Duration(len(s))}
}

func (p Percentiles) String() string {
	r := func(d time.Duration) string { return fmt.Sprintf("%.1fms", float64(d.Microseconds())/1000) }
	return fmt.Sprintf("n=%d p50=%s p90=%s p99=%s min=%s max=%s mean=%s", p.N, r(p.P50), r(p.P90), r(p.P99), r(p.Min), r(p.Max), r(p.Mean))
}

func nproc() int { return goruntime.NumCPU() }

// Target is where a benchmark runs: a server by URL, or (Server empty) a
// throw-away in-process server with a busybox image.
type Target struct {
	// Server is the base URL of a running server; empty starts one in-process.
	Server string
	APIKey string
	// Image defaults to the in-process busybox image.
	Image string
}

// connect returns a client for t, the image to use, and a function that
// stops the in-process server if one was started. runtimeName is the
// in-process server's backend ("" = oci).
func (t Target) connect(ctx context.Context, runtimeName string, timeout time.Duration, log *slog.Logger) (*Client, string, func(), error) {
	c := &Client{Base: t.Server, Key: t.APIKey, HTTP: &http.Client{Timeout: timeout}}
	if t.Server != "" {
		if t.Image == "" {
			return nil, "", nil, fmt.Errorf("--image is required with --server")
		}
		return c, t.Image, func() {}, nil
	}
	p, err := StartInProcess(ctx, runtimeName, log)
	if err != nil {
		return nil, "", nil, fmt.Errorf("start in-process server: %w", err)
	}
	c.Base, c.Key = p.URL, p.Key
	image := t.Image
	if image == "" {
		image = p.Image
	}
	return c, image, p.Close, nil
}

package cli

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"time"

	"github.com/spf13/cobra"

	"github.com/moat-sandbox/moat/client"
	"github.com/moat-sandbox/moat/internal/errdefs"
	"github.com/moat-sandbox/moat/internal/mcp"
)

// newMCPCommand is `moat mcp`: a Model Context Protocol server that gives
// an LLM agent sandbox tools, backed by a running `moat serve`.
func newMCPCommand() *cobra.Command {
	sf := &serverFlags{}
	var httpAddr string
	var allowRemote, viaServer bool
	var sandboxTimeout, waitTimeout time.Duration
	cmd := &cobra.Command{
		Use:   "mcp",
		Short: "Serve sandboxes to LLM agents over the Model Context Protocol (stdio or HTTP)",
		Long: `Run an MCP server whose tools create sandboxes on a moat server, run commands
in them and read and write their files: sandbox_create, sandbox_list,
sandbox_get, sandbox_delete, sandbox_pause, sandbox_resume, exec, file_write,
file_read, file_list.

By default it speaks MCP on stdin/stdout, as MCP hosts (Claude Desktop, IDEs,
agent frameworks) expect from a server they launch; logs go to stderr. With
--http it serves the streamable HTTP transport instead, on loopback unless
--allow-remote is given (the endpoint has no authentication of its own: anyone
who reaches it acts with this process's API key).`,
		Example: `  moat mcp --server http://127.0.0.1:8080            # stdio, for an MCP host
  moat mcp --http :8765                                # http://127.0.0.1:8765/`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if sf.server == "" {
				return errdefs.Invalid("CLI::INVALID_FLAG", "--server is required")
			}
			if sandboxTimeout < 0 || sandboxTimeout > 0 && sandboxTimeout < time.Minute {
				return errdefs.Invalid("CLI::INVALID_FLAG", "--sandbox-timeout must be 0 (no expiry) or at least 1m")
			}
			opts := []client.Option{client.WithAPIKey(sf.apiKey)}
			if viaServer {
				opts = append(opts, client.WithServerProxy())
			}
			c, err := client.New(sf.server, opts...)
			if err != nil {
				return errdefs.Invalid("CLI::INVALID_FLAG", err.Error())
			}
			log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
			srv, err := mcp.New(mcp.Options{Client: c, SandboxTimeout: sandboxTimeout, WaitTimeout: waitTimeout, Logger: log})
			if err != nil {
				return err
			}
			if httpAddr == "" {
				return srv.ServeStdio(cmd.Context())
			}
			return serveMCPHTTP(cmd.Context(), srv, httpAddr, allowRemote)
		},
	}
	sf.register(cmd)
	f := cmd.Flags()
	f.StringVar(&httpAddr, "http", "", "serve the streamable HTTP transport on ADDR (host:port; a bare :port binds 127.0.0.1) instead of stdio")
	f.BoolVar(&allowRemote, "allow-remote", false, "allow --http on a non-loopback address (no authentication!)")
	f.BoolVar(&viaServer, "server-proxy", false, "reach sandbox agents through the server's proxy route (for a remote server)")
	f.DurationVar(&sandboxTimeout, "sandbox-timeout", 30*time.Minute, "expiry of sandboxes created without timeout_seconds (0: none)")
	f.DurationVar(&waitTimeout, "wait-timeout", 5*time.Minute, "how long sandbox_create waits for Running")
	return classifyTree(cmd)
}

// mcpListenAddr defaults the host of addr to loopback and refuses other
// hosts unless allowRemote.
func mcpListenAddr(addr string, allowRemote bool) (string, error) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return "", errdefs.Invalid("CLI::INVALID_FLAG", fmt.Sprintf("--http %q: want host:port or :port", addr))
	}
	if host == "" {
		host = "127.0.0.1"
	}
	if !allowRemote && host != "localhost" {
		ip := net.ParseIP(host)
		if ip == nil || !ip.IsLoopback() {
			return "", errdefs.Invalid("CLI::INVALID_FLAG", fmt.Sprintf("--http %q is not a loopback address; pass --allow-remote to expose it", addr))
		}
	}
	return net.JoinHostPort(host, port), nil
}

func serveMCPHTTP(ctx context.Context, srv *mcp.Server, addr string, allowRemote bool) error {
	addr, err := mcpListenAddr(addr, allowRemote)
	if err != nil {
		return err
	}
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	hs := &http.Server{Handler: srv.Handler(), ReadHeaderTimeout: 10 * time.Second}
	fmt.Fprintf(os.Stderr, "moat mcp: serving MCP (streamable HTTP) on http://%s/\n", l.Addr())
	done := make(chan error, 1)
	go func() { done <- hs.Serve(l) }()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := hs.Shutdown(sctx); err != nil {
		hs.Close()
	}
	if err := <-done; !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

package cli

import (
	"fmt"
	"os"

	"github.com/spf13/cobra"

	"github.com/moat-sandbox/moat/client"
)

// serverFlags are the connection flags shared by every verb that talks to a
// running `moat serve` (sandbox, exec, files, shell, pool, mcp).
type serverFlags struct {
	server string
	apiKey string
	tenant string // an admin key acts in this tenant (X-Moat-Tenant)
}

func (f *serverFlags) register(cmd *cobra.Command) {
	cmd.PersistentFlags().StringVar(&f.server, "server", envOr("MOAT_SERVER", "http://127.0.0.1:8080"), "lifecycle server base URL (env MOAT_SERVER)")
	cmd.PersistentFlags().StringVar(&f.apiKey, "api-key", os.Getenv("OPEN_SANDBOX_API_KEY"), "API key (env OPEN_SANDBOX_API_KEY)")
	cmd.PersistentFlags().Lookup("api-key").DefValue = "" // never print the key from the environment in --help
	cmd.PersistentFlags().StringVar(&f.tenant, "as-tenant", os.Getenv("MOAT_TENANT"), "with an admin key: act in this tenant only (env MOAT_TENANT)")
}

// client builds an SDK client from the flags.
func (f *serverFlags) client() (*client.Client, error) {
	if f.server == "" {
		return nil, fmt.Errorf("--server is required")
	}
	opts := []client.Option{client.WithAPIKey(f.apiKey)}
	if f.tenant != "" {
		opts = append(opts, client.WithTenant(f.tenant))
	}
	return client.New(f.server, opts...)
}

func envOr(key, def string) string {
	if v := os.Getenv(key); v != "" {
		return v
	}
	return def
}

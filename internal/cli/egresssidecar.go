package cli

import (
	"os"
	"strings"

	"github.com/spf13/cobra"

	"github.com/moat-sandbox/moat/internal/egress/sidecar"
	"github.com/moat-sandbox/moat/internal/egress/vault"
)

// newEgressSidecarCommand is the egress sidecar container's entrypoint in
// a sandbox pod with a network policy (package sidecar). Its token,
// policy, DNS upstreams and vault key come from the environment (the pod's egress
// Secret), never argv.
func newEgressSidecarCommand() *cobra.Command {
	return &cobra.Command{
		Use:    "egress-sidecar",
		Short:  "Enforce a sandbox pod's network policy from inside the pod (the egress sidecar's job)",
		Args:   cobra.NoArgs,
		Hidden: true,
		RunE: func(cmd *cobra.Command, args []string) error {
			var ups []string
			for _, u := range strings.Split(os.Getenv(sidecar.EnvDNS), ",") {
				if u = strings.TrimSpace(u); u != "" {
					ups = append(ups, u)
				}
			}
			var key []byte
			if k := os.Getenv(sidecar.EnvVaultKey); k != "" {
				var err error
				if key, err = vault.ParseKey(k); err != nil {
					return err
				}
			}
			return sidecar.Run(cmd.Context(), sidecar.Options{
				Token:     os.Getenv(sidecar.EnvToken),
				Policy:    []byte(os.Getenv(sidecar.EnvPolicy)),
				Upstreams: ups,
				VaultKey:  key,
			})
		},
	}
}

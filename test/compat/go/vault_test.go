package compatgo

import (
	"context"
	"testing"
	"time"

	opensandbox "github.com/alibaba/OpenSandbox/sdks/sandbox/go"
)

// TestVaultNullLists creates an empty Credential Vault the way the SDK
// sends one: {"credentials":null,"bindings":null} (its fields have no
// omitempty), which upstream's egress server takes as empty.
func TestVaultNullLists(t *testing.T) {
	cfg, img := conn(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	sb, err := opensandbox.CreateSandbox(ctx, cfg, opensandbox.SandboxCreateOptions{
		Image: img, Entrypoint: []string{"tail", "-f", "/dev/null"},
		NetworkPolicy:   &opensandbox.NetworkPolicy{DefaultAction: "deny", Egress: []opensandbox.NetworkRule{{Action: "allow", Target: "api.test"}}},
		CredentialProxy: &opensandbox.CredentialProxyConfig{Enabled: true},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Kill(context.Background())
	st, err := sb.CreateCredentialVault(ctx, opensandbox.CredentialVaultCreateRequest{})
	if err != nil {
		t.Fatalf("create an empty vault with null lists: %v", err)
	}
	if len(st.Credentials) != 0 || len(st.Bindings) != 0 {
		t.Fatalf("vault %+v", st)
	}
	if got, err := sb.GetCredentialVault(ctx); err != nil || got.Revision != st.Revision {
		t.Fatalf("get vault: %+v %v", got, err)
	}
}

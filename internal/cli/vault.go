package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/moat-sandbox/moat/client"
	"github.com/moat-sandbox/moat/internal/errdefs"
)

// newVaultCommand is the `moat credential-vault` noun (upstream's `osb
// credential-vault`): a sandbox's Credential Vault, through its egress
// endpoint. Bodies with credential values are read from a file or stdin,
// never from argv (which other users can see).
func newVaultCommand() *cobra.Command {
	sf := &serverFlags{}
	cmd := &cobra.Command{
		Use:     "credential-vault",
		Aliases: []string{"vault"},
		Short:   "Manage a sandbox's Credential Vault (credentials injected into its outbound HTTP(S))",
		Long: `Manage the Credential Vault of a sandbox created with --credential-proxy.

Credentials are write-only: create and patch read their JSON body (the
OpenSandbox egress API's CredentialVaultCreateRequest or
CredentialVaultMutationRequest) from --file, or stdin with --file -; the
server never returns a value.`,
	}
	sf.register(cmd)
	cred := &cobra.Command{Use: "credential", Aliases: []string{"credentials"}, Short: "Show credential metadata"}
	cred.AddCommand(
		vaultReadCommand(sf, "list ID", []string{"ls"}, "List credentials", 1, func(ctx context.Context, sb *client.SandboxHandle, args []string) (any, func(*tabwriter.Writer), error) {
			cs, rev, err := sb.ListCredentials(ctx)
			if cs == nil {
				cs = []client.CredentialMetadata{}
			}
			return map[string]any{"revision": rev, "credentials": cs}, func(tw *tabwriter.Writer) { credentialTable(tw, cs) }, err
		}),
		vaultReadCommand(sf, "get ID NAME", nil, "Show one credential", 2, func(ctx context.Context, sb *client.SandboxHandle, args []string) (any, func(*tabwriter.Writer), error) {
			c, err := sb.GetCredential(ctx, args[1])
			if err != nil {
				return nil, nil, err
			}
			return c, func(tw *tabwriter.Writer) { credentialTable(tw, []client.CredentialMetadata{*c}) }, nil
		}),
	)
	bind := &cobra.Command{Use: "binding", Aliases: []string{"bindings"}, Short: "Show binding metadata"}
	bind.AddCommand(
		vaultReadCommand(sf, "list ID", []string{"ls"}, "List bindings", 1, func(ctx context.Context, sb *client.SandboxHandle, args []string) (any, func(*tabwriter.Writer), error) {
			bs, rev, err := sb.ListBindings(ctx)
			if bs == nil {
				bs = []client.BindingMetadata{}
			}
			return map[string]any{"revision": rev, "bindings": bs}, func(tw *tabwriter.Writer) { bindingTable(tw, bs) }, err
		}),
		vaultReadCommand(sf, "get ID NAME", nil, "Show one binding", 2, func(ctx context.Context, sb *client.SandboxHandle, args []string) (any, func(*tabwriter.Writer), error) {
			b, err := sb.GetBinding(ctx, args[1])
			if err != nil {
				return nil, nil, err
			}
			return b, func(tw *tabwriter.Writer) { bindingTable(tw, []client.BindingMetadata{*b}) }, nil
		}),
	)
	cmd.AddCommand(
		newVaultWriteCommand(sf, false),
		newVaultWriteCommand(sf, true),
		vaultReadCommand(sf, "get ID", nil, "Show a sandbox's vault (no values)", 1, func(ctx context.Context, sb *client.SandboxHandle, args []string) (any, func(*tabwriter.Writer), error) {
			st, err := sb.GetCredentialVault(ctx)
			if err != nil {
				return nil, nil, err
			}
			return st, func(tw *tabwriter.Writer) { vaultTable(tw, st) }, nil
		}),
		&cobra.Command{
			Use:     "delete ID",
			Aliases: []string{"rm"},
			Short:   "Delete a sandbox's vault (nothing is injected any more)",
			Args:    cobra.ExactArgs(1),
			RunE: func(cmd *cobra.Command, args []string) error {
				sb, err := vaultSandbox(cmd.Context(), sf, args[0])
				if err != nil {
					return err
				}
				return sb.DeleteCredentialVault(cmd.Context())
			},
		},
		cred, bind,
	)
	return classifyTree(cmd)
}

func vaultSandbox(ctx context.Context, sf *serverFlags, id string) (*client.SandboxHandle, error) {
	c, err := sf.client()
	if err != nil {
		return nil, err
	}
	return c.Sandbox(ctx, id)
}

// vaultReadCommand is a read-only verb with table/json/yaml output.
func vaultReadCommand(sf *serverFlags, use string, aliases []string, short string, nargs int,
	fn func(ctx context.Context, sb *client.SandboxHandle, args []string) (any, func(*tabwriter.Writer), error)) *cobra.Command {
	var output outputFormat
	cmd := &cobra.Command{
		Use:     use,
		Aliases: aliases,
		Short:   short,
		Args:    cobra.ExactArgs(nargs),
		RunE: func(cmd *cobra.Command, args []string) error {
			sb, err := vaultSandbox(cmd.Context(), sf, args[0])
			if err != nil {
				return err
			}
			v, table, err := fn(cmd.Context(), sb, args)
			if err != nil {
				return err
			}
			return render(cmd.OutOrStdout(), output, v, table)
		},
	}
	addOutputFlag(cmd, &output)
	return cmd
}

// newVaultWriteCommand is `create` (patch false) or `patch`.
func newVaultWriteCommand(sf *serverFlags, patch bool) *cobra.Command {
	var file string
	var expected int64
	var output outputFormat
	use, short := "create ID --file FILE", "Create a sandbox's vault from a JSON body {credentials, bindings}"
	if patch {
		use, short = "patch ID --file FILE", "Add, replace or delete credentials and bindings (JSON body {credentials:{add,replace,delete}, bindings:{...}})"
	}
	cmd := &cobra.Command{
		Use:   use,
		Short: short,
		Example: `  moat credential-vault create $ID --file vault.json
  moat credential-vault patch $ID --expected-revision 1 --file - <<'EOF'
  {"credentials":{"replace":[{"name":"gh","source":{"type":"inline","value":"..."}}]}}
  EOF`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			body, err := readBody(cmd.InOrStdin(), file)
			if err != nil {
				return err
			}
			defer clear(body)
			sb, err := vaultSandbox(cmd.Context(), sf, args[0])
			if err != nil {
				return err
			}
			var st *client.CredentialVaultState
			if patch {
				var p client.CredentialVaultPatch
				if err := decodeBody(body, &p); err != nil {
					return err
				}
				if cmd.Flags().Changed("expected-revision") {
					p.ExpectedRevision = &expected
				}
				st, err = sb.PatchCredentialVault(cmd.Context(), p)
			} else {
				var c client.CredentialVaultCreate
				if err := decodeBody(body, &c); err != nil {
					return err
				}
				st, err = sb.CreateCredentialVault(cmd.Context(), c)
			}
			if err != nil {
				return err
			}
			return render(cmd.OutOrStdout(), output, st, func(tw *tabwriter.Writer) { vaultTable(tw, st) })
		},
	}
	cmd.Flags().StringVarP(&file, "file", "f", "", `JSON body file ("-" for stdin)`)
	if patch {
		cmd.Flags().Int64Var(&expected, "expected-revision", 0, "fail with a conflict unless the vault is at this revision")
	}
	addOutputFlag(cmd, &output)
	return cmd
}

func readBody(stdin io.Reader, file string) ([]byte, error) {
	switch file {
	case "":
		return nil, errdefs.Invalid("CLI::INVALID_FLAG", "--file is required (credential values are not taken from arguments)")
	case "-":
		return io.ReadAll(io.LimitReader(stdin, 1<<20))
	}
	b, err := os.ReadFile(file)
	if err != nil {
		return nil, errdefs.Invalid("CLI::INVALID_FLAG", "--file: "+err.Error())
	}
	return b, nil
}

// decodeBody decodes a JSON body strictly; its errors never quote it.
func decodeBody(b []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		msg := "not a valid JSON body"
		if s := err.Error(); strings.HasPrefix(s, "json: unknown field ") {
			msg = strings.TrimPrefix(s, "json: ")
		}
		return errdefs.Invalid("CLI::INVALID_BODY", msg)
	}
	return nil
}

func vaultTable(tw *tabwriter.Writer, st *client.CredentialVaultState) {
	fmt.Fprintf(tw, "Revision:\t%d\n\n", st.Revision)
	credentialTable(tw, st.Credentials)
	fmt.Fprintln(tw)
	bindingTable(tw, st.Bindings)
}

func credentialTable(tw *tabwriter.Writer, cs []client.CredentialMetadata) {
	fmt.Fprintln(tw, "CREDENTIAL\tSOURCE\tREVISION")
	for _, c := range cs {
		fmt.Fprintf(tw, "%s\t%s\t%d\n", c.Name, c.SourceType, c.Revision)
	}
}

func bindingTable(tw *tabwriter.Writer, bs []client.BindingMetadata) {
	fmt.Fprintln(tw, "BINDING\tAUTH\tHOSTS\tSCHEMES\tMETHODS\tPATHS\tREVISION")
	for _, b := range bs {
		auth := b.Auth.Type
		if b.Auth.Name != "" {
			where := "header"
			if b.Auth.In != "" {
				where = b.Auth.In
			}
			auth += " (" + where + " " + b.Auth.Name + ")"
		}
		m := b.Match
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%d\n", b.Name, auth, strings.Join(m.Hosts, ","), strings.Join(m.Schemes, ","),
			strings.Join(m.Methods, ","), strings.Join(m.Paths, ","), b.Revision)
	}
}

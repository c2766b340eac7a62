package cli

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/moat-sandbox/moat/client"
	"github.com/moat-sandbox/moat/internal/errdefs"
	"github.com/moat-sandbox/moat/internal/tenant"
)

// newKeyCommand is the `moat key` noun: API keys of a moat server (admin).
func newKeyCommand() *cobra.Command {
	sf := &serverFlags{}
	cmd := &cobra.Command{
		Use:     "key",
		Aliases: []string{"keys"},
		Short:   "Manage API keys: create (shown once), list, revoke (admin key)",
		Long: `Every API key belongs to a tenant and has a role: platform (every tenant;
tenants, quotas, egress guardrails and every tenant's keys), admin (its own
tenant: resources and keys up to admin), operator (full control of its tenant's
resources) or viewer (read only). The server's own key (MOAT_API_KEY or
<root>/api-key) is the platform key of tenant "default", listed as id "root";
only it may create platform keys.`,
	}
	sf.register(cmd)
	cmd.AddCommand(newKeyCreateCommand(sf), newKeyListCommand(sf),
		newGetCommand(sf, "get ID", nil, "Show one API key's record", (*client.Client).GetKey, keyDetail),
		newKeyWhoamiCommand(sf),
		newEachCommand(sf, "revoke ID...", []string{"rm", "delete"}, "Revoke keys at once and for good", (*client.Client).RevokeKey))
	return classifyTree(cmd)
}

// parseExpiry reads --expires: a duration from now ("720h", "30d") or an
// RFC 3339 time.
func parseExpiry(s string, now time.Time) (*time.Time, error) {
	if s == "" {
		return nil, nil
	}
	if t, err := time.Parse(time.RFC3339, s); err == nil {
		return &t, nil
	}
	var d time.Duration
	if n, ok := strings.CutSuffix(s, "d"); ok {
		days, err := strconv.Atoi(n)
		if err != nil || days <= 0 {
			return nil, errdefs.Invalid("CLI::INVALID_FLAG", fmt.Sprintf("--expires %q: want a duration (720h, 30d) or an RFC 3339 time", s))
		}
		d = time.Duration(days) * 24 * time.Hour
	} else if v, err := time.ParseDuration(s); err == nil && v > 0 {
		d = v
	} else {
		return nil, errdefs.Invalid("CLI::INVALID_FLAG", fmt.Sprintf("--expires %q: want a duration (720h, 30d) or an RFC 3339 time", s))
	}
	t := now.Add(d).UTC().Truncate(time.Second)
	return &t, nil
}

func newKeyCreateCommand(sf *serverFlags) *cobra.Command {
	var spec client.KeySpec
	var expires, format string
	var output outputFormat
	cmd := &cobra.Command{
		Use:   "create --tenant TENANT --role platform|admin|operator|viewer [--name TEXT] [--expires 30d] [--format moat|e2b]",
		Short: "Create an API key; it is printed once and cannot be shown again",
		Example: `  KEY=$(moat key create --tenant acme --role operator --name "ci runner")
  moat key create --tenant acme --role viewer --expires 30d -o json
  E2B_API_KEY=$(moat key create --tenant acme --role operator --format e2b)`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if spec.Tenant == "" || spec.Role == "" {
				return errdefs.Invalid("CLI::INVALID_FLAG", "--tenant and --role are required")
			}
			if format != "moat" && format != "e2b" {
				return errdefs.Invalid("CLI::INVALID_FLAG", fmt.Sprintf("--format %q: want moat or e2b", format))
			}
			var err error
			if spec.ExpiresAt, err = parseExpiry(expires, time.Now()); err != nil {
				return err
			}
			c, err := sf.client()
			if err != nil {
				return err
			}
			k, err := c.CreateKey(cmd.Context(), spec)
			if err != nil {
				return err
			}
			if format == "e2b" {
				k.Key = tenant.E2BKey(k.Key) // the same key in E2B's e2b_<hex> form
			}
			if output != outputTable {
				return render(cmd.OutOrStdout(), output, k, nil)
			}
			// The key alone on stdout (for $(...)); the rest on stderr.
			fmt.Fprintln(cmd.OutOrStdout(), k.Key)
			fmt.Fprintf(cmd.ErrOrStderr(), "created key %s (%s of tenant %s); store it now: it cannot be shown again\n", k.ID, k.Role, k.Tenant)
			return nil
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&spec.Tenant, "tenant", "", "tenant that owns the key (created if missing)")
	fl.StringVar(&spec.Role, "role", "", "platform (server key only), admin, operator or viewer")
	fl.StringVar(&spec.Name, "name", "", "what the key is for (shown in listings)")
	fl.StringVar(&expires, "expires", "", "the key stops working after this duration (720h, 30d) or at this RFC 3339 time")
	fl.StringVar(&format, "format", "moat", "the key's form: moat (moat_<id>_<secret>) or e2b (e2b_<hex>, for the E2B SDKs); both work everywhere")
	addOutputFlag(cmd, &output)
	return cmd
}

func newKeyListCommand(sf *serverFlags) *cobra.Command {
	var tenant string
	cmd := newListCommand(sf, "List API keys (never the keys themselves)",
		func(c *client.Client, ctx context.Context) ([]client.APIKey, error) { return c.ListKeys(ctx, tenant) },
		func(tw *tabwriter.Writer, keys []client.APIKey) { keyTable(tw, keys, time.Now()) })
	cmd.Flags().StringVar(&tenant, "tenant", "", "only the keys of this tenant")
	return cmd
}

func keyState(k client.APIKey) string {
	switch {
	case k.RevokedAt != nil:
		return "revoked"
	case !k.Active:
		return "expired"
	}
	return "active"
}

func keyTable(tw *tabwriter.Writer, keys []client.APIKey, now time.Time) {
	fmt.Fprintln(tw, "ID\tTENANT\tROLE\tSTATE\tNAME\tAGE\tEXPIRES")
	for _, k := range keys {
		created := "-"
		if k.CreatedAt != nil {
			created = age(now, *k.CreatedAt)
		}
		name := k.Name
		if name == "" {
			name = "-"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", k.ID, k.Tenant, k.Role, keyState(k), name, created, until(now, k.ExpiresAt))
	}
}

func keyDetail(tw *tabwriter.Writer, k *client.APIKey) {
	row := func(a, b string) { fmt.Fprintf(tw, "%s:\t%s\n", a, b) }
	row("ID", k.ID)
	row("Name", k.Name)
	row("Tenant", k.Tenant)
	row("Role", k.Role)
	row("State", keyState(*k))
	if k.CreatedAt != nil {
		row("Created", k.CreatedAt.Local().Format(time.DateTime)+" by "+k.CreatedBy)
	}
	if k.ExpiresAt != nil {
		row("Expires", k.ExpiresAt.Local().Format(time.DateTime))
	}
	if k.RevokedAt != nil {
		row("Revoked", k.RevokedAt.Local().Format(time.DateTime))
	}
}

func newKeyWhoamiCommand(sf *serverFlags) *cobra.Command {
	var output outputFormat
	cmd := &cobra.Command{
		Use:   "whoami",
		Short: "Show the key id, tenant and role of the key in use, and what it sees (any role)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := sf.client()
			if err != nil {
				return err
			}
			p, err := c.Whoami(cmd.Context())
			if err != nil {
				return err
			}
			return render(cmd.OutOrStdout(), output, p, func(tw *tabwriter.Writer) {
				scope := p.Sees
				if scope == "" { // an older server
					scope = "tenant " + p.Tenant
					if p.AllTenants {
						scope = "all tenants"
					}
				}
				fmt.Fprintf(tw, "Key:\t%s\nTenant:\t%s\nRole:\t%s\nSees:\t%s\n", p.KeyID, p.Tenant, p.Role, scope)
			})
		},
	}
	addOutputFlag(cmd, &output)
	return cmd
}

// newTenantCommand is the `moat tenant` noun: tenants and their quotas.
func newTenantCommand() *cobra.Command {
	sf := &serverFlags{}
	cmd := &cobra.Command{
		Use:     "tenant",
		Aliases: []string{"tenants"},
		Short:   "Manage tenants, their quotas and egress guardrails (platform key; get works for a tenant's own keys)",
	}
	sf.register(cmd)
	cmd.AddCommand(
		newListCommand(sf, "List tenants with usage/quota", (*client.Client).ListTenants, tenantTable),
		newGetCommand(sf, "get NAME", nil, "Show a tenant's usage/quota", (*client.Client).GetTenant,
			func(tw *tabwriter.Writer, t *client.Tenant) { tenantTable(tw, []client.Tenant{*t}) }),
		newTenantSetCommand(sf),
		newTenantEgressCommand(sf),
		newRemoveCommand(sf, "rm NAME...", "Delete tenants that have no active key, sandbox, pool or snapshot",
			(*client.Client).DeleteTenant))
	return classifyTree(cmd)
}

func quotaCell(v string) string {
	if v == "" || v == "0" {
		return "-"
	}
	return v
}

func tenantTable(tw *tabwriter.Writer, ts []client.Tenant) {
	fmt.Fprintln(tw, "NAME\tSANDBOXES\tCPU\tMEMORY")
	for _, t := range ts {
		n := "-"
		if t.Quota.Sandboxes > 0 {
			n = strconv.Itoa(t.Quota.Sandboxes)
		}
		fmt.Fprintf(tw, "%s\t%d/%s\t%s/%s\t%s/%s\n", t.Name, t.Usage.Sandboxes, n, t.Usage.CPU, quotaCell(t.Quota.CPU),
			t.Usage.Memory, quotaCell(t.Quota.Memory))
	}
}

func newTenantSetCommand(sf *serverFlags) *cobra.Command {
	var q client.TenantQuota
	var output outputFormat
	cmd := &cobra.Command{
		Use:   "set NAME [--sandboxes N] [--cpu QUANTITY] [--memory QUANTITY]",
		Short: "Create a tenant or replace its quota (an omitted limit is unlimited)",
		Example: `  moat tenant set acme --sandboxes 20 --cpu 16 --memory 32Gi
  moat tenant set acme   # lift every limit`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if q.Sandboxes < 0 {
				return errdefs.Invalid("CLI::INVALID_FLAG", "--sandboxes must not be negative")
			}
			c, err := sf.client()
			if err != nil {
				return err
			}
			t, err := c.PutTenant(cmd.Context(), args[0], q)
			if err != nil {
				return err
			}
			return render(cmd.OutOrStdout(), output, t, func(tw *tabwriter.Writer) { tenantTable(tw, []client.Tenant{*t}) })
		},
	}
	fl := cmd.Flags()
	fl.IntVar(&q.Sandboxes, "sandboxes", 0, "live sandboxes at most (0 = unlimited)")
	fl.StringVar(&q.CPU, "cpu", "", `sum of the sandboxes' CPU limits, e.g. "16" or "2500m" (sandboxes must then set resourceLimits.cpu)`)
	fl.StringVar(&q.Memory, "memory", "", `sum of the sandboxes' memory limits, e.g. "32Gi" (sandboxes must then set resourceLimits.memory)`)
	addOutputFlag(cmd, &output)
	return cmd
}

// newTenantEgressCommand is `moat tenant egress`: a tenant's egress
// guardrail, which bounds every sandbox's own policy.
func newTenantEgressCommand(sf *serverFlags) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "egress",
		Short: "Show, set or remove a tenant's egress guardrail (its sandboxes narrow it, never widen it)",
	}
	var output outputFormat
	show := func(cmd *cobra.Command, t *client.TenantEgress) error {
		return render(cmd.OutOrStdout(), output, t, func(tw *tabwriter.Writer) { egressTable(tw, t) })
	}
	get := &cobra.Command{
		Use:   "get NAME",
		Short: "Show a tenant's egress guardrail",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := sf.client()
			if err != nil {
				return err
			}
			t, err := c.GetTenantEgress(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			return show(cmd, t)
		},
	}
	var file, def string
	var allow, deny []string
	set := &cobra.Command{
		Use:   "set NAME (--file POLICY.json | [--default allow|deny] [--allow TARGET]... [--deny TARGET]...)",
		Short: "Set a tenant's egress guardrail; it reaches the tenant's running sandboxes at once",
		Example: `  moat tenant egress set acme --default deny --allow '*.pypi.org' --allow files.pythonhosted.org
  moat tenant egress set acme --file guardrail.json   # the networkPolicy JSON shape`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			var p client.NetworkPolicy
			switch {
			case file != "" && (def != "" || len(allow)+len(deny) > 0):
				return errdefs.Invalid("CLI::INVALID_FLAG", "--file excludes --default, --allow and --deny")
			case file != "":
				b, err := readBody(cmd.InOrStdin(), file)
				if err != nil {
					return err
				}
				if err := decodeBody(b, &p); err != nil {
					return err
				}
			default:
				p.DefaultAction = def
				for _, t := range deny {
					p.Egress = append(p.Egress, client.NetworkRule{Action: "deny", Target: t})
				}
				for _, t := range allow {
					p.Egress = append(p.Egress, client.NetworkRule{Action: "allow", Target: t})
				}
			}
			c, err := sf.client()
			if err != nil {
				return err
			}
			t, err := c.PutTenantEgress(cmd.Context(), args[0], p)
			if err != nil {
				return err
			}
			return show(cmd, t)
		},
	}
	fl := set.Flags()
	fl.StringVar(&file, "file", "", `guardrail JSON file {"defaultAction":"deny","egress":[{"action":"allow","target":"*.corp.example"}]} ("-" for stdin)`)
	fl.StringVar(&def, "default", "", "default action: allow or deny (default deny)")
	fl.StringArrayVar(&allow, "allow", nil, "allow a domain, *.domain, IP or CIDR (repeatable; deny rules come first)")
	fl.StringArrayVar(&deny, "deny", nil, "deny a domain, *.domain, IP or CIDR (repeatable)")
	rm := &cobra.Command{
		Use:     "rm NAME",
		Aliases: []string{"delete"},
		Short:   "Remove a tenant's egress guardrail: its sandboxes keep their own policies",
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := sf.client()
			if err != nil {
				return err
			}
			t, err := c.DeleteTenantEgress(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			return show(cmd, t)
		},
	}
	for _, c := range []*cobra.Command{get, set, rm} {
		addOutputFlag(c, &output)
	}
	cmd.AddCommand(get, set, rm)
	return cmd
}

func egressTable(tw *tabwriter.Writer, t *client.TenantEgress) {
	if t.Policy == nil {
		fmt.Fprintf(tw, "Tenant:\t%s\nGuardrail:\tnone (each sandbox's own policy applies)\n", t.Tenant)
	} else {
		def := t.Policy.DefaultAction
		if def == "" {
			def = "deny"
		}
		fmt.Fprintf(tw, "Tenant:\t%s\nDefault:\t%s\n", t.Tenant, def)
		for _, r := range t.Policy.Egress {
			fmt.Fprintf(tw, "Rule:\t%s %s\n", r.Action, r.Target)
		}
	}
	if t.Applied != nil {
		fmt.Fprintf(tw, "Applied to:\t%d running sandboxes\n", *t.Applied)
	}
}

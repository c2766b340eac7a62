package cli

import (
	"context"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/moat-sandbox/moat/client"
)

// The verbs every server noun (sandbox, pool, volume, tenant, key) shares:
// one shape each, so that `ls`, `get` and the per-name verbs behave alike
// across nouns (flags, aliases, empty lists, output formats, exit codes).
// The functions they take have the client's method shape, so a noun passes
// method expressions: (*client.Client).DeletePool.

// newEachCommand is a verb applied to every name argument in turn (rm,
// pause, resume). It prints each name it handled and goes on after a
// failure; the exit code is that of the last failure.
func newEachCommand(sf *serverFlags, use string, aliases []string, short string,
	fn func(c *client.Client, ctx context.Context, name string) error) *cobra.Command {
	return &cobra.Command{
		Use:     use,
		Aliases: aliases,
		Short:   short,
		Args:    cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := sf.client()
			if err != nil {
				return err
			}
			return forEach(cmd.Context(), args, cmd.OutOrStdout(), cmd.ErrOrStderr(), func(ctx context.Context, name string) error {
				return fn(c, ctx, name)
			})
		},
	}
}

// newRemoveCommand is a noun's `rm NAME...` (aliases delete, remove).
func newRemoveCommand(sf *serverFlags, use, short string,
	fn func(c *client.Client, ctx context.Context, name string) error) *cobra.Command {
	return newEachCommand(sf, use, []string{"delete", "remove"}, short, fn)
}

// newListCommand is a noun's `ls` (alias list): the items as a table, or
// as {"items": [...]} (never null) with -o json/yaml.
func newListCommand[T any](sf *serverFlags, short string,
	list func(c *client.Client, ctx context.Context) ([]T, error), table func(tw *tabwriter.Writer, items []T)) *cobra.Command {
	var output outputFormat
	cmd := &cobra.Command{
		Use:     "ls",
		Aliases: []string{"list"},
		Short:   short,
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := sf.client()
			if err != nil {
				return err
			}
			items, err := list(c, cmd.Context())
			if err != nil {
				return err
			}
			if items == nil {
				items = []T{}
			}
			return render(cmd.OutOrStdout(), output, map[string]any{"items": items}, func(tw *tabwriter.Writer) { table(tw, items) })
		},
	}
	addOutputFlag(cmd, &output)
	return cmd
}

// newGetCommand is a noun's `get NAME`: one item's detail, or the item
// itself with -o json/yaml.
func newGetCommand[T any](sf *serverFlags, use string, aliases []string, short string,
	get func(c *client.Client, ctx context.Context, name string) (*T, error), detail func(tw *tabwriter.Writer, item *T)) *cobra.Command {
	var output outputFormat
	cmd := &cobra.Command{
		Use:     use,
		Aliases: aliases,
		Short:   short,
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := sf.client()
			if err != nil {
				return err
			}
			item, err := get(c, cmd.Context(), args[0])
			if err != nil {
				return err
			}
			return render(cmd.OutOrStdout(), output, item, func(tw *tabwriter.Writer) { detail(tw, item) })
		},
	}
	addOutputFlag(cmd, &output)
	return cmd
}

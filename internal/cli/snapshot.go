package cli

import (
	"context"
	"fmt"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/moat-sandbox/moat/client"
)

// newSnapshotCommand is the `moat snapshot` noun: filesystem snapshots of
// sandboxes, which `moat sandbox create --snapshot` starts from.
func newSnapshotCommand() *cobra.Command {
	sf := &serverFlags{}
	cmd := &cobra.Command{
		Use:     "snapshot",
		Aliases: []string{"snapshots", "snap"},
		Short:   "Manage sandbox snapshots (create a sandbox from one with sandbox create --snapshot)",
	}
	sf.register(cmd)
	var sandboxID string
	ls := newListCommand(sf, "List snapshots",
		func(c *client.Client, ctx context.Context) ([]client.Snapshot, error) {
			return listAllSnapshots(ctx, c, sandboxID)
		},
		func(tw *tabwriter.Writer, ss []client.Snapshot) { snapshotTable(tw, ss, time.Now()) })
	ls.Flags().StringVar(&sandboxID, "sandbox", "", "only the snapshots of this sandbox")
	cmd.AddCommand(newSnapshotCreateCommand(sf), ls,
		newGetCommand(sf, "get ID", nil, "Show one snapshot", (*client.Client).GetSnapshot,
			func(tw *tabwriter.Writer, s *client.Snapshot) { snapshotTable(tw, []client.Snapshot{*s}, time.Now()) }),
		newRemoveCommand(sf, "rm ID...", "Delete snapshots (sandboxes made from them stay)", (*client.Client).DeleteSnapshot))
	return classifyTree(cmd)
}

// listAllSnapshots pages through every snapshot (of sandboxID, if set).
func listAllSnapshots(ctx context.Context, c *client.Client, sandboxID string) ([]client.Snapshot, error) {
	var all []client.Snapshot
	for page := 1; ; page++ {
		l, err := c.ListSnapshots(ctx, client.SnapshotListOptions{SandboxID: sandboxID, Page: page, PageSize: 100})
		if err != nil {
			return nil, err
		}
		all = append(all, l.Items...)
		if !l.Pagination.HasNextPage || len(l.Items) == 0 {
			return all, nil
		}
	}
}

func newSnapshotCreateCommand(sf *serverFlags) *cobra.Command {
	var name string
	var output outputFormat
	cmd := &cobra.Command{
		Use:     "create SANDBOX [--name NAME]",
		Short:   "Snapshot a sandbox's filesystem (the sandbox keeps running)",
		Example: "  moat snapshot create 9f2c... --name before-upgrade\n  moat sb create --snapshot <snapshot id>",
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := sf.client()
			if err != nil {
				return err
			}
			s, err := c.CreateSnapshot(cmd.Context(), args[0], name)
			if err != nil {
				return err
			}
			if output == outputTable {
				fmt.Fprintln(cmd.OutOrStdout(), s.ID)
				return nil
			}
			return render(cmd.OutOrStdout(), output, s, nil)
		},
	}
	cmd.Flags().StringVar(&name, "name", "", "a name for the snapshot")
	addOutputFlag(cmd, &output)
	return cmd
}

func snapshotTable(tw *tabwriter.Writer, ss []client.Snapshot, now time.Time) {
	fmt.Fprintln(tw, "ID\tSANDBOX\tNAME\tSTATE\tAGE")
	for _, s := range ss {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", s.ID, s.SandboxID, dash(s.Name), s.Status.State, age(now, s.CreatedAt))
	}
}

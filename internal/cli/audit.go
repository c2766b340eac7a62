package cli

import (
	"encoding/json"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/moat-sandbox/moat/client"
)

// newSandboxAuditCommand is `moat sandbox audit ID`: the sandbox's audit
// trail, oldest first, optionally followed.
func newSandboxAuditCommand(sf *serverFlags) *cobra.Command {
	var kinds []string
	var since string
	var follow bool
	var output outputFormat
	cmd := &cobra.Command{
		Use:   "audit ID [--kind KIND]... [--since 1h|RFC3339] [--follow]",
		Short: "Show a sandbox's audit trail: calls, commands, files, egress, credentials (also after delete)",
		Example: "  moat sb audit 9f2c... --kind command --since 1h\n" +
			"  moat sb audit 9f2c... --follow -o json",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := sf.client()
			if err != nil {
				return err
			}
			opts := client.AuditOptions{Kinds: kinds, Limit: 500}
			if since != "" {
				if opts.Since, err = parseSince(since, time.Now()); err != nil {
					return err
				}
			}
			out := cmd.OutOrStdout()
			tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
			header := output == outputTable
			for {
				page, err := c.Audit(cmd.Context(), args[0], opts)
				if err != nil {
					return err
				}
				if header {
					fmt.Fprintln(tw, "SEQ\tTIME\tKIND\tACTION\tBY\tDETAIL")
					header = false
				}
				if err := writeAudit(out, tw, output, page.Items); err != nil {
					return err
				}
				if n := len(page.Items); n > 0 {
					opts.Cursor = strconv.FormatUint(page.Items[n-1].Seq, 10)
				}
				if page.NextCursor != "" {
					continue
				}
				if !follow {
					return nil
				}
				select {
				case <-cmd.Context().Done():
					return nil
				case <-time.After(2 * time.Second):
				}
			}
		},
	}
	cmd.Flags().StringSliceVar(&kinds, "kind", nil, "only these kinds: lifecycle, command, pty, file, egress, credential (repeatable or comma-separated)")
	cmd.Flags().StringVar(&since, "since", "", "only records since a time (RFC 3339) or a duration ago (e.g. 30m)")
	cmd.Flags().BoolVarP(&follow, "follow", "f", false, "keep printing new records until interrupted")
	addOutputFlag(cmd, &output)
	return cmd
}

// parseSince reads --since: an RFC 3339 time or a duration before now.
func parseSince(v string, now time.Time) (time.Time, error) {
	if d, err := time.ParseDuration(v); err == nil && d >= 0 {
		return now.Add(-d), nil
	}
	t, err := time.Parse(time.RFC3339Nano, v)
	if err != nil {
		return time.Time{}, fmt.Errorf("--since %q: want an RFC 3339 time or a duration such as 30m", v)
	}
	return t, nil
}

// writeAudit prints records: JSON or YAML as one document per record (a
// followed trail streams), else table rows.
func writeAudit(out io.Writer, tw *tabwriter.Writer, o outputFormat, recs []client.AuditRecord) error {
	for _, r := range recs {
		switch o {
		case outputJSON:
			b, err := json.Marshal(r)
			if err != nil {
				return err
			}
			fmt.Fprintf(out, "%s\n", b)
		case outputYAML:
			b, err := toYAML(r)
			if err != nil {
				return err
			}
			fmt.Fprintf(out, "---\n%s", b)
		default:
			by := "-"
			if r.Actor != nil {
				by = r.Actor.KeyID + " (" + r.Actor.Role + ")"
			}
			fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\n", r.Seq, r.Time.Local().Format(time.DateTime), r.Kind, r.Action, by, auditDetail(r))
		}
	}
	return tw.Flush()
}

// auditDetail is a record's one-line summary.
func auditDetail(r client.AuditRecord) string {
	var parts []string
	if c := r.Command; c != nil {
		if c.Line != "" {
			parts = append(parts, strconv.Quote(c.Line))
		}
		if c.Cwd != "" {
			parts = append(parts, "cwd="+c.Cwd)
		}
		if c.UID != nil {
			parts = append(parts, "uid="+strconv.Itoa(*c.UID))
		}
		if c.Session != "" {
			parts = append(parts, "session="+c.Session)
		}
		if c.ExitCode != nil {
			parts = append(parts, "exit="+strconv.Itoa(*c.ExitCode))
		}
		if c.Error != "" {
			parts = append(parts, "error="+strconv.Quote(c.Error))
		}
	}
	for _, f := range r.Files {
		s := f.Path
		if f.Dest != "" {
			s += " -> " + f.Dest
		}
		if f.Size != nil {
			s += fmt.Sprintf(" (%d B)", *f.Size)
		}
		parts = append(parts, s)
	}
	if e := r.Egress; e != nil {
		host := e.Host
		if e.Port > 0 {
			host += ":" + strconv.Itoa(e.Port)
		}
		parts = append(parts, host, "rule="+e.Rule, "via "+e.Layer)
	}
	if c := r.Credential; c != nil {
		parts = append(parts, "binding="+c.Binding, "host="+c.Host)
	}
	if r.Status != 0 {
		parts = append(parts, "status="+strconv.Itoa(r.Status))
	}
	if r.DurationMS != nil {
		parts = append(parts, fmt.Sprintf("%.1fms", *r.DurationMS))
	}
	if r.Count > 1 {
		parts = append(parts, fmt.Sprintf("x%d", r.Count))
	}
	return strings.Join(parts, " ")
}

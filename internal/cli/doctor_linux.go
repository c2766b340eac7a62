package cli

import (
	"fmt"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/moat-sandbox/moat/internal/errdefs"
	"github.com/moat-sandbox/moat/internal/preflight"
	"github.com/moat-sandbox/moat/internal/server"
)

// doctorReport is `moat doctor -o json`.
type doctorReport struct {
	Runtime string `json:"runtime"`
	// OK is false when moat serve would refuse to start.
	OK     bool              `json:"ok"`
	Checks []preflight.Check `json:"checks"`
}

func newDoctorCommand() *cobra.Command {
	cfg := server.Default()
	var output outputFormat
	cmd := &cobra.Command{
		Use:   "doctor",
		Short: "Check this host for what moat serve needs, and say how to fix what lacks",
		Long: `Check this host for what moat serve needs with the given flags: the
cgroup version and the controllers delegated to --cgroup-parent, the
kernel features the native backend uses (overlayfs, nftables, veth,
bridge; loop devices with --disk-quota), the OCI runtimes and their
versions, free space under --root, root privileges, and the Docker daemon
or the Kubernetes API for those runtimes. moat serve runs the same checks
at start and refuses to start on a failure (warnings are logged).

Exit status 0 when moat serve would start, 3 when a check failed.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			r := server.Preflight(cmd.Context(), cfg, server.Host(cfg))
			failed := len(r.With(preflight.Fail))
			rep := doctorReport{Runtime: cfg.Runtime, OK: failed == 0, Checks: r.Checks}
			if err := render(cmd.OutOrStdout(), output, rep, func(tw *tabwriter.Writer) { doctorTable(tw, rep) }); err != nil {
				return err
			}
			if failed > 0 {
				return errdefs.Newf(errdefs.ErrFailedPrecondition, "%d of %d checks failed: moat serve --runtime %s would refuse to start", failed, len(r.Checks), cfg.Runtime)
			}
			return nil
		},
	}
	hostFlags(cmd, &cfg)
	addOutputFlag(cmd, &output)
	return cmd
}

// doctorTable prints one line per check, the fix indented below it.
func doctorTable(tw *tabwriter.Writer, rep doctorReport) {
	fmt.Fprintln(tw, "STATUS\tCHECK\tDETAIL")
	for _, c := range rep.Checks {
		fmt.Fprintf(tw, "%s\t%s\t%s\n", c.Status, c.Name, c.Detail)
		if c.Fix != "" && c.Status != preflight.OK {
			fmt.Fprintf(tw, "\t\t  fix: %s\n", c.Fix)
		}
	}
}

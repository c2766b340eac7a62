package cli

import (
	"fmt"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/moat-sandbox/moat/internal/agentbin"
	"github.com/moat-sandbox/moat/internal/buildinfo"
)

// versionInfo is `moat version -o json`.
type versionInfo struct {
	buildinfo.Info
	// AgentDigest is the sha256 of the in-sandbox agent this moat
	// carries ("" when it was built without one).
	AgentDigest string `json:"agentDigest"`
}

func newVersionCommand() *cobra.Command {
	var output outputFormat
	cmd := &cobra.Command{
		Use:   "version",
		Short: "Print moat's version, commit, Go version and the digest of the agent it carries",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			v := versionInfo{Info: buildinfo.Read()}
			v.AgentDigest, _ = agentbin.Digest()
			return render(cmd.OutOrStdout(), output, v, func(tw *tabwriter.Writer) { versionTable(tw, v) })
		},
	}
	addOutputFlag(cmd, &output)
	return cmd
}

func versionTable(tw *tabwriter.Writer, v versionInfo) {
	commit := v.Commit
	switch {
	case commit == "":
		commit = "unknown"
	case v.Modified:
		commit += " (modified)"
	}
	agent := v.AgentDigest
	if agent == "" {
		agent = "none (built without the agent: make build)"
	}
	fmt.Fprintf(tw, "moat\t%s\n", v.Version)
	fmt.Fprintf(tw, "commit\t%s\n", commit)
	fmt.Fprintf(tw, "go\t%s\n", v.GoVersion)
	fmt.Fprintf(tw, "platform\t%s\n", v.Platform)
	fmt.Fprintf(tw, "agent\t%s\n", agent)
}

package cli

import (
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strconv"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/moat-sandbox/moat/client"
	"github.com/moat-sandbox/moat/internal/atomicfile"
	"github.com/moat-sandbox/moat/internal/errdefs"
)

// newFilesCommand is the `moat files` noun: file transfer and file
// operations inside a sandbox through its agent.
func newFilesCommand() *cobra.Command {
	af := &agentFlags{}
	cmd := &cobra.Command{
		Use:     "files",
		Aliases: []string{"file", "fs"},
		Short:   "Copy files to and from a sandbox and manage its files",
	}
	af.register(cmd)
	cmd.AddCommand(newFilesPutCommand(af), newFilesGetCommand(af), newFilesListCommand(af),
		newFilesStatCommand(af), newFilesRemoveCommand(af), newFilesMkdirCommand(af))
	return classifyTree(cmd)
}

// parseMode parses an octal permission flag ("644", "0755"); "" is 0.
func parseMode(s string) (int, error) {
	if s == "" {
		return 0, nil
	}
	n, err := strconv.ParseUint(s, 8, 32)
	if err != nil || n > 0o7777 {
		return 0, errdefs.Invalid("CLI::INVALID_FLAG", fmt.Sprintf("--mode %q: want octal permission bits like 644", s))
	}
	return int(n), nil
}

func newFilesPutCommand(af *agentFlags) *cobra.Command {
	var modeFlag string
	cmd := &cobra.Command{
		Use:   "put ID LOCAL|- REMOTE",
		Short: "Upload a local file (or stdin) to a path in the sandbox",
		Long: `Upload LOCAL (or stdin with -) to REMOTE, creating parent directories. A
REMOTE ending in / gets LOCAL's base name. The mode is LOCAL's permission
bits unless --mode is given.`,
		Args: cobra.ExactArgs(3),
		RunE: func(cmd *cobra.Command, args []string) error {
			id, local, remote := args[0], args[1], args[2]
			mode, err := parseMode(modeFlag)
			if err != nil {
				return err
			}
			var r io.Reader = cmd.InOrStdin()
			if local != "-" {
				f, err := os.Open(local)
				if err != nil {
					return err
				}
				defer f.Close()
				st, err := f.Stat()
				if err != nil {
					return err
				}
				if st.IsDir() {
					return errdefs.Invalid("CLI::INVALID_ARGS", local+" is a directory")
				}
				if modeFlag == "" {
					mode = int(st.Mode().Perm())
				}
				if len(remote) > 0 && remote[len(remote)-1] == '/' {
					remote += filepath.Base(local)
				}
				r = f
			} else if len(remote) > 0 && remote[len(remote)-1] == '/' {
				return errdefs.Invalid("CLI::INVALID_ARGS", "REMOTE must name a file when uploading stdin")
			}
			h, err := af.sandbox(cmd.Context(), id)
			if err != nil {
				return err
			}
			return h.Upload(cmd.Context(), remote, r, mode)
		},
	}
	cmd.Flags().StringVar(&modeFlag, "mode", "", "permission bits in octal (default: LOCAL's, or the agent's for stdin)")
	return cmd
}

func newFilesGetCommand(af *agentFlags) *cobra.Command {
	return &cobra.Command{
		Use:   "get ID REMOTE [LOCAL|-]",
		Short: "Download a file from the sandbox (to stdout with -)",
		Long: `Download REMOTE to LOCAL (default: its base name in the current
directory; into LOCAL if that is a directory; stdout with -). The local file
is written next to its destination and renamed into place when complete.`,
		Args: cobra.RangeArgs(2, 3),
		RunE: func(cmd *cobra.Command, args []string) error {
			id, remote := args[0], args[1]
			local := path.Base(remote)
			if len(args) == 3 {
				local = args[2]
			}
			if st, err := os.Stat(local); local != "-" && err == nil && st.IsDir() {
				local = filepath.Join(local, path.Base(remote))
			}
			h, err := af.sandbox(cmd.Context(), id)
			if err != nil {
				return err
			}
			rc, err := h.Download(cmd.Context(), remote)
			if err != nil {
				return err
			}
			defer rc.Close()
			if local == "-" {
				_, err := io.Copy(cmd.OutOrStdout(), rc)
				return err
			}
			return atomicfile.WriteFrom(local, rc, 0o644)
		},
	}
}

func newFilesListCommand(af *agentFlags) *cobra.Command {
	var output outputFormat
	cmd := &cobra.Command{
		Use:     "ls ID DIR",
		Aliases: []string{"list"},
		Short:   "List a directory in the sandbox",
		Args:    cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			h, err := af.sandbox(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			infos, err := h.ListDir(cmd.Context(), args[1])
			if err != nil {
				return err
			}
			if infos == nil {
				infos = []client.FileInfo{}
			}
			return render(cmd.OutOrStdout(), output, infos, func(tw *tabwriter.Writer) { fileTable(tw, infos) })
		},
	}
	addOutputFlag(cmd, &output)
	return cmd
}

func fileTable(tw *tabwriter.Writer, infos []client.FileInfo) {
	fmt.Fprintln(tw, "MODE\tOWNER\tGROUP\tSIZE\tMODIFIED\tPATH")
	for _, fi := range infos {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%s\t%s\n", fileMode(fi), fi.Owner, fi.Group, fi.Size,
			fi.ModifiedAt.Local().Format(time.DateTime), fi.Path)
	}
}

// fileMode renders a FileInfo's type and permissions like ls -l.
func fileMode(fi client.FileInfo) string {
	m := fi.Perm()
	switch fi.Type {
	case "directory":
		m |= os.ModeDir
	case "symlink":
		m |= os.ModeSymlink
	case "other":
		m |= os.ModeIrregular
	}
	return m.String()
}

func newFilesStatCommand(af *agentFlags) *cobra.Command {
	var output outputFormat
	cmd := &cobra.Command{
		Use:   "stat ID PATH...",
		Short: "Show file information",
		Args:  cobra.MinimumNArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			h, err := af.sandbox(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			m, err := h.FileInfo(cmd.Context(), args[1:]...)
			if err != nil {
				return err
			}
			infos := make([]client.FileInfo, 0, len(m))
			for _, fi := range m {
				infos = append(infos, fi)
			}
			sort.Slice(infos, func(i, j int) bool { return infos[i].Path < infos[j].Path })
			return render(cmd.OutOrStdout(), output, infos, func(tw *tabwriter.Writer) { fileTable(tw, infos) })
		},
	}
	addOutputFlag(cmd, &output)
	return cmd
}

func newFilesRemoveCommand(af *agentFlags) *cobra.Command {
	var recursive bool
	cmd := &cobra.Command{
		Use:     "rm ID PATH...",
		Aliases: []string{"remove", "delete"},
		Short:   "Delete files (directories too with -r)",
		Args:    cobra.MinimumNArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			h, err := af.sandbox(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			if recursive {
				return h.RemoveDirs(cmd.Context(), args[1:]...)
			}
			return h.DeleteFiles(cmd.Context(), args[1:]...)
		},
	}
	cmd.Flags().BoolVarP(&recursive, "recursive", "r", false, "delete directories and their contents (rm -rf)")
	return cmd
}

func newFilesMkdirCommand(af *agentFlags) *cobra.Command {
	var modeFlag string
	cmd := &cobra.Command{
		Use:   "mkdir ID DIR...",
		Short: "Create directories and their parents (mkdir -p)",
		Args:  cobra.MinimumNArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			mode, err := parseMode(modeFlag)
			if err != nil {
				return err
			}
			h, err := af.sandbox(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			for _, d := range args[1:] {
				if err := h.Mkdir(cmd.Context(), d, mode); err != nil {
					return err
				}
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&modeFlag, "mode", "755", "permission bits in octal")
	return cmd
}

package cli

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"path/filepath"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/moat-sandbox/moat/internal/errdefs"
	"github.com/moat-sandbox/moat/internal/image"
	"github.com/moat-sandbox/moat/internal/lifecycle"
)

// newImageCommand is the `moat image` noun (pull, import, ls, rm). For now
// it operates on the local store under <root>/images directly (the same
// store `moat serve --root` uses; both may run at once).
func newImageCommand() *cobra.Command {
	root := "/var/lib/moat"
	cmd := &cobra.Command{Use: "image", Short: "Manage local images"}
	cmd.PersistentFlags().StringVar(&root, "root", root, "moat state directory (the image store is <root>/images)")
	open := func(cmd *cobra.Command) (*image.Store, error) {
		return image.Open(cmd.Context(), filepath.Join(root, "images"))
	}
	cmd.AddCommand(newImagePullCommand(open), newImageImportCommand(open), newImageListCommand(open), newImageRemoveCommand(open),
		newImagePruneCommand(open))
	return cmd
}

type openStore func(cmd *cobra.Command) (*image.Store, error)

func newImagePullCommand(open openStore) *cobra.Command {
	var username string
	var passwordStdin, quiet bool
	cmd := &cobra.Command{
		Use:   "pull REF",
		Short: "Pull an image from a registry",
		Long: `Pull an image from a registry into the local store.

Registries on localhost, loopback or private (RFC 1918) addresses are
reached over plain HTTP, all others over HTTPS. For a private registry pass
--username and the password on stdin (--password-stdin); credentials are
never taken from argv or the docker config.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			var auth *image.Auth
			if username != "" || passwordStdin {
				auth = &image.Auth{Username: username}
				if passwordStdin {
					pw, err := readPassword(cmd.InOrStdin())
					if err != nil {
						return err
					}
					auth.Password = pw
				}
			}
			st, err := open(cmd)
			if err != nil {
				return err
			}
			defer st.Close()
			var progress func(image.Progress)
			finish := func() {}
			switch errOut := cmd.ErrOrStderr(); {
			case quiet:
			case isTerminal(errOut):
				tp := newTTYProgress(errOut)
				progress, finish = tp.report, tp.finish
			default:
				progress = newPullProgress(errOut)
			}
			img, err := st.Pull(cmd.Context(), args[0], auth, progress)
			finish()
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "%s %s\n", img.Name, img.ID)
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVarP(&username, "username", "u", "", "registry user name")
	f.BoolVar(&passwordStdin, "password-stdin", false, "read the registry password from stdin")
	f.BoolVarP(&quiet, "quiet", "q", false, "no progress output")
	return cmd
}

func readPassword(r io.Reader) (string, error) {
	line, err := bufio.NewReader(r).ReadString('\n')
	if err != nil && err != io.EOF {
		return "", fmt.Errorf("read password from stdin: %w", err)
	}
	return strings.TrimRight(line, "\r\n"), nil
}

// newPullProgress prints one line per layer event, throttled to one
// update per layer per second.
func newPullProgress(w io.Writer) func(image.Progress) {
	var mu sync.Mutex
	last := map[string]time.Time{}
	return func(p image.Progress) {
		mu.Lock()
		defer mu.Unlock()
		id := shortID(p.Layer)
		switch {
		case p.Cached:
			fmt.Fprintf(w, "%s: already present\n", id)
		case p.Done:
			fmt.Fprintf(w, "%s: done (%s)\n", id, humanSize(p.Complete))
		default:
			if time.Since(last[p.Layer]) < time.Second {
				return
			}
			last[p.Layer] = time.Now()
			if p.Total > 0 {
				fmt.Fprintf(w, "%s: %s / %s (%d%%)\n", id, humanSize(p.Complete), humanSize(p.Total), p.Complete*100/p.Total)
			} else {
				fmt.Fprintf(w, "%s: %s\n", id, humanSize(p.Complete))
			}
		}
	}
}

func newImageImportCommand(open openStore) *cobra.Command {
	return &cobra.Command{
		Use:   "import NAME DIR|TAR",
		Short: "Import a rootfs directory, rootfs tarball, docker-save tarball or OCI layout",
		Long: `Import an image into the local store under NAME (normalized like a
registry reference: "busybox" is stored as index.docker.io/library/busybox:latest).

The source may be a rootfs directory, a rootfs tarball (.tar, .tar.gz,
.tar.zst), a "docker save" tarball or an OCI image layout directory.`,
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			st, err := open(cmd)
			if err != nil {
				return err
			}
			defer st.Close()
			img, err := st.Import(cmd.Context(), args[0], args[1])
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "%s %s\n", img.Name, img.ID)
			return nil
		},
	}
}

func newImageListCommand(open openStore) *cobra.Command {
	var output string
	cmd := &cobra.Command{
		Use:     "ls",
		Aliases: []string{"list"},
		Short:   "List local images",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if output != "table" && output != "json" {
				return errdefs.Invalid("CLI::INVALID_FLAG", "--output must be table or json")
			}
			st, err := open(cmd)
			if err != nil {
				return err
			}
			defer st.Close()
			imgs, err := st.List(cmd.Context())
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			if output == "json" {
				enc := json.NewEncoder(out)
				enc.SetIndent("", "  ")
				return enc.Encode(imgs)
			}
			tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "NAME\tID\tLAYERS\tSIZE\tCREATED")
			for _, img := range imgs {
				fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\n", img.Name, shortID(img.ID), len(img.Layers),
					humanSize(img.Size), img.CreatedAt.Local().Format(time.DateTime))
			}
			return tw.Flush()
		},
	}
	cmd.Flags().StringVarP(&output, "output", "o", "table", "output format: table or json")
	return cmd
}

func newImageRemoveCommand(open openStore) *cobra.Command {
	return &cobra.Command{
		Use:     "rm REF...",
		Aliases: []string{"remove"},
		Short:   "Remove images by name or ID and collect unused layers",
		Args:    cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			st, err := open(cmd)
			if err != nil {
				return err
			}
			defer st.Close()
			for _, ref := range args {
				if err := st.Remove(cmd.Context(), ref); err != nil {
					return err
				}
				fmt.Fprintln(cmd.OutOrStdout(), ref)
			}
			return nil
		},
	}
}

func newImagePruneCommand(open openStore) *cobra.Command {
	var budget string
	cmd := &cobra.Command{
		Use:   "prune",
		Short: "Remove images no sandbox uses (snapshot images stay) and collect their layers",
		Long: `Remove every image that no sandbox runs (their layers are leased by the
server, also across restarts) and that is not a snapshot's, least recently
used first, then delete the layers nothing references any more. With
--budget, stop as soon as the store fits in that many bytes.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			var opts image.PruneOptions
			if budget != "" {
				r, err := lifecycle.ParseResources(map[string]string{"disk": budget})
				if err != nil || r.DiskBytes <= 0 {
					return errdefs.Invalid("CLI::INVALID_FLAG", fmt.Sprintf("--budget %q: want a size such as 20Gi", budget))
				}
				opts.Budget = r.DiskBytes
			}
			st, err := open(cmd)
			if err != nil {
				return err
			}
			defer st.Close()
			res, err := st.Prune(cmd.Context(), opts)
			if err != nil {
				return err
			}
			for _, img := range res.Removed {
				fmt.Fprintln(cmd.OutOrStdout(), img.Name)
			}
			fmt.Fprintf(cmd.ErrOrStderr(), "pruned %d images; the store holds %s of layers\n", len(res.Removed), humanSize(res.Size))
			return nil
		},
	}
	cmd.Flags().StringVar(&budget, "budget", "", `stop once the store fits in this size, e.g. "20Gi" (default: prune every unused image)`)
	return cmd
}

func shortID(d string) string {
	h := strings.TrimPrefix(d, "sha256:")
	if len(h) > 12 {
		h = h[:12]
	}
	return h
}

func humanSize(n int64) string {
	const unit = 1000
	if n < unit {
		return fmt.Sprintf("%dB", n)
	}
	div, exp := int64(unit), 0
	for m := n / unit; m >= unit; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f%cB", float64(n)/float64(div), "kMGTPE"[exp])
}

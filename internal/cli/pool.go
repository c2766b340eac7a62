package cli

import (
	"fmt"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/moat-sandbox/moat/client"
	"github.com/moat-sandbox/moat/internal/errdefs"
)

// newPoolCommand is the `moat pool` noun: warm pools on a moat server.
func newPoolCommand() *cobra.Command {
	sf := &serverFlags{}
	cmd := &cobra.Command{
		Use:     "pool",
		Aliases: []string{"pools"},
		Short:   "Manage warm pools of pre-created sandboxes",
	}
	sf.register(cmd)
	cmd.AddCommand(newPoolCreateCommand(sf),
		newListCommand(sf, "List pools", (*client.Client).ListPools,
			func(tw *tabwriter.Writer, pools []client.Pool) { poolTable(tw, pools, time.Now()) }),
		newGetCommand(sf, "get NAME", nil, "Show one pool", (*client.Client).GetPool,
			func(tw *tabwriter.Writer, p *client.Pool) { poolDetail(tw, p, time.Now()) }),
		newRemoveCommand(sf, "rm NAME...", "Delete pools and their idle sandboxes", (*client.Client).DeletePool))
	return classifyTree(cmd)
}

type poolFlags struct {
	image, entrypoint                      string
	env, resources, extensions             []string
	bufferMin, bufferMax, poolMin, poolMax int
	output                                 outputFormat
}

func (f *poolFlags) spec(name string, argv []string) (client.PoolSpec, error) {
	invalid := func(msg string) error { return errdefs.Invalid("CLI::INVALID_FLAG", msg) }
	spec := client.PoolSpec{Name: name, CapacitySpec: client.PoolCapacity{
		BufferMin: f.bufferMin, BufferMax: f.bufferMax, PoolMin: f.poolMin, PoolMax: f.poolMax}}
	if f.image == "" {
		return spec, invalid("--image is required")
	}
	cs := spec.CapacitySpec
	if cs.BufferMax < cs.BufferMin || cs.PoolMax < cs.BufferMax || cs.PoolMax < cs.PoolMin || cs.PoolMax < 1 || cs.BufferMin < 0 || cs.PoolMin < 0 {
		return spec, invalid("capacity must satisfy 0 <= buffer-min <= buffer-max <= pool-max, 0 <= pool-min <= pool-max, pool-max >= 1")
	}
	spec.Template.Image = &client.ImageSpec{URI: f.image}
	var err error
	switch {
	case len(argv) > 0:
		spec.Template.Entrypoint = argv
	case f.entrypoint != "":
		if spec.Template.Entrypoint, err = splitWords(f.entrypoint); err != nil {
			return spec, err
		}
	default:
		spec.Template.Entrypoint = []string{"tail", "-f", "/dev/null"}
	}
	if spec.Template.Env, err = parseKV("env", f.env); err != nil {
		return spec, err
	}
	if spec.Template.ResourceLimits, err = parseKVList("resource", f.resources); err != nil {
		return spec, err
	}
	if spec.Template.Extensions, err = parseKV("extension", f.extensions); err != nil {
		return spec, err
	}
	return spec, nil
}

func newPoolCreateCommand(sf *serverFlags) *cobra.Command {
	f := &poolFlags{}
	cmd := &cobra.Command{
		Use:   "create NAME --image IMAGE [flags] [-- ENTRYPOINT...]",
		Short: "Create a warm pool",
		Example: `  moat pool create py --image python:3.12 --buffer-min 2 --buffer-max 4 --pool-max 10
  moat sb create --pool py`,
		Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if d := cmd.ArgsLenAtDash(); d > 1 {
				return errdefs.Invalid("CLI::INVALID_ARGS", "usage: moat pool create NAME [flags] [-- ENTRYPOINT...]")
			}
			spec, err := f.spec(args[0], args[1:])
			if err != nil {
				return err
			}
			c, err := sf.client()
			if err != nil {
				return err
			}
			p, err := c.CreatePool(cmd.Context(), spec)
			if err != nil {
				return err
			}
			if f.output == outputTable {
				fmt.Fprintln(cmd.OutOrStdout(), p.Name)
				return nil
			}
			return render(cmd.OutOrStdout(), f.output, p, nil)
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&f.image, "image", "", "image reference of the pool's sandboxes")
	fl.StringVar(&f.entrypoint, "entrypoint", "", `entrypoint command line (default "tail -f /dev/null"; words after -- win)`)
	fl.StringArrayVarP(&f.env, "env", "e", nil, "environment variable KEY=VALUE (repeatable)")
	fl.StringArrayVarP(&f.resources, "resource", "r", nil, "resource limits, e.g. cpu=500m,memory=512Mi (repeatable)")
	fl.StringArrayVar(&f.extensions, "extension", nil, "extension KEY=VALUE (repeatable)")
	fl.IntVar(&f.bufferMin, "buffer-min", 1, "idle sandboxes kept at least")
	fl.IntVar(&f.bufferMax, "buffer-max", 2, "idle sandboxes kept at most")
	fl.IntVar(&f.poolMin, "pool-min", 0, "sandboxes (idle + claimed) kept at least")
	fl.IntVar(&f.poolMax, "pool-max", 10, "sandboxes (idle + claimed) at most")
	addOutputFlag(cmd, &f.output)
	return cmd
}

func poolTable(tw *tabwriter.Writer, pools []client.Pool, now time.Time) {
	fmt.Fprintln(tw, "NAME\tTOTAL\tALLOCATED\tAVAILABLE\tBUFFER\tPOOL\tIMAGE\tAGE")
	for _, p := range pools {
		img := "-"
		if p.Template.Image != nil {
			img = p.Template.Image.URI
		}
		cs := p.CapacitySpec
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%d-%d\t%d-%d\t%s\t%s\n", p.Name, p.Status.Total, p.Status.Allocated,
			p.Status.Available, cs.BufferMin, cs.BufferMax, cs.PoolMin, cs.PoolMax, img, age(now, p.CreatedAt))
	}
}

func poolDetail(tw *tabwriter.Writer, p *client.Pool, now time.Time) {
	row := func(k, v string) { fmt.Fprintf(tw, "%s:\t%s\n", k, v) }
	row("Name", p.Name)
	img := "-"
	if p.Template.Image != nil {
		img = p.Template.Image.URI
	}
	row("Image", img)
	row("Entrypoint", quoteArgv(p.Template.Entrypoint))
	row("Env", joinKV(p.Template.Env))
	row("Resources", joinKV(p.Template.ResourceLimits))
	cs := p.CapacitySpec
	row("Capacity", fmt.Sprintf("buffer %d-%d, pool %d-%d", cs.BufferMin, cs.BufferMax, cs.PoolMin, cs.PoolMax))
	row("Sandboxes", fmt.Sprintf("%d total, %d allocated, %d available", p.Status.Total, p.Status.Allocated, p.Status.Available))
	row("Revision", p.Status.Revision)
	row("Created", p.CreatedAt.Local().Format(time.DateTime)+" ("+age(now, p.CreatedAt)+" ago)")
}

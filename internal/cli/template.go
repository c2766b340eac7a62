package cli

import (
	"fmt"
	"strconv"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/moat-sandbox/moat/client"
	"github.com/moat-sandbox/moat/internal/errdefs"
)

// newTemplateCommand is the `moat template` noun: sandbox templates, the
// defaults a create (OpenSandbox templateId, E2B templateID) starts from.
func newTemplateCommand() *cobra.Command {
	sf := &serverFlags{}
	cmd := &cobra.Command{
		Use:     "template",
		Aliases: []string{"templates", "tpl"},
		Short:   "Manage sandbox templates (E2B's templateID, OpenSandbox's templateId)",
	}
	sf.register(cmd)
	cmd.AddCommand(newTemplateCreateCommand(sf),
		newListCommand(sf, "List templates", (*client.Client).ListTemplates,
			func(tw *tabwriter.Writer, ts []client.Template) { templateTable(tw, ts, time.Now()) }),
		newGetCommand(sf, "get ID", nil, "Show one template", (*client.Client).GetTemplate,
			func(tw *tabwriter.Writer, t *client.Template) { templateDetail(tw, t) }),
		newRemoveCommand(sf, "rm ID...", "Delete templates (sandboxes made from them stay)", (*client.Client).DeleteTemplate))
	return classifyTree(cmd)
}

type templateFlags struct {
	image, pool, entrypoint, user, workdir string
	env, resources                         []string
	timeout                                time.Duration
	output                                 outputFormat
}

func (f *templateFlags) spec(id string, argv []string) (client.TemplateSpec, error) {
	invalid := func(msg string) error { return errdefs.Invalid("CLI::INVALID_FLAG", msg) }
	spec := client.TemplateSpec{ID: id, Image: f.image, Pool: f.pool, User: f.user, Workdir: f.workdir}
	switch {
	case (f.image == "") == (f.pool == ""):
		return spec, invalid("one of --image or --pool is required")
	case f.timeout < 0 || f.timeout%time.Second != 0:
		return spec, invalid("--timeout must be a whole number of seconds")
	}
	spec.TimeoutSeconds = int(f.timeout / time.Second)
	var err error
	switch {
	case len(argv) > 0:
		spec.Entrypoint = argv
	case f.entrypoint != "":
		if spec.Entrypoint, err = splitWords(f.entrypoint); err != nil {
			return spec, err
		}
	}
	if spec.Env, err = parseKV("env", f.env); err != nil {
		return spec, err
	}
	if spec.ResourceLimits, err = parseKVList("resource", f.resources); err != nil {
		return spec, err
	}
	return spec, nil
}

func newTemplateCreateCommand(sf *serverFlags) *cobra.Command {
	f := &templateFlags{}
	cmd := &cobra.Command{
		Use:   "create ID --image IMAGE|--pool POOL [flags] [-- START COMMAND...]",
		Short: "Create a template",
		Example: `  moat template create py --image python:3.12 -r cpu=1,memory=1Gi --user user --workdir /home/user
  moat template create warm-py --pool py        # creates claim from warm pool py
  moat sb create --template py                  # or E2B: Sandbox.create('py')`,
		Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if d := cmd.ArgsLenAtDash(); d > 1 {
				return errdefs.Invalid("CLI::INVALID_ARGS", "usage: moat template create ID [flags] [-- START COMMAND...]")
			}
			spec, err := f.spec(args[0], args[1:])
			if err != nil {
				return err
			}
			c, err := sf.client()
			if err != nil {
				return err
			}
			t, err := c.CreateTemplate(cmd.Context(), spec)
			if err != nil {
				return err
			}
			if f.output == outputTable {
				fmt.Fprintln(cmd.OutOrStdout(), t.ID)
				return nil
			}
			return render(cmd.OutOrStdout(), f.output, t, nil)
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&f.image, "image", "", "image the template's sandboxes start from")
	fl.StringVar(&f.pool, "pool", "", "warm pool the template's sandboxes are claimed from (instead of --image)")
	fl.StringVar(&f.entrypoint, "entrypoint", "", `start command (default "tail -f /dev/null"; words after -- win)`)
	fl.StringArrayVarP(&f.env, "env", "e", nil, "environment variable KEY=VALUE (repeatable)")
	fl.StringArrayVarP(&f.resources, "resource", "r", nil, "resource limits, e.g. cpu=1,memory=1Gi (repeatable)")
	fl.StringVar(&f.user, "user", "", "E2B's default user of commands and files")
	fl.StringVar(&f.workdir, "workdir", "", "E2B's default working directory")
	fl.DurationVar(&f.timeout, "timeout", 0, "lifetime of a sandbox whose create gives none (default: the API's)")
	addOutputFlag(cmd, &f.output)
	return cmd
}

func templateSource(t client.Template) string {
	if t.Pool != "" {
		return "pool:" + t.Pool
	}
	return t.Image
}

func templateTable(tw *tabwriter.Writer, ts []client.Template, now time.Time) {
	fmt.Fprintln(tw, "ID\tSOURCE\tUSER\tWORKDIR\tTENANT\tAGE")
	for _, t := range ts {
		owner, ago := t.Tenant, "-"
		if t.BuiltIn {
			owner = "(built in)"
		} else {
			ago = age(now, t.CreatedAt)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", t.ID, templateSource(t), dash(t.User), dash(t.Workdir), owner, ago)
	}
}

func templateDetail(tw *tabwriter.Writer, t *client.Template) {
	row := func(k, v string) { fmt.Fprintf(tw, "%s:\t%s\n", k, v) }
	row("ID", t.ID)
	row("Source", templateSource(*t))
	row("Start", quoteArgv(t.Entrypoint))
	row("Env", joinKV(t.Env))
	row("Resources", joinKV(t.ResourceLimits))
	row("User", dash(t.User))
	row("Workdir", dash(t.Workdir))
	timeout := "-"
	if t.TimeoutSeconds > 0 {
		timeout = strconv.Itoa(t.TimeoutSeconds) + "s"
	}
	row("Timeout", timeout)
	if t.BuiltIn {
		row("Tenant", "(built in)")
	} else {
		row("Tenant", t.Tenant)
		row("Created", t.CreatedAt.Local().Format(time.DateTime))
	}
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

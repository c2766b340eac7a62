package cli

import (
	"context"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/moat-sandbox/moat/client"
	"github.com/moat-sandbox/moat/internal/errdefs"
)

// newSandboxCommand is the `moat sandbox` noun (alias `sb`): lifecycle
// verbs against a running `moat serve`.
func newSandboxCommand() *cobra.Command {
	sf := &serverFlags{}
	cmd := &cobra.Command{
		Use:     "sandbox",
		Aliases: []string{"sb", "sandboxes"},
		Short:   "Create, list and manage sandboxes on a moat server",
	}
	sf.register(cmd)
	cmd.AddCommand(
		newSandboxCreateCommand(sf, false),
		newSandboxCreateCommand(sf, true),
		newSandboxListCommand(sf),
		newGetCommand(sf, "get ID", []string{"inspect", "show"}, "Show one sandbox", (*client.Client).GetSandbox,
			func(tw *tabwriter.Writer, sb *client.Sandbox) { sandboxDetail(tw, sb, time.Now()) }),
		newRemoveCommand(sf, "rm ID...", "Delete sandboxes", (*client.Client).DeleteSandbox),
		newEachCommand(sf, "pause ID...", nil, "Pause (freeze) running sandboxes", (*client.Client).Pause),
		newEachCommand(sf, "hibernate ID...", nil, "Hibernate running sandboxes: stop their processes and free their memory (resume wakes them)", (*client.Client).Hibernate),
		newEachCommand(sf, "resume ID...", nil, "Resume paused or hibernated sandboxes", (*client.Client).Resume),
		newSandboxRenewCommand(sf),
		newSandboxForkCommand(sf),
		newSandboxAuditCommand(sf),
	)
	return classifyTree(cmd)
}

// createFlags are the flags of `sandbox create` and `sandbox batch`.
type createFlags struct {
	image, snapshot, entrypoint, pool, runtime string
	template, idleAction, idleCPUBelow         string
	timeout, idleTimeout                       time.Duration
	env, metadata, resources, extensions       []string
	count                                      int
	wait                                       bool
	waitTimeout                                time.Duration
	quiet                                      bool
	output                                     outputFormat
	volumes                                    []string
	networkPolicyFile                          string
	credentialProxy                            bool
	stdin                                      io.Reader // for --network-policy-file -
}

func (f *createFlags) register(cmd *cobra.Command, batch bool) {
	fl := cmd.Flags()
	fl.StringVar(&f.image, "image", "", "image reference (e.g. docker.io/library/python:3.12)")
	fl.StringVar(&f.snapshot, "snapshot", "", "create from this snapshot instead of an image")
	fl.StringVar(&f.template, "template", "", "create from this template (moat template ls): it fills what the flags leave unset")
	fl.StringVar(&f.entrypoint, "entrypoint", "", `entrypoint command line (default "tail -f /dev/null"; words after -- win)`)
	fl.DurationVar(&f.timeout, "timeout", 0, "expire the sandbox after this long (>= 1m; default: the server's)")
	fl.StringArrayVarP(&f.env, "env", "e", nil, "environment variable KEY=VALUE (repeatable)")
	fl.StringArrayVarP(&f.metadata, "metadata", "m", nil, "metadata label KEY=VALUE (repeatable)")
	fl.StringArrayVarP(&f.resources, "resource", "r", nil, "resource limits, e.g. cpu=500m,memory=512Mi,pids=256 (repeatable)")
	fl.StringArrayVar(&f.extensions, "extension", nil, "extension KEY=VALUE (repeatable)")
	fl.StringVar(&f.pool, "pool", "", "claim from this warm pool (extension poolRef)")
	fl.StringVar(&f.runtime, "runtime", "", "runtime class: runc, crun, runsc, docker (extension moat.runtime)")
	fl.DurationVar(&f.idleTimeout, "idle-timeout", 0, "pause the sandbox after this long without a request through the server (whole seconds; extension moat.idle.timeout); a request wakes it")
	fl.StringVar(&f.idleAction, "idle-action", "", "what --idle-timeout does: pause (default) or hibernate: stop the processes and free their memory (extension moat.idle.action)")
	fl.StringVar(&f.idleCPUBelow, "idle-cpu-below", "", "with --idle-timeout: idle only while the CPU use over the timeout stays below this percentage of one core (extension moat.idle.cpuBelow)")
	fl.StringVar(&f.networkPolicyFile, "network-policy-file", "", `egress policy JSON file {"defaultAction":"deny","egress":[{"action":"allow","target":"pypi.org"}]} ("-" for stdin)`)
	fl.BoolVar(&f.credentialProxy, "credential-proxy", false, "turn on the Credential Vault's proxy (needs --network-policy-file); see moat credential-vault")
	fl.StringArrayVarP(&f.volumes, "volume", "v", nil, "mount CLAIM[/SUBPATH]:PATH[:ro] (a named volume, created if missing) or /HOST/PATH:PATH[:ro] (repeatable)")
	if batch {
		fl.IntVarP(&f.count, "count", "n", 2, "number of sandboxes (all or nothing)")
	} else {
		fl.IntVarP(&f.count, "count", "n", 1, "number of sandboxes; more than one uses the batch API (all or nothing)")
	}
	fl.BoolVar(&f.wait, "wait", true, "wait until the sandbox is Running")
	fl.DurationVar(&f.waitTimeout, "wait-timeout", 5*time.Minute, "how long --wait waits")
	fl.BoolVarP(&f.quiet, "quiet", "q", false, "print only the sandbox IDs")
	addOutputFlag(cmd, &f.output)
}

// request builds the CreateRequest from the flags and the words after --.
func (f *createFlags) request(argv []string) (client.CreateRequest, error) {
	var req client.CreateRequest
	invalid := func(msg string) error { return errdefs.Invalid("CLI::INVALID_FLAG", msg) }
	switch {
	case f.image == "" && f.snapshot == "" && f.pool == "" && f.template == "":
		return req, invalid("one of --image, --snapshot, --template or --pool is required")
	case f.image != "" && f.snapshot != "":
		return req, invalid("--image and --snapshot are mutually exclusive")
	case f.timeout < 0 || f.timeout > 0 && f.timeout < time.Minute:
		return req, invalid("--timeout must be at least 1m")
	case f.count < 1:
		return req, invalid("--count must be at least 1")
	case f.idleTimeout < 0 || f.idleTimeout%time.Second != 0:
		return req, invalid("--idle-timeout must be a whole number of seconds")
	case f.idleAction != "" && f.idleTimeout == 0:
		return req, invalid("--idle-action needs --idle-timeout")
	case f.idleCPUBelow != "" && f.idleTimeout == 0:
		return req, invalid("--idle-cpu-below needs --idle-timeout")
	}
	if f.image != "" {
		req.Image = &client.ImageSpec{URI: f.image}
	}
	req.SnapshotID = f.snapshot
	req.TemplateID = f.template
	req.Timeout = f.timeout
	var err error
	if req.Env, err = parseKV("env", f.env); err != nil {
		return req, err
	}
	if req.Metadata, err = parseKV("metadata", f.metadata); err != nil {
		return req, err
	}
	if req.ResourceLimits, err = parseKVList("resource", f.resources); err != nil {
		return req, err
	}
	if req.Extensions, err = parseKV("extension", f.extensions); err != nil {
		return req, err
	}
	if req.Volumes, err = parseVolumeFlags(f.volumes); err != nil {
		return req, err
	}
	if f.networkPolicyFile != "" {
		b, err := readBody(f.stdin, f.networkPolicyFile)
		if err != nil {
			return req, err
		}
		req.NetworkPolicy = &client.NetworkPolicy{}
		if err := decodeBody(b, req.NetworkPolicy); err != nil {
			return req, err
		}
	}
	if f.credentialProxy {
		if req.NetworkPolicy == nil {
			return req, invalid("--credential-proxy needs --network-policy-file")
		}
		req.CredentialProxy = &client.CredentialProxy{Enabled: true}
	}
	idleTimeout := ""
	if f.idleTimeout > 0 {
		idleTimeout = strconv.Itoa(int(f.idleTimeout / time.Second))
	}
	for k, v := range map[string]string{"poolRef": f.pool, "moat.runtime": f.runtime,
		"moat.idle.timeout": idleTimeout, "moat.idle.action": f.idleAction, "moat.idle.cpuBelow": strings.TrimSuffix(f.idleCPUBelow, "%")} {
		if v == "" {
			continue
		}
		if req.Extensions == nil {
			req.Extensions = map[string]string{}
		}
		req.Extensions[k] = v
	}
	switch {
	case len(argv) > 0:
		req.Entrypoint = argv
	case f.entrypoint != "":
		if req.Entrypoint, err = splitWords(f.entrypoint); err != nil {
			return req, err
		}
		if len(req.Entrypoint) == 0 {
			return req, invalid("--entrypoint is empty")
		}
	case f.image != "" && f.template == "":
		// The API requires an entrypoint with an image; this one keeps the
		// sandbox alive until it is deleted or expires.
		req.Entrypoint = []string{"tail", "-f", "/dev/null"}
	}
	return req, nil
}

func newSandboxCreateCommand(sf *serverFlags, batch bool) *cobra.Command {
	f := &createFlags{}
	cmd := &cobra.Command{
		Use:   "create [flags] [-- ENTRYPOINT...]",
		Short: "Create a sandbox",
		Long: `Create a sandbox and print its ID (or the sandbox with -o json|yaml).

The entrypoint is the words after --, or --entrypoint, or "tail -f /dev/null".
With --count N (or "sandbox batch") N identical sandboxes are created in one
all-or-nothing call.`,
		Example: `  moat sandbox create --image busybox --timeout 30m -e A=1 -m team=ml -r cpu=1,memory=512Mi
  moat sb create --image python:3.12 -- python3 -m http.server 8000
  ID=$(moat sb create --image busybox -q)`,
	}
	if batch {
		cmd.Use = "batch --count N [flags] [-- ENTRYPOINT...]"
		cmd.Short = "Create several identical sandboxes in one call"
	}
	f.register(cmd, batch)
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		f.stdin = cmd.InOrStdin()
		req, err := f.request(args)
		if err != nil {
			return err
		}
		c, err := sf.client()
		if err != nil {
			return err
		}
		ctx := cmd.Context()
		var sbs []client.Sandbox
		if f.count > 1 || batch {
			if sbs, err = c.CreateBatch(ctx, req, f.count); err != nil {
				return err
			}
		} else {
			sb, err := c.CreateSandbox(ctx, req)
			if err != nil {
				return err
			}
			sbs = []client.Sandbox{*sb}
		}
		if f.wait {
			for i := range sbs {
				sb, err := waitRunning(ctx, c, sbs[i].ID, f.waitTimeout)
				if err != nil {
					return err
				}
				sbs[i].Status = sb.Status
			}
		}
		out := cmd.OutOrStdout()
		if f.output == outputTable || f.quiet {
			for _, sb := range sbs {
				fmt.Fprintln(out, sb.ID)
			}
			return nil
		}
		if len(sbs) == 1 && !batch {
			return render(out, f.output, sbs[0], nil)
		}
		return render(out, f.output, map[string]any{"items": sbs}, nil)
	}
	return cmd
}

// waitRunning polls a sandbox until it is Running; Failed or Terminated
// end the wait with an error.
func waitRunning(ctx context.Context, c *client.Client, id string, timeout time.Duration) (*client.Sandbox, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	delay := 100 * time.Millisecond
	for {
		sb, err := c.GetSandbox(ctx, id)
		if err != nil {
			if ctx.Err() != nil {
				return nil, fmt.Errorf("sandbox %s: not Running after %s: %w", id, timeout, errdefs.ErrDeadlineExceeded)
			}
			return nil, err
		}
		switch sb.Status.State {
		case client.StateRunning:
			return sb, nil
		case client.StateFailed, client.StateTerminated:
			msg := sb.Status.State
			if sb.Status.Reason != "" || sb.Status.Message != "" {
				msg += ": " + strings.TrimPrefix(sb.Status.Reason+": "+sb.Status.Message, ": ")
			}
			return nil, fmt.Errorf("sandbox %s is %s: %w", id, msg, errdefs.ErrFailedPrecondition)
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("sandbox %s: still %s after %s: %w", id, sb.Status.State, timeout, errdefs.ErrDeadlineExceeded)
		case <-time.After(delay):
		}
		delay = min(delay*2, 2*time.Second)
	}
}

func newSandboxListCommand(sf *serverFlags) *cobra.Command {
	var states, metadata []string
	var page, pageSize int
	var all, quiet bool
	var output outputFormat
	cmd := &cobra.Command{
		Use:     "ls",
		Aliases: []string{"list"},
		Short:   "List sandboxes",
		Example: `  moat sb ls --state Running --metadata team=ml
  moat sb ls --all -o json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			md, err := parseKV("metadata", metadata)
			if err != nil {
				return err
			}
			if page < 0 || pageSize < 0 {
				return errdefs.Invalid("CLI::INVALID_FLAG", "--page and --page-size must be positive")
			}
			c, err := sf.client()
			if err != nil {
				return err
			}
			opts := client.ListOptions{States: states, Metadata: md, Page: page, PageSize: pageSize}
			list, err := listSandboxes(cmd.Context(), c, opts, all)
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			if quiet {
				for _, sb := range list.Items {
					fmt.Fprintln(out, sb.ID)
				}
				return nil
			}
			if err := render(out, output, list, func(tw *tabwriter.Writer) { sandboxTable(tw, list.Items, time.Now()) }); err != nil {
				return err
			}
			if p := list.Pagination; output == outputTable && p.HasNextPage && !all {
				fmt.Fprintf(cmd.ErrOrStderr(), "page %d of %d (%d sandboxes); next: --page %d, or --all\n",
					p.Page, p.TotalPages, p.TotalItems, p.Page+1)
			}
			return nil
		},
	}
	fl := cmd.Flags()
	fl.StringArrayVar(&states, "state", nil, "only sandboxes in this state (repeatable, ORed)")
	fl.StringArrayVarP(&metadata, "metadata", "m", nil, "only sandboxes with this metadata KEY=VALUE (repeatable, ANDed)")
	fl.IntVar(&page, "page", 0, "page number (default 1)")
	fl.IntVar(&pageSize, "page-size", 0, "sandboxes per page (server default 20)")
	fl.BoolVarP(&all, "all", "A", false, "fetch every page")
	fl.BoolVarP(&quiet, "quiet", "q", false, "print only IDs")
	addOutputFlag(cmd, &output)
	return cmd
}

// listSandboxes returns one page, or with all every page merged (the
// pagination block then describes the whole list).
func listSandboxes(ctx context.Context, c *client.Client, opts client.ListOptions, all bool) (*client.SandboxList, error) {
	if !all {
		return c.ListSandboxes(ctx, opts)
	}
	if opts.PageSize == 0 {
		opts.PageSize = 100
	}
	merged := &client.SandboxList{Items: []client.Sandbox{}}
	for opts.Page = 1; ; opts.Page++ {
		l, err := c.ListSandboxes(ctx, opts)
		if err != nil {
			return nil, err
		}
		merged.Items = append(merged.Items, l.Items...)
		if !l.Pagination.HasNextPage || len(l.Items) == 0 || opts.Page >= 10000 {
			break
		}
	}
	n := len(merged.Items)
	merged.Pagination = client.Pagination{Page: 1, PageSize: n, TotalItems: n, TotalPages: 1}
	return merged, nil
}

func sandboxTable(tw *tabwriter.Writer, items []client.Sandbox, now time.Time) {
	fmt.Fprintln(tw, "ID\tSTATE\tIMAGE\tAGE\tEXPIRES\tMETADATA")
	for _, sb := range items {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", sb.ID, sb.Status.State, sandboxSource(sb),
			age(now, sb.CreatedAt), until(now, sb.ExpiresAt), joinKV(sb.Metadata))
	}
}

func sandboxSource(sb client.Sandbox) string {
	switch {
	case sb.Image != nil && sb.Image.URI != "":
		return sb.Image.URI
	case sb.SnapshotID != "":
		return "snapshot:" + sb.SnapshotID
	}
	return "-"
}

func sandboxDetail(tw *tabwriter.Writer, sb *client.Sandbox, now time.Time) {
	row := func(k, v string) { fmt.Fprintf(tw, "%s:\t%s\n", k, v) }
	row("ID", sb.ID)
	row("State", sb.Status.State)
	if sb.Status.Reason != "" || sb.Status.Message != "" {
		row("Reason", strings.TrimPrefix(sb.Status.Reason+": "+sb.Status.Message, ": "))
	}
	row("Image", sandboxSource(*sb))
	row("Entrypoint", quoteArgv(sb.Entrypoint))
	row("Metadata", joinKV(sb.Metadata))
	row("Created", sb.CreatedAt.Local().Format(time.DateTime)+" ("+age(now, sb.CreatedAt)+" ago)")
	exp := "never"
	if sb.ExpiresAt != nil {
		exp = sb.ExpiresAt.Local().Format(time.DateTime) + " (" + until(now, sb.ExpiresAt) + ")"
	}
	row("Expires", exp)
}

// forEach runs fn for each id, printing the id on success and the error on
// failure; it returns the last error (classified), so a partial failure
// still exits non-zero.
func forEach(ctx context.Context, ids []string, out, errOut io.Writer, fn func(ctx context.Context, id string) error) error {
	var last error
	failed := 0
	for _, id := range ids {
		if err := fn(ctx, id); err != nil {
			last = classify(err)
			failed++
			if len(ids) > 1 {
				fmt.Fprintf(errOut, "moat: %s: %v\n", id, last)
			}
			continue
		}
		fmt.Fprintln(out, id)
	}
	if failed > 0 && len(ids) > 1 {
		return fmt.Errorf("%d of %d failed: %w", failed, len(ids), last)
	}
	return last
}

func newSandboxRenewCommand(sf *serverFlags) *cobra.Command {
	var d time.Duration
	var at string
	cmd := &cobra.Command{
		Use:   "renew ID",
		Short: "Move the expiry of a sandbox",
		Example: `  moat sb renew ID --for 1h
  moat sb renew ID --at 2030-01-01T00:00:00Z`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			var when time.Time
			switch {
			case at != "" && cmd.Flags().Changed("for"):
				return errdefs.Invalid("CLI::INVALID_FLAG", "--for and --at are mutually exclusive")
			case at != "":
				t, err := time.Parse(time.RFC3339, at)
				if err != nil {
					return errdefs.Invalid("CLI::INVALID_FLAG", fmt.Sprintf("--at %q: want RFC 3339 (2030-01-01T00:00:00Z)", at))
				}
				when = t
			case d <= 0:
				return errdefs.Invalid("CLI::INVALID_FLAG", "--for must be positive")
			default:
				when = time.Now().Add(d)
			}
			c, err := sf.client()
			if err != nil {
				return err
			}
			exp, err := c.Renew(cmd.Context(), args[0], when)
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "%s expires %s\n", args[0], exp.UTC().Format(time.RFC3339))
			return nil
		},
	}
	cmd.Flags().DurationVar(&d, "for", 30*time.Minute, "new expiry, from now")
	cmd.Flags().StringVar(&at, "at", "", "new expiry as an RFC 3339 time")
	return cmd
}

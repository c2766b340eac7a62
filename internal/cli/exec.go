package cli

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/moat-sandbox/moat/client"
	"github.com/moat-sandbox/moat/internal/errdefs"
)

// agentFlags are the connection flags of verbs that talk to the agent
// inside a sandbox (exec, files, shell, command).
type agentFlags struct {
	serverFlags
	viaServer bool
}

func (f *agentFlags) register(cmd *cobra.Command) {
	f.serverFlags.register(cmd)
	cmd.PersistentFlags().BoolVar(&f.viaServer, "server-proxy", false,
		"reach the agent through the server's proxy route instead of the sandbox address (for remote servers)")
}

// sandbox resolves the agent endpoint of sandbox id.
func (f *agentFlags) sandbox(ctx context.Context, id string) (*client.SandboxHandle, error) {
	if f.server == "" {
		return nil, errdefs.Invalid("CLI::INVALID_FLAG", "--server is required")
	}
	opts := []client.Option{client.WithAPIKey(f.apiKey)}
	if f.viaServer {
		opts = append(opts, client.WithServerProxy())
	}
	c, err := client.New(f.server, opts...)
	if err != nil {
		return nil, err
	}
	return c.Sandbox(ctx, id)
}

// exitCodeNotRun is the CLI exit code when the agent could not run the
// command at all (as docker exec's 126).
const exitCodeNotRun = 126

func newExecCommand() *cobra.Command {
	af := &agentFlags{}
	var cwd string
	var env []string
	var timeout time.Duration
	var background bool
	cmd := &cobra.Command{
		Use:   "exec ID [flags] -- COMMAND [ARG...]",
		Short: "Run a command in a sandbox",
		Long: `Run a command in a sandbox with the agent's shell (bash -c, else sh -c) and
stream its stdout and stderr to this process's stdout and stderr as it runs.
The exit code of moat is the command's exit code (126 if it could not run).

A single COMMAND word is passed to the shell as is, so it may be a script
('echo a; exit 3'); several words are quoted for the shell first.
Ctrl-C interrupts the remote command (SIGTERM, then SIGKILL to its process
group); a second Ctrl-C stops waiting.

With --background the command keeps running after moat returns; moat prints
its command ID for "moat command status|logs|kill ID CMDID".`,
		Example: `  moat exec $ID -- uname -a
  moat exec $ID --cwd /work -e DEBUG=1 -- 'make test 2>&1 | tail'
  CMD=$(moat exec $ID --background -- python3 -m http.server 8000)`,
		Args: cobra.MinimumNArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			if d := cmd.ArgsLenAtDash(); d > 1 {
				return errdefs.Invalid("CLI::INVALID_ARGS", "usage: moat exec ID [flags] -- COMMAND [ARG...]")
			}
			envs, err := parseKV("env", env)
			if err != nil {
				return err
			}
			if timeout < 0 {
				return errdefs.Invalid("CLI::INVALID_FLAG", "--timeout must not be negative")
			}
			h, err := af.sandbox(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			opts := client.RunOptions{Cwd: cwd, Env: envs, Timeout: timeout, Background: background}
			return runExec(cmd.Context(), h, shellQuote(args[1:]), opts, cmd.OutOrStdout(), cmd.ErrOrStderr())
		},
	}
	af.register(cmd)
	fl := cmd.Flags()
	fl.StringVarP(&cwd, "cwd", "w", "", "working directory in the sandbox")
	fl.StringArrayVarP(&env, "env", "e", nil, "environment variable KEY=VALUE (repeatable)")
	fl.DurationVar(&timeout, "timeout", 0, "kill the command after this long (default: no limit)")
	fl.BoolVarP(&background, "background", "d", false, "start the command and print its ID without waiting")
	return classifyTree(cmd)
}

// runExec runs command, streaming its output to stdout and stderr, and
// turns a non-zero exit into an ExitError. SIGINT/SIGTERM interrupt the
// remote command once; a second signal abandons the stream.
func runExec(parent context.Context, h *client.SandboxHandle, command string, opts client.RunOptions, stdout, stderr io.Writer) error {
	// The root context is cancelled on the first SIGINT; the stream must
	// outlive it so the interrupted command's exit status still arrives.
	ctx, cancel := context.WithCancel(context.WithoutCancel(parent))
	defer cancel()
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	defer signal.Stop(sigs)

	var mu sync.Mutex
	cmdID := ""
	interrupted := false
	go func() {
		for {
			select {
			case <-ctx.Done():
				return
			case <-sigs:
			}
			mu.Lock()
			id, again := cmdID, interrupted
			interrupted = true
			mu.Unlock()
			if again || id == "" {
				cancel()
				return
			}
			fmt.Fprintf(stderr, "moat: interrupting command %s (Ctrl-C again to stop waiting)\n", id)
			ictx, icancel := context.WithTimeout(ctx, 10*time.Second)
			if err := h.Interrupt(ictx, id); err != nil {
				fmt.Fprintf(stderr, "moat: interrupt: %v\n", classify(err))
			}
			icancel()
		}
	}()

	// Stream, not Run: the output goes straight to stdout/stderr and is
	// not kept, however long the command runs.
	x, err := h.Stream(ctx, command, opts, client.Handlers{
		OnInit: func(id string) {
			mu.Lock()
			cmdID = id
			mu.Unlock()
		},
		OnStdout: func(line string) { io.WriteString(stdout, line+"\n") },
		OnStderr: func(line string) { io.WriteString(stderr, line+"\n") },
	})
	if err != nil {
		if ctx.Err() != nil {
			return &ExitError{Code: 130}
		}
		return err
	}
	if opts.Background && x.Error == nil {
		fmt.Fprintln(stdout, x.ID)
		return nil
	}
	switch {
	case x.ExitCode == 0:
		return nil
	case x.ExitCode > 0:
		return &ExitError{Code: min(x.ExitCode, 255)}
	}
	if code, ok := signalExitCode(x.Error); ok {
		return &ExitError{Code: code}
	}
	if x.Error != nil {
		fmt.Fprintf(stderr, "moat: command failed: %s\n", x.Error.Error())
	}
	return &ExitError{Code: exitCodeNotRun}
}

// signalExitCode maps the error event of a command killed by a signal
// (traceback "signal: terminated") to 128+signal, as shells report it.
func signalExitCode(e *client.ExecutionError) (int, bool) {
	if e == nil {
		return 0, false
	}
	for _, line := range e.Traceback {
		name, ok := strings.CutPrefix(line, "signal: ")
		if !ok {
			continue
		}
		for n := 1; n < 65; n++ {
			if syscall.Signal(n).String() == name {
				return 128 + n, true
			}
		}
	}
	return 0, false
}

// newCommandCommand is the `moat command` noun: background commands
// started with `moat exec --background`.
func newCommandCommand() *cobra.Command {
	af := &agentFlags{}
	cmd := &cobra.Command{
		Use:     "command",
		Aliases: []string{"cmd"},
		Short:   "Inspect background commands (moat exec --background)",
	}
	af.register(cmd)

	var output outputFormat
	status := &cobra.Command{
		Use:   "status ID CMDID",
		Short: "Show the state of a command",
		Args:  cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			h, err := af.sandbox(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			st, err := h.CommandStatus(cmd.Context(), args[1])
			if err != nil {
				return err
			}
			return render(cmd.OutOrStdout(), output, st, func(tw *tabwriter.Writer) { commandDetail(tw, st) })
		},
	}
	addOutputFlag(status, &output)

	var follow bool
	logs := &cobra.Command{
		Use:   "logs ID CMDID",
		Short: "Print the merged output of a command",
		Args:  cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			h, err := af.sandbox(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			return commandLogs(cmd.Context(), h, args[1], follow, cmd.OutOrStdout())
		},
	}
	logs.Flags().BoolVarP(&follow, "follow", "f", false, "keep printing output until the command exits")

	kill := &cobra.Command{
		Use:     "kill ID CMDID...",
		Aliases: []string{"interrupt"},
		Short:   "Interrupt commands (SIGTERM, then SIGKILL, to the process group)",
		Args:    cobra.MinimumNArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			h, err := af.sandbox(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			return forEach(cmd.Context(), args[1:], cmd.OutOrStdout(), cmd.ErrOrStderr(), h.Interrupt)
		},
	}
	cmd.AddCommand(status, logs, kill)
	return classifyTree(cmd)
}

func commandDetail(tw *tabwriter.Writer, st *client.CommandStatus) {
	row := func(k, v string) { fmt.Fprintf(tw, "%s:\t%s\n", k, v) }
	row("ID", st.ID)
	row("Command", st.Content)
	state := "exited"
	if st.Running {
		state = "running"
	}
	row("State", state)
	if st.ExitCode != nil {
		row("Exit code", fmt.Sprint(*st.ExitCode))
	}
	if st.Error != "" {
		row("Error", st.Error)
	}
	row("Started", st.StartedAt.Local().Format(time.DateTime))
	if st.FinishedAt != nil {
		row("Finished", st.FinishedAt.Local().Format(time.DateTime))
	}
}

// commandLogs prints a command's output; with follow it polls until the
// command has exited and its output is drained.
func commandLogs(ctx context.Context, h *client.SandboxHandle, id string, follow bool, out io.Writer) error {
	var cursor int64
	for {
		text, next, err := h.CommandLogs(ctx, id, cursor)
		if err != nil {
			return err
		}
		io.WriteString(out, text)
		grew := next != cursor
		cursor = next
		if !follow {
			return nil
		}
		if !grew {
			st, err := h.CommandStatus(ctx, id)
			if err != nil {
				return err
			}
			if !st.Running {
				// One more read catches output written just before exit.
				text, _, err := h.CommandLogs(ctx, id, cursor)
				if err == nil {
					io.WriteString(out, text)
				}
				return err
			}
			select {
			case <-ctx.Done():
				return nil
			case <-time.After(250 * time.Millisecond):
			}
		}
	}
}

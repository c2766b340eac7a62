package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/term"

	"github.com/moat-sandbox/moat/client"
	"github.com/moat-sandbox/moat/internal/errdefs"
)

func newShellCommand() *cobra.Command {
	af := &agentFlags{}
	var cwd string
	var forceTTY, noTTY bool
	cmd := &cobra.Command{
		Use:   "shell ID [flags] [-- COMMAND...]",
		Short: "Open an interactive shell (or run COMMAND) on a terminal in a sandbox",
		Long: `Open an interactive shell in a sandbox over the agent's PTY WebSocket, or
run COMMAND on a terminal (e.g. "-- top"). moat exits with the shell's exit
code.

When stdin is a terminal it is put in raw mode and the remote terminal follows
the local window size. When stdin is not a terminal (a pipe or a file) the
shell runs without a terminal (pipe mode: no echo, stdout and stderr kept
apart), Ctrl-C is forwarded as SIGINT, and at the end of the input moat sends
"exit", so the shell ends with the status of the last command, as sh does at
end of input. --tty and --no-tty override the choice.`,
		Example: `  moat shell $ID
  moat shell $ID -- top
  printf 'cd /tmp\nls\nexit 3\n' | moat shell $ID`,
		Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if d := cmd.ArgsLenAtDash(); d > 1 {
				return errdefs.Invalid("CLI::INVALID_ARGS", "usage: moat shell ID [flags] [-- COMMAND...]")
			}
			if forceTTY && noTTY {
				return errdefs.Invalid("CLI::INVALID_FLAG", "--tty and --no-tty are mutually exclusive")
			}
			stdin := cmd.InOrStdin()
			tty := isTerminal(stdin)
			switch {
			case forceTTY:
				tty = true
			case noTTY:
				tty = false
			}
			command := ""
			if len(args) > 1 {
				command = shellQuote(args[1:])
			}
			h, err := af.sandbox(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			return runShell(cmd.Context(), h, shellOptions{cwd: cwd, command: command, tty: tty},
				stdin, cmd.OutOrStdout(), cmd.ErrOrStderr())
		},
	}
	af.register(cmd)
	fl := cmd.Flags()
	fl.StringVarP(&cwd, "cwd", "w", "", "working directory in the sandbox")
	fl.BoolVarP(&forceTTY, "tty", "t", false, "use a terminal even if stdin is not one")
	fl.BoolVarP(&noTTY, "no-tty", "T", false, "no terminal even if stdin is one")
	return classifyTree(cmd)
}

type shellOptions struct {
	cwd, command string
	tty          bool // PTY mode (else pipe mode)
}

// runShell creates a PTY session, attaches to it and relays stdin and
// output until the process exits, then deletes the session.
func runShell(parent context.Context, h *client.SandboxHandle, o shellOptions, stdin io.Reader, stdout, stderr io.Writer) error {
	// The root context is cancelled on SIGINT, which here is forwarded.
	ctx, cancel := context.WithCancel(context.WithoutCancel(parent))
	defer cancel()
	sid, err := h.CreatePTY(ctx, o.cwd, o.command)
	if err != nil {
		return err
	}
	defer func() {
		dctx, dcancel := context.WithTimeout(context.WithoutCancel(parent), 10*time.Second)
		defer dcancel()
		if err := h.DeletePTY(dctx, sid); err != nil && !client.IsNotFound(err) {
			fmt.Fprintf(stderr, "moat: delete pty session %s: %v\n", sid, classify(err))
		}
	}()
	conn, err := h.AttachPTY(ctx, sid, client.AttachOptions{Pipe: !o.tty})
	if err != nil {
		return err
	}
	defer conn.Close()

	raw := isTerminal(stdin) && o.tty
	if raw {
		restore, err := rawTerminal(ctx, conn, stdin, stdout)
		if err != nil {
			return err
		}
		defer restore()
	}
	stopped, stopSignals := relaySignals(ctx, cancel, conn, raw)
	defer stopSignals()

	go pumpStdin(ctx, conn, stdin, endOfInput(o))

	exitCode, err := relayOutput(ctx, conn, stdout, stderr, raw)
	if err != nil {
		select {
		case <-stopped:
			return &ExitError{Code: 128 + int(syscall.SIGTERM)}
		default:
		}
		return err
	}
	switch {
	case exitCode < 0:
		return fmt.Errorf("pty session %s: connection closed before the shell exited: %w", sid, errdefs.ErrUnavailable)
	case exitCode > 0:
		return &ExitError{Code: min(exitCode, 255)}
	}
	return nil
}

// rawTerminal puts the local terminal stdin in raw mode and makes the
// remote terminal follow its size; restore undoes both.
func rawTerminal(ctx context.Context, conn *client.PTYConn, stdin io.Reader, stdout io.Writer) (restore func(), err error) {
	fd := int(stdin.(*os.File).Fd())
	old, err := term.MakeRaw(fd)
	if err != nil {
		return nil, fmt.Errorf("raw terminal: %w", err)
	}
	var lastCols, lastRows int
	resize := func() { // sends the size when it changed
		if cols, rows, err := termSize(stdin, stdout); err == nil && (cols != lastCols || rows != lastRows) {
			lastCols, lastRows = cols, rows
			conn.Resize(ctx, cols, rows)
		}
	}
	resize()
	stopResize := watchResize(ctx, resize)
	return func() {
		stopResize()
		term.Restore(fd, old)
	}, nil
}

// relaySignals handles the signals for the session: SIGTERM (and SIGINT
// on a raw terminal, where Ctrl-C is a byte sent to the remote side) ends
// moat: the session is deleted, which kills its process. Without a raw
// terminal, Ctrl-C is forwarded as SIGINT. stopped is closed when a
// signal cancelled ctx.
func relaySignals(ctx context.Context, cancel context.CancelFunc, conn *client.PTYConn, raw bool) (stopped <-chan struct{}, stop func()) {
	quit := make(chan os.Signal, 1)
	signal.Notify(quit, syscall.SIGTERM)
	intr := make(chan os.Signal, 1)
	if raw {
		signal.Notify(quit, os.Interrupt)
	} else {
		signal.Notify(intr, os.Interrupt)
	}
	done := make(chan struct{})
	go func() {
		for {
			select {
			case <-ctx.Done():
				return
			case <-quit:
				close(done)
				cancel()
				return
			case <-intr:
				conn.Signal(ctx, "SIGINT")
			}
		}
	}()
	return done, func() {
		signal.Stop(intr)
		signal.Stop(quit)
	}
}

// relayOutput copies the session's output to stdout and stderr until
// the connection ends, and returns the exit code (-1 if none came).
func relayOutput(ctx context.Context, conn *client.PTYConn, stdout, stderr io.Writer, raw bool) (int, error) {
	exitCode := -1
	for {
		ev, err := conn.Next(ctx)
		if errors.Is(err, io.EOF) {
			return exitCode, nil
		}
		if err != nil {
			return exitCode, err
		}
		switch ev.Type {
		case client.PTYStdout, client.PTYReplay:
			stdout.Write(ev.Data)
		case client.PTYStderr:
			stderr.Write(ev.Data)
		case client.PTYExit:
			exitCode = ev.ExitCode
		case client.PTYError:
			if raw {
				fmt.Fprintf(stderr, "\r\nmoat: shell: %s: %s\r\n", ev.Code, ev.Message)
			} else {
				fmt.Fprintf(stderr, "moat: shell: %s: %s\n", ev.Code, ev.Message)
			}
		}
	}
}

// endOfInput is what is sent when stdin ends: a terminal's EOF (^D) in PTY
// mode, "exit" for an interactive shell in pipe mode (the protocol has no
// way to close the remote stdin), nothing for a command in pipe mode.
func endOfInput(o shellOptions) []byte {
	switch {
	case o.tty:
		return []byte{0x04}
	case o.command == "":
		return []byte("exit\n")
	}
	return nil
}

// pumpStdin forwards stdin to the session until it ends, then sends eof
// (preceded by a newline if the input did not end with one).
func pumpStdin(ctx context.Context, conn *client.PTYConn, stdin io.Reader, eof []byte) {
	buf := make([]byte, 32<<10)
	last := byte('\n')
	for {
		n, err := stdin.Read(buf)
		if n > 0 {
			last = buf[n-1]
			if conn.Write(ctx, buf[:n]) != nil {
				return
			}
		}
		if err != nil {
			break
		}
	}
	if len(eof) == 0 {
		return
	}
	if last != '\n' && last != 0x04 {
		eof = append([]byte{'\n'}, eof...)
	}
	conn.Write(ctx, eof)
}

// termSize is the size of whichever of the streams is a terminal.
func termSize(streams ...any) (cols, rows int, err error) {
	err = errors.New("not a terminal")
	for _, s := range streams {
		if f, ok := s.(*os.File); ok && term.IsTerminal(int(f.Fd())) {
			if cols, rows, err = term.GetSize(int(f.Fd())); err == nil {
				return cols, rows, nil
			}
		}
	}
	return 0, 0, err
}

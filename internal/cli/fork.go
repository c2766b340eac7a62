package cli

import (
	"context"
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"github.com/moat-sandbox/moat/client"
	"github.com/moat-sandbox/moat/internal/errdefs"
)

// newSandboxForkCommand is `moat sandbox fork ID --count N`: the server
// snapshots the running sandbox and makes N children from it.
func newSandboxForkCommand(sf *serverFlags) *cobra.Command {
	var (
		count         int
		env, metadata []string
		timeout       time.Duration
		wait          bool
		waitTimeout   time.Duration
		key           string
		output        outputFormat
	)
	cmd := &cobra.Command{
		Use:   "fork ID [--count N]",
		Short: "Fork a running sandbox into N children (its files; on runsc its memory too)",
		Example: "  moat sb fork 9f2c... --count 4 --env ROLE=worker --wait\n" +
			"  moat sb fork 9f2c... --count 100 --wait=false   # prints the operation id",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			invalid := func(msg string) error { return errdefs.Invalid("CLI::INVALID_FLAG", msg) }
			if count < 1 || count > 100 {
				return invalid("--count must be between 1 and 100")
			}
			if timeout < 0 || timeout > 0 && timeout < time.Minute {
				return invalid("--timeout must be at least 1m")
			}
			e, err := parseKV("env", env)
			if err != nil {
				return err
			}
			m, err := parseKV("metadata", metadata)
			if err != nil {
				return err
			}
			c, err := sf.client()
			if err != nil {
				return err
			}
			req := client.ForkRequest{Count: count, IdempotencyKey: key,
				ForkOverride: client.ForkOverride{Env: e, Metadata: m, Timeout: timeout}}
			op, err := c.Fork(cmd.Context(), args[0], req)
			if err != nil {
				return err
			}
			if wait {
				ctx := cmd.Context()
				if waitTimeout > 0 {
					var cancel func()
					ctx, cancel = context.WithTimeout(ctx, waitTimeout)
					defer cancel()
				}
				done, err := c.WaitOperation(ctx, op.ID, 0)
				if done != nil {
					op = done
				}
				if err != nil {
					return err
				}
			}
			if output != outputTable {
				return render(cmd.OutOrStdout(), output, op, nil)
			}
			if !wait {
				fmt.Fprintln(cmd.OutOrStdout(), op.ID)
				return nil
			}
			for _, ch := range op.Children {
				fmt.Fprintln(cmd.OutOrStdout(), ch.ID)
			}
			return nil
		},
	}
	fl := cmd.Flags()
	fl.IntVarP(&count, "count", "n", 1, "how many children (1-100)")
	fl.StringArrayVarP(&env, "env", "e", nil, "environment variable KEY=VALUE of every child, over the source's (repeatable)")
	fl.StringArrayVarP(&metadata, "metadata", "m", nil, "metadata label KEY=VALUE of every child, over the source's (repeatable)")
	fl.DurationVar(&timeout, "timeout", 0, "expire the children after this long (>= 1m; default: when the source expires)")
	fl.BoolVar(&wait, "wait", true, "wait until every child is Running and print their ids (else print the operation id)")
	fl.DurationVar(&waitTimeout, "wait-timeout", 10*time.Minute, "how long --wait waits")
	fl.StringVar(&key, "idempotency-key", "", "Idempotency-Key of the request (a retry with the same key returns the same operation)")
	addOutputFlag(cmd, &output)
	return cmd
}

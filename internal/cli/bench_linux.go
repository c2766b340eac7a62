package cli

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"

	"github.com/spf13/cobra"
)

// newBenchCommand is `moat bench ARGS`, kept so that existing command
// lines work: the benchmarks are their own binary, moat-bench (the lab
// stays out of the one file users install), and this verb replaces the
// process with `moat-bench ARGS`, the moat-bench next to this executable
// (make build puts both in bin/) or else on $PATH. MOAT_BIN is set to
// this executable, the moat the Kubernetes benchmarks run.
func newBenchCommand() *cobra.Command {
	return &cobra.Command{
		Use:                "bench",
		Short:              "Measure moat (prints figures; runs the separate moat-bench binary)",
		DisableFlagParsing: true,
		RunE: func(cmd *cobra.Command, args []string) error {
			exe, err := os.Executable()
			if err != nil {
				return err
			}
			bin := filepath.Join(filepath.Dir(exe), "moat-bench")
			if _, err := os.Stat(bin); err != nil {
				if bin, err = exec.LookPath("moat-bench"); err != nil {
					return fmt.Errorf("moat bench runs moat-bench, found neither next to %s nor on $PATH (make build builds bin/moat-bench)", exe)
				}
			}
			env := os.Environ()
			if os.Getenv("MOAT_BIN") == "" {
				env = append(env, "MOAT_BIN="+exe)
			}
			return syscall.Exec(bin, append([]string{bin}, args...), env)
		},
	}
}

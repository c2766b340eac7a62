package cli

import (
	"github.com/spf13/cobra"
)

// platformCommands are the verbs that run the server side, which is
// Linux only: the server, its host check, the agent, the local image
// store and the benchmarks.
func platformCommands() []*cobra.Command {
	return []*cobra.Command{newServeCommand(), newDoctorCommand(), newExecdCommand(), newImageCommand(), newBenchCommand()}
}

// FastPath runs the verbs that bypass cobra (the agent alias `moat
// execd`, PID 1 of a sandbox, which must start fast and handles signals
// itself). ok is false for every other command line.
func FastPath(args []string) (code int, ok bool) {
	if len(args) > 0 && args[0] == "execd" {
		return RunExecd(args[1:]), true
	}
	return 0, false
}

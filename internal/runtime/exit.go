package runtime

import "fmt"

// Exit reasons (Exit.Reason).
const (
	// ExitReasonExited: the agent process ended on its own (it returned,
	// crashed, or a signal not attributed to anything else killed it).
	ExitReasonExited = "Exited"
	// ExitReasonOOMKilled: the kernel's OOM killer ended the sandbox (its
	// memory limit was reached). For runsc the whole sandbox (the gVisor
	// Sentry) is one host process in the sandbox's cgroup, so an OOM kill
	// there takes every process of the sandbox at once.
	ExitReasonOOMKilled = "OOMKilled"
)

// Exit is how a sandbox's agent process (PID 1) ended, as its backend saw
// it.
type Exit struct {
	// ID is the sandbox ID.
	ID string
	// Reason is ExitReasonExited or ExitReasonOOMKilled.
	Reason string
	// ExitCode is the exit status, 128+n for a process killed by signal
	// n, -1 if the backend could not learn it.
	ExitCode int
	// Message is a human-readable detail from the backend ("" if none).
	Message string
}

// String describes e in one line, for logs and status messages.
func (e Exit) String() string {
	s := "exited"
	if e.Reason == ExitReasonOOMKilled {
		s = "was killed by the OOM killer (out of memory)"
	}
	if e.ExitCode >= 0 {
		s += fmt.Sprintf(", exit code %d", e.ExitCode)
	}
	if e.Message != "" {
		s += ": " + e.Message
	}
	return s
}

// ExitNotifier is implemented by backends that notice at once when the
// agent process of a sandbox ends: an OOM kill, a crash, the process
// returning. The lifecycle service subscribes so that a dead sandbox is
// reported the moment it dies rather than on its next liveness pass.
type ExitNotifier interface {
	// NotifyExits registers f. The backend calls f once for every sandbox
	// whose agent process ends while this backend instance runs, ended by
	// Stop and Delete included (the caller knows which ones it ended), on
	// a goroutine of its own; f must not block for long. Status reports
	// the sandbox stopped, with the same exit code, by the time f runs.
	NotifyExits(f func(Exit))
}

package fake

import (
	"github.com/moat-sandbox/moat/internal/runtime"
)

// NotifyExits implements runtime.ExitNotifier: f learns of every agent
// that Stop, Delete or Exit ends, on a goroutine of its own.
func (r *Runtime) NotifyExits(f func(runtime.Exit)) {
	r.exitMu.Lock()
	defer r.exitMu.Unlock()
	r.exitFns = append(r.exitFns, f)
}

// Exit ends sandbox id's agent as if it had died on its own (an OOM
// kill, a crash): the sandbox is stopped with ex's exit code and message
// (OOMKilled in the message, as the real backends report it), and the
// exit is notified. ex.ID is set to id.
func (r *Runtime) Exit(id string, ex runtime.Exit) error {
	r.st.mu.Lock()
	sb, err := r.get(id)
	if err != nil {
		r.st.mu.Unlock()
		return err
	}
	if sb.srv != nil {
		sb.srv.Close()
		sb.srv = nil
	}
	sb.paused = false
	sb.status.State, sb.status.Pid, sb.status.ExitCode, sb.status.ExitReason = runtime.StateStopped, 0, ex.ExitCode, ex.Reason
	if ex.Reason == runtime.ExitReasonOOMKilled {
		sb.status.Message = "OOM killed: the sandbox ran out of memory"
	}
	r.st.mu.Unlock()
	ex.ID = id
	r.notifyExit(ex)
	return nil
}

// notifyExit tells the NotifyExits subscribers, each on a goroutine.
func (r *Runtime) notifyExit(ex runtime.Exit) {
	r.exitMu.Lock()
	fns := r.exitFns
	r.exitMu.Unlock()
	for _, f := range fns {
		go f(ex)
	}
}

// Package proc is the agent's process runner: it starts every child
// process, collects exit statuses (as PID 1 it reaps every orphan too), and
// holds what all services share about children: the shell, the base
// environment (extended by POST /moat/v1/env), path expansion, the private
// state directory, the shutdown that kills every process group, and the
// Registry each service keeps its live commands, sessions or contexts in.
package proc

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"

	"github.com/moat-sandbox/moat/internal/errdefs"
)

// Reaper starts the agent's children and collects their exit statuses;
// nothing uses exec.Cmd.Wait, whose wait would race a wait4(-1) reaper. As
// PID 1 one goroutine (Run) sweeps wait4(-1) on SIGCHLD and dispatches by
// pid, dropping orphans; Start registers under startMu (read) and a sweep
// holds it (write), so a child is never reaped before it is registered.
// Otherwise each Proc is waited for with wait4(pid).
type Reaper struct {
	reapAll bool
	log     *slog.Logger

	startMu sync.RWMutex // read: Start in progress; write: a wait4(-1) sweep

	mu      sync.Mutex
	waiters map[int]*Proc // guarded by mu; reap-all mode only
}

// NewReaper returns a Reaper. reapAll selects the PID 1 mode, in which Run
// must be running for any Proc to complete.
func NewReaper(reapAll bool, log *slog.Logger) *Reaper {
	if log == nil {
		log = slog.Default()
	}
	return &Reaper{reapAll: reapAll, log: log, waiters: make(map[int]*Proc)}
}

// Spec describes a process to start. Path must be absolute (or relative
// to Dir); Files are the child's fds 0, 1, 2, ... (nil entries are closed).
type Spec struct {
	Path  string
	Args  []string
	Env   []string
	Dir   string
	Files []*os.File
	Sys   *syscall.SysProcAttr
}

// Proc is a started child process.
type Proc struct {
	// Pid is the process id (and, with Setpgid, its process group id).
	Pid int

	done   chan struct{}
	status syscall.WaitStatus // valid once done is closed
}

// Done is closed when the process has exited and been reaped.
func (p *Proc) Done() <-chan struct{} { return p.done }

// Exited reports whether the process has been reaped.
func (p *Proc) Exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// Status returns the wait status; it is only meaningful after Done.
func (p *Proc) Status() syscall.WaitStatus { <-p.done; return p.status }

// Wait blocks until the process exits or ctx is done.
func (p *Proc) Wait(ctx context.Context) (syscall.WaitStatus, error) {
	select {
	case <-p.done:
		return p.status, nil
	case <-ctx.Done():
		return 0, ctx.Err()
	}
}

// Signal sends sig to the process group led by the process (the agent
// starts every child with Setpgid), falling back to the process itself
// while it is not yet reaped. The group is signalled even after the leader
// exited, so leftover background jobs (`server &`) are reached; Linux does
// not hand out a pid while it is still in use as a process group id, so
// this cannot hit an unrelated process while the group has members.
func (p *Proc) Signal(sig syscall.Signal) {
	if err := syscall.Kill(-p.Pid, sig); err != nil && !p.Exited() {
		syscall.Kill(p.Pid, sig)
	}
}

// Stop sends SIGTERM to p's group, then SIGKILL after grace, and waits
// (bounded by ctx) for the process to be reaped.
func (p *Proc) Stop(ctx context.Context, grace time.Duration) {
	p.Signal(syscall.SIGTERM)
	if p.Exited() {
		return
	}
	t := time.NewTimer(grace)
	defer t.Stop()
	select {
	case <-p.Done():
		return
	case <-t.C:
	case <-ctx.Done():
	}
	p.Signal(syscall.SIGKILL)
	select {
	case <-p.Done():
	case <-ctx.Done():
	}
}

// Start starts a process described by spec.
func (r *Reaper) Start(spec Spec) (*Proc, error) {
	attr := &os.ProcAttr{Dir: spec.Dir, Env: spec.Env, Files: spec.Files, Sys: spec.Sys}
	r.startMu.RLock()
	op, err := os.StartProcess(spec.Path, spec.Args, attr)
	if err != nil {
		r.startMu.RUnlock()
		return nil, fmt.Errorf("start %s: %w", spec.Path, errors.Join(errdefs.ErrFailedPrecondition, err))
	}
	p := &Proc{Pid: op.Pid, done: make(chan struct{})}
	// The exit status is collected with wait4 below, never via op.
	op.Release()
	if r.reapAll {
		r.mu.Lock()
		r.waiters[p.Pid] = p
		r.mu.Unlock()
		r.startMu.RUnlock()
		return p, nil
	}
	r.startMu.RUnlock()
	go func() {
		var ws syscall.WaitStatus
		for {
			_, err := syscall.Wait4(p.Pid, &ws, 0, nil)
			if err == syscall.EINTR {
				continue
			}
			if err != nil {
				r.log.Warn("wait4 failed", "pid", p.Pid, "err", err)
				ws = syscall.WaitStatus(0xff00) // exit status 255
			}
			break
		}
		p.status = ws
		close(p.done)
	}()
	return p, nil
}

// Run is the reap-all loop; it returns when ctx is done. In the per-process
// mode it returns immediately.
func (r *Reaper) Run(ctx context.Context) {
	if !r.reapAll {
		return
	}
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGCHLD)
	defer signal.Stop(sig)
	r.sweep() // children that exited before Notify
	for {
		select {
		case <-ctx.Done():
			return
		case <-sig:
			r.sweep()
		}
	}
}

// sweep reaps every exited child.
func (r *Reaper) sweep() {
	r.startMu.Lock()
	defer r.startMu.Unlock()
	for {
		var ws syscall.WaitStatus
		pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil)
		if err == syscall.EINTR {
			continue
		}
		if err != nil || pid <= 0 {
			return // ECHILD: no children; 0: none exited
		}
		r.mu.Lock()
		p := r.waiters[pid]
		delete(r.waiters, pid)
		r.mu.Unlock()
		if p == nil {
			r.log.Debug("reaped orphan", "pid", pid, "status", DescribeStatus(ws))
			continue
		}
		p.status = ws
		close(p.done)
	}
}

// ExitCode maps a wait status to the exit code reported by the API: the
// exit status, or -1 if the process was killed by a signal (as Go's
// ProcessState.ExitCode does, which OpenSandbox reports).
func ExitCode(ws syscall.WaitStatus) int {
	if ws.Exited() {
		return ws.ExitStatus()
	}
	return -1
}

// DescribeStatus renders ws like exec.ExitError: "exit status N" or
// "signal: killed".
func DescribeStatus(ws syscall.WaitStatus) string {
	switch {
	case ws.Exited():
		return fmt.Sprintf("exit status %d", ws.ExitStatus())
	case ws.Signaled():
		return "signal: " + ws.Signal().String()
	default:
		return fmt.Sprintf("wait status %#x", uint32(ws))
	}
}

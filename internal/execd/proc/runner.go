package proc

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"syscall"

	"github.com/moat-sandbox/moat/internal/errdefs"
)

// Options configure a Runner.
type Options struct {
	// Reaper starts and reaps children (default: per-process waiting).
	Reaper *Reaper
	// Log receives process logs (default slog.Default()).
	Log *slog.Logger
	// BaseEnv is the environment children inherit (already without the
	// agent's EXECD_*/MOAT_* variables).
	BaseEnv []string
	// EnvFile is read at each Env call for extra KEY=VALUE lines.
	EnvFile string
	// StateDir is the parent of the runner's private directory (default
	// os.TempDir()).
	StateDir string
}

// Runner is what every service of the agent shares about child processes.
// Every service starts its children through Start, so Close can kill them
// all; background goroutines tied to a child (output copiers, waiters) run
// through Go, so Close can wait for them.
type Runner struct {
	reaper  *Reaper
	log     *slog.Logger
	dir     string // private state directory, removed by Close
	shell   string // absolute path of bash, or sh
	envFile string

	ctx    context.Context // cancelled by Close
	cancel context.CancelFunc
	wg     sync.WaitGroup

	envMu sync.RWMutex
	base  []string // guarded by envMu

	mu      sync.Mutex
	closed  bool    // guarded by mu
	procs   []*Proc // started and possibly still holding a process group (guarded by mu)
	pruneAt int     // prune procs when it grows to this length (guarded by mu)
}

// NewRunner creates the runner's private directory under opts.StateDir.
func NewRunner(opts Options) (*Runner, error) {
	if opts.Log == nil {
		opts.Log = slog.Default()
	}
	if opts.Reaper == nil {
		opts.Reaper = NewReaper(false, opts.Log)
	}
	if opts.StateDir == "" {
		opts.StateDir = os.TempDir()
	}
	if err := os.MkdirAll(opts.StateDir, 0o755); err != nil {
		return nil, fmt.Errorf("execd state dir: %w", classify(err))
	}
	dir, err := os.MkdirTemp(opts.StateDir, "moat-execd-")
	if err != nil {
		return nil, fmt.Errorf("execd state dir: %w", classify(err))
	}
	ctx, cancel := context.WithCancel(context.Background())
	return &Runner{
		reaper:  opts.Reaper,
		log:     opts.Log,
		dir:     dir,
		shell:   findShell(opts.BaseEnv),
		envFile: opts.EnvFile,
		ctx:     ctx,
		cancel:  cancel,
		base:    append([]string(nil), opts.BaseEnv...),
		pruneAt: 64,
	}, nil
}

// ErrClosed is returned by Start after Close.
var ErrClosed = errors.New("agent is shutting down")

// Start starts a child and registers it so that Close kills its process
// group. It fails with an ErrUnavailable class once Close has begun.
func (r *Runner) Start(spec Spec) (*Proc, error) {
	if r.Closed() {
		return nil, fmt.Errorf("%w: %w", errdefs.ErrUnavailable, ErrClosed)
	}
	// Starts run concurrently (the fork is the slow part); one that
	// overlaps Close is killed here instead of by Close.
	p, err := r.reaper.Start(spec)
	if err != nil {
		return nil, err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		p.Signal(syscall.SIGKILL)
		return nil, fmt.Errorf("%w: %w", errdefs.ErrUnavailable, ErrClosed)
	}
	r.procs = append(r.procs, p)
	if len(r.procs) >= r.pruneAt {
		r.pruneLocked()
	}
	return p, nil
}

// pruneLocked forgets children that are reaped and whose process group is
// empty (nothing left for Close to kill). It runs when the list has doubled
// since the last prune, so its cost is amortized over the starts.
// Preconditions: r.mu held.
func (r *Runner) pruneLocked() {
	kept := r.procs[:0]
	for _, p := range r.procs {
		if p.Exited() && syscall.Kill(-p.Pid, 0) == syscall.ESRCH {
			continue
		}
		kept = append(kept, p)
	}
	clear(r.procs[len(kept):])
	r.procs = kept
	r.pruneAt = max(64, 2*len(kept))
}

// Closed reports whether Close has begun.
func (r *Runner) Closed() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.closed
}

// Go runs f in a goroutine that Close waits for.
func (r *Runner) Go(f func()) {
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		f()
	}()
}

// Context is cancelled when Close begins: long-running handlers end on it.
func (r *Runner) Context() context.Context { return r.ctx }

// Dir is the runner's private directory for output files, scripts and
// connection files; Close removes it.
func (r *Runner) Dir() string { return r.dir }

// Shell is the absolute path of bash, or of sh when the image has no bash.
func (r *Runner) Shell() string { return r.shell }

// Log is the agent's logger.
func (r *Runner) Log() *slog.Logger { return r.log }

// BaseEnv returns (a copy of) the environment children inherit.
func (r *Runner) BaseEnv() []string {
	r.envMu.RLock()
	defer r.envMu.RUnlock()
	return append([]string(nil), r.base...)
}

// AddEnv layers KEY=VALUE pairs over the base environment of every later
// child.
func (r *Runner) AddEnv(kv []string) {
	r.envMu.Lock()
	defer r.envMu.Unlock()
	r.base = MergeEnv(r.base, kv)
}

// Env is the environment of a new child: the base environment, then the
// env file's lines (read now), then extra.
func (r *Runner) Env(extra map[string]string) []string {
	var add []string
	for k, v := range extra {
		add = append(add, k+"="+v)
	}
	return MergeEnv(r.BaseEnv(), envFileLines(r.envFile), add)
}

// Expand expands ~ and $VARs (from the base environment) in p and makes it
// absolute.
func (r *Runner) Expand(p string) string { return ExpandPath(p, r.BaseEnv()) }

// ShellSpec is the Spec of `bash -c script` (or sh) in its own process
// group, in cwd (expanded; it must be a directory) when cwd is set.
func (r *Runner) ShellSpec(script, cwd string, env []string, cred *syscall.Credential, files []*os.File) (Spec, error) {
	dir := ""
	if cwd != "" {
		dir = ExpandPath(cwd, env)
		st, err := os.Stat(dir)
		if err != nil {
			return Spec{}, fmt.Errorf("working directory %s: %w", dir, classify(err))
		}
		if !st.IsDir() {
			return Spec{}, fmt.Errorf("working directory %s: not a directory: %w", dir, errdefs.ErrInvalidArgument)
		}
	}
	return Spec{
		Path:  r.shell,
		Args:  []string{filepath.Base(r.shell), "-c", script},
		Env:   env,
		Dir:   dir,
		Files: files,
		Sys:   &syscall.SysProcAttr{Setpgid: true, Credential: cred},
	}, nil
}

// Close kills every process group the runner started (commands, sessions,
// PTYs, interpreters and kernels, and whatever they left running in their
// groups), waits for the goroutines started with Go, and removes the
// private directory. ctx bounds the wait.
func (r *Runner) Close(ctx context.Context) error {
	r.mu.Lock()
	r.closed = true
	procs := r.procs
	r.procs = nil
	r.mu.Unlock()
	r.cancel()
	for _, p := range procs {
		p.Signal(syscall.SIGKILL)
	}
	done := make(chan struct{})
	go func() { r.wg.Wait(); close(done) }()
	var err error
	select {
	case <-done:
	case <-ctx.Done():
		err = ctx.Err()
	}
	os.RemoveAll(r.dir)
	return err
}

// classify gives a file error its class.
func classify(err error) error {
	if os.IsNotExist(err) {
		return fmt.Errorf("%w: %v", errdefs.ErrNotFound, err)
	}
	return fmt.Errorf("%w: %v", errdefs.ErrInternal, err)
}

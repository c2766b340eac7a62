package execd

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/moat-sandbox/moat/internal/agentproto"
	"github.com/moat-sandbox/moat/internal/execd/proc"
	"github.com/moat-sandbox/moat/internal/web"
)

// forwarded are the signals the agent forwards to the entrypoint's process
// group. SIGTERM and SIGINT also start a graceful shutdown.
var forwarded = []os.Signal{syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP, syscall.SIGQUIT, syscall.SIGUSR1, syscall.SIGUSR2}

// Run runs the agent until ctx is done or a SIGTERM/SIGINT shuts it down:
// it serves the API on cfg.Listen, starts cfg.Entrypoint (if any) in its
// own process group, forwards signals to that group, and, when it is PID 1,
// reaps every orphan. If the entrypoint exits by itself the agent keeps
// serving; after a SIGTERM it exits once the entrypoint has exited. On
// shutdown the server is closed and every remaining process group killed.
func Run(ctx context.Context, cfg Config, log *slog.Logger) error {
	if err := cfg.Validate(); err != nil {
		return err
	}
	// Listen first: a client that connects while the rest starts up
	// waits for its answer instead of being refused and retrying later.
	ln, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return fmt.Errorf("execd listen %s: %w", cfg.Listen, err)
	}
	defer ln.Close()
	// The E2B faces' too: the server reports a sandbox ready once execd
	// answers, and E2B's SDKs call envd (and the code interpreter) at once.
	envdLn := listenFace("envd", cfg.EnvdListen, log)
	codeLn := listenFace("code interpreter", cfg.CodeListen, log)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	pid1 := os.Getpid() == 1
	reaper := proc.NewReaper(pid1, log)
	reaperDone := make(chan struct{})
	go func() { defer close(reaperDone); reaper.Run(ctx) }()
	defer func() { cancel(); <-reaperDone }()

	baseEnv := childEnv(log)
	sigs := make(chan os.Signal, 8)
	signal.Notify(sigs, forwarded...)
	defer signal.Stop(sigs)

	srv, err := NewServer(Options{
		Token: cfg.Token, BaseEnv: baseEnv, EnvFile: cfg.EnvFile, StateDir: cfg.StateDir,
		Grace: cfg.Grace, Reaper: reaper, Log: log, NoKernels: cfg.NoKernels,
		EnvdUser: cfg.EnvdUser, EnvdWorkdir: cfg.EnvdWorkdir,
	})
	if err != nil {
		for _, l := range []net.Listener{envdLn, codeLn} {
			if l != nil {
				l.Close()
			}
		}
		return err
	}
	hs := web.NewServer(cfg.Listen, srv, log)
	serveErr := make(chan error, 1)
	go func() { serveErr <- hs.Serve(ln) }()
	log.Info("execd listening", "addr", ln.Addr().String(), "pid1", pid1, "auth", cfg.Token != "")
	envdSrv := serveFace("envd", envdLn, srv.EnvdHandler(), log)
	codeSrv := serveFace("code interpreter", codeLn, srv.CodeInterpreterHandler(), log)

	entry := runEntrypoint(reaper, cfg.Entrypoint, baseEnv, log)
	waitForShutdown(ctx, serveErr, sigs, entry, log)

	shutdownCtx, stop := context.WithTimeout(context.Background(), 3*time.Second)
	defer stop()
	hs.Shutdown(shutdownCtx)
	hs.Close()
	for _, hs := range []*http.Server{envdSrv, codeSrv} {
		if hs != nil {
			hs.Close()
		}
	}
	if entry != nil {
		entry.Signal(syscall.SIGKILL)
	}
	srv.Close(shutdownCtx)
	return nil
}

// listenFace listens on the address of one of the agent's E2B faces
// (envd, the code interpreter; none when addr is empty). A failure is
// logged, not fatal: the execd API goes on without it.
func listenFace(name, addr string, log *slog.Logger) net.Listener {
	if addr == "" {
		return nil
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		log.Error(name+" listen failed; serving without it", "addr", addr, "err", err)
		return nil
	}
	return ln
}

// serveFace serves one of the agent's E2B faces on ln (none when ln is
// nil), over HTTP/1.1 and h2c as envd does.
func serveFace(name string, ln net.Listener, h http.Handler, log *slog.Logger) *http.Server {
	if ln == nil {
		return nil
	}
	hs := web.NewServer(ln.Addr().String(), h, log)
	// Streams live long: no idle cut while one is open, keepalives flow.
	hs.IdleTimeout = 10 * time.Minute
	hs.Protocols = new(http.Protocols)
	hs.Protocols.SetHTTP1(true)
	hs.Protocols.SetUnencryptedHTTP2(true)
	go func() {
		if err := hs.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error(name+" server failed", "err", err)
		}
	}()
	log.Info(name+" listening", "addr", ln.Addr().String())
	return hs
}

// childEnv is the environment children inherit. The token must not leak
// into children, and a Credential Vault sandbox trusts its CA before any
// child starts.
func childEnv(log *slog.Logger) []string {
	os.Unsetenv("EXECD_ACCESS_TOKEN")
	baseEnv := proc.ChildEnv(os.Environ())
	return installTrust("/", os.Getenv(agentproto.TrustCAEnv), baseEnv, log)
}

// runEntrypoint starts argv (if any); nil when there is none or it failed
// to start, which the agent logs and survives.
func runEntrypoint(r *proc.Reaper, argv, env []string, log *slog.Logger) *proc.Proc {
	if len(argv) == 0 {
		return nil
	}
	entry, err := startEntrypoint(r, argv, env)
	if err != nil {
		log.Error("entrypoint failed to start", "argv", argv, "err", err)
		return nil
	}
	log.Info("entrypoint started", "argv", argv, "pid", entry.Pid)
	return entry
}

// waitForShutdown forwards signals to the entrypoint until ctx is done, the
// server fails, or a SIGTERM/SIGINT arrives with no entrypoint running (or
// the entrypoint exits after one).
func waitForShutdown(ctx context.Context, serveErr <-chan error, sigs <-chan os.Signal, entry *proc.Proc, log *slog.Logger) {
	var entryDone <-chan struct{}
	if entry != nil {
		entryDone = entry.Done()
	}
	terminating := false
	for {
		select {
		case <-ctx.Done():
			return
		case err := <-serveErr:
			if !errors.Is(err, http.ErrServerClosed) {
				log.Error("execd server failed", "err", err)
			}
			return
		case sig := <-sigs:
			s := sig.(syscall.Signal)
			if entry != nil && !entry.Exited() {
				entry.Signal(s)
			}
			if s == syscall.SIGTERM || s == syscall.SIGINT {
				terminating = true
				if entry == nil || entry.Exited() {
					return
				}
				log.Info("signal received; waiting for entrypoint", "signal", s.String())
			}
		case <-entryDone:
			entryDone = nil
			log.Info("entrypoint exited", "pid", entry.Pid, "status", proc.DescribeStatus(entry.Status()))
			if terminating {
				return
			}
		}
	}
}

// startEntrypoint starts argv with the agent's stdio in a new process group.
func startEntrypoint(r *proc.Reaper, argv []string, env []string) (*proc.Proc, error) {
	path := argv[0]
	if lp, err := proc.LookPath(path, env); err == nil {
		path = lp
	}
	return r.Start(proc.Spec{
		Path:  path,
		Args:  argv,
		Env:   env,
		Files: []*os.File{os.Stdin, os.Stdout, os.Stderr},
		Sys:   &syscall.SysProcAttr{Setpgid: true},
	})
}

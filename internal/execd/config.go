package execd

import (
	"cmp"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/moat-sandbox/moat/internal/agentproto"
	"github.com/moat-sandbox/moat/internal/errdefs"
)

// DefaultPort is the port the agent listens on inside every sandbox.
const DefaultPort = agentproto.Port

// Config is the agent's configuration, loaded once by ParseArgs: defaults,
// then the --config file, then environment, then flags. To add a field, add
// it here with its unit and default, fill it in ParseArgs, and check it in
// Validate. The access token never comes from argv.
type Config struct {
	// Listen is the TCP address to serve on (default 0.0.0.0:44772).
	Listen string
	// Token is the X-EXECD-ACCESS-TOKEN value; empty disables auth. From
	// the config file's "token" or EXECD_ACCESS_TOKEN.
	Token string
	// Entrypoint is the user command started as a child (argv after "--").
	Entrypoint []string
	// Grace is slept after a foreground command's stream is complete
	// before the response ends (EXECD_API_GRACE_SHUTDOWN, Go duration or
	// milliseconds; default 0, upstream's default is 1s).
	Grace time.Duration
	// EnvFile names a file of KEY=VALUE lines added to every command's
	// environment (EXECD_ENVS; read at each command start).
	EnvFile string
	// StateDir holds per-command output files (default $TMPDIR).
	StateDir string
	// LogLevel is the slog level (--log-level: debug, info, warn, error).
	LogLevel string
	// NoKernels makes code contexts use the built-in REPL drivers even
	// when the image has Jupyter kernels (EXECD_JUPYTER_KERNELS=off).
	NoKernels bool
	// EnvdListen is the address of the E2B envd face (--envd-listen;
	// default Listen's host on port 49983; "" = off).
	EnvdListen string
	// EnvdUser is envd's default user, for requests that name none
	// (--envd-user, default root).
	EnvdUser string
	// EnvdWorkdir is envd's default working directory (--envd-workdir,
	// default the user's home).
	EnvdWorkdir string
	// CodeListen is the address of the E2B code interpreter
	// (--code-interpreter-listen; default Listen's host on port 49999;
	// "" = off).
	CodeListen string
}

// ParseArgs builds a Config from the arguments after "execd" and the
// environment (getenv, usually os.Getenv).
func ParseArgs(args []string, getenv func(string) string) (Config, error) {
	cfg := Config{StateDir: os.TempDir(), LogLevel: "info"}
	fs := flag.NewFlagSet("execd", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	configPath := fs.String("config", "", "JSON config file {token, port}")
	port := fs.Int("port", 0, "TCP port (default 44772)")
	listen := fs.String("listen", "", "listen address host:port (default 0.0.0.0:44772)")
	stateDir := fs.String("state-dir", "", "directory for command output files (default $TMPDIR)")
	logLevel := fs.String("log-level", "", "log level: debug, info, warn, error")
	envdListen := fs.String("envd-listen", "", "E2B envd listen address host:port, or off (default: the listen host, port 49983)")
	codeListen := fs.String("code-interpreter-listen", "", "E2B code interpreter listen address host:port, or off (default: the listen host, port 49999)")
	// A template's user and workdir reach the agent as env (agentproto);
	// the flags, when given, win.
	envdUser := fs.String("envd-user", cmp.Or(getenv(agentproto.EnvdUserEnv), "root"), "E2B envd default user (default $"+agentproto.EnvdUserEnv+", else root)")
	envdWorkdir := fs.String("envd-workdir", getenv(agentproto.EnvdWorkdirEnv), "E2B envd default working directory (default $"+agentproto.EnvdWorkdirEnv+", else the user's home)")
	if err := fs.Parse(args); err != nil {
		return Config{}, errdefs.Invalid("INVALID_ARGUMENT", err.Error())
	}
	if rest := fs.Args(); len(rest) > 0 {
		cfg.Entrypoint = rest
	}

	p := DefaultPort
	if *configPath != "" {
		data, err := os.ReadFile(*configPath)
		if err != nil {
			return Config{}, fmt.Errorf("read config: %w", classifyOSError(err))
		}
		var fc agentproto.Config
		if err := json.Unmarshal(data, &fc); err != nil {
			return Config{}, errdefs.Invalid("INVALID_ARGUMENT", fmt.Sprintf("config %s: %v", *configPath, err))
		}
		cfg.Token = fc.Token
		if fc.Port != 0 {
			p = fc.Port
		}
	}
	if v := getenv("EXECD_ACCESS_TOKEN"); v != "" {
		cfg.Token = v
	}
	if v := getenv("EXECD_ENVS"); v != "" {
		cfg.EnvFile = v
	}
	if v := getenv("EXECD_API_GRACE_SHUTDOWN"); v != "" {
		d, err := parseDuration(v)
		if err != nil {
			return Config{}, errdefs.Invalid("INVALID_ARGUMENT", "EXECD_API_GRACE_SHUTDOWN: "+err.Error())
		}
		cfg.Grace = d
	}
	switch v := strings.ToLower(getenv("EXECD_JUPYTER_KERNELS")); v {
	case "", "auto", "on", "1", "true":
	case "off", "0", "false", "no":
		cfg.NoKernels = true
	default:
		return Config{}, errdefs.Invalid("INVALID_ARGUMENT", "EXECD_JUPYTER_KERNELS must be auto or off, not "+strconv.Quote(v))
	}
	if *port != 0 {
		p = *port
	}
	cfg.Listen = net.JoinHostPort("0.0.0.0", strconv.Itoa(p))
	if *listen != "" {
		cfg.Listen = *listen
	}
	if *stateDir != "" {
		cfg.StateDir = *stateDir
	}
	switch *envdListen {
	case "off":
	case "":
		host, _, _ := net.SplitHostPort(cfg.Listen)
		cfg.EnvdListen = net.JoinHostPort(host, strconv.Itoa(agentproto.EnvdPort))
	default:
		cfg.EnvdListen = *envdListen
	}
	switch *codeListen {
	case "off":
	case "":
		host, _, _ := net.SplitHostPort(cfg.Listen)
		cfg.CodeListen = net.JoinHostPort(host, strconv.Itoa(agentproto.CodeInterpreterPort))
	default:
		cfg.CodeListen = *codeListen
	}
	cfg.EnvdUser, cfg.EnvdWorkdir = *envdUser, *envdWorkdir
	if *logLevel != "" {
		cfg.LogLevel = *logLevel
	}
	return cfg, cfg.Validate()
}

// Validate checks cfg.
func (c Config) Validate() error {
	if _, _, err := net.SplitHostPort(c.Listen); err != nil {
		return errdefs.Invalid("INVALID_ARGUMENT", "listen address: "+err.Error())
	}
	if c.EnvdListen != "" {
		if _, _, err := net.SplitHostPort(c.EnvdListen); err != nil {
			return errdefs.Invalid("INVALID_ARGUMENT", "envd listen address: "+err.Error())
		}
		if c.EnvdListen == c.Listen {
			return errdefs.Invalid("INVALID_ARGUMENT", "envd listen address must differ from the execd one")
		}
	}
	if c.CodeListen != "" {
		if _, _, err := net.SplitHostPort(c.CodeListen); err != nil {
			return errdefs.Invalid("INVALID_ARGUMENT", "code interpreter listen address: "+err.Error())
		}
		if c.CodeListen == c.Listen || c.CodeListen == c.EnvdListen {
			return errdefs.Invalid("INVALID_ARGUMENT", "code interpreter listen address must differ from the execd and envd ones")
		}
	}
	if c.EnvdWorkdir != "" && !filepath.IsAbs(c.EnvdWorkdir) {
		return errdefs.Invalid("INVALID_ARGUMENT", "envd workdir must be an absolute path")
	}
	if c.Grace < 0 {
		return errdefs.Invalid("INVALID_ARGUMENT", "grace must not be negative")
	}
	switch strings.ToLower(c.LogLevel) {
	case "debug", "info", "warn", "error":
	default:
		return errdefs.Invalid("INVALID_ARGUMENT", "log level must be debug, info, warn or error")
	}
	return nil
}

// parseDuration accepts a Go duration ("1s") or plain milliseconds ("500").
func parseDuration(s string) (time.Duration, error) {
	if n, err := strconv.ParseInt(s, 10, 64); err == nil {
		return time.Duration(n) * time.Millisecond, nil
	}
	return time.ParseDuration(s)
}

// classifyOSError classifies a file error.
func classifyOSError(err error) error {
	if os.IsNotExist(err) {
		return fmt.Errorf("%w: %v", errdefs.ErrNotFound, err)
	}
	return fmt.Errorf("%w: %v", errdefs.ErrInternal, err)
}

// Package oci is the native sandbox backend: it runs each sandbox as an OCI
// container through runc, crun or runsc (no container daemon), with an
// overlayfs root over the image layers, its own network namespace on the
// moat bridge (package network), and the moat agent bind-mounted as PID 1.
//
// On-disk layout (Config.Root, default /var/lib/moat/oci):
//
//	sandboxes/<id>/state.json   persistent record (spec without token, class, IP, ...)
//	sandboxes/<id>/upper,work   overlay writable layer (no disk quota)
//	sandboxes/<id>/disk.img     quota filesystem (ext4 file), mounted at disk/
//	sandboxes/<id>/disk/upper,work  overlay writable layer (disk quota)
//	sandboxes/<id>/rootfs       overlay mount point (the container root)
//	sandboxes/<id>/bundle       OCI bundle (config.json)
//	sandboxes/<id>/files        agent.json, hosts, hostname, resolv.conf
//	sandboxes/<id>/agent.log    stdout/stderr of the agent
//	sandboxes/<id>/exit         exit code, once reaped
//
// state.json is written twice: first with Complete=false right after the
// directory is created (so that a crash leaves a record naming the class),
// and again with Complete=true once the container runs. New removes every
// sandbox whose record is not complete. The OCI runtime's own state lives
// under Config.RunRoot/<class>; RunRoot/bin/<class> is a read-only bind
// mount of each runtime binary (see bindReadOnly) and RunRoot/netns holds
// the network namespace files.
package oci

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	gorunc "github.com/containerd/go-runc"
	"golang.org/x/sys/unix"

	"github.com/moat-sandbox/moat/internal/errdefs"
	"github.com/moat-sandbox/moat/internal/image"
	"github.com/moat-sandbox/moat/internal/network"
	"github.com/moat-sandbox/moat/internal/runtime"
)

// Defaults for Config.
const (
	DefaultRoot    = "/var/lib/moat/oci"
	DefaultRunRoot = "/run/moat"
	DefaultClass   = "runc"
	// DefaultPidsLimit applies when neither the spec nor Config sets one.
	DefaultPidsLimit = 4096
)

// knownClasses are the OCI runtimes looked up on PATH when Config.Classes
// is nil.
var knownClasses = []string{"runc", "crun", "runsc"}

// Config configures the backend. The zero value selects every default.
// To add a field: document its unit and default here and apply the default
// in setDefaults.
type Config struct {
	// Root is the state directory (default /var/lib/moat/oci).
	Root string `json:"root,omitempty"`
	// RunRoot holds volatile state: the OCI runtimes' state dirs
	// (RunRoot/<class>) and, by default, the netns files (default /run/moat).
	RunRoot string `json:"runRoot,omitempty"`
	// DefaultClass is used when Spec.Class is empty (default "runc").
	DefaultClass string `json:"defaultClass,omitempty"`
	// Classes maps a class name to a runtime binary (name or path). Nil
	// means runc, crun and runsc looked up on PATH. Only binaries that are
	// found are offered.
	Classes map[string]string `json:"classes,omitempty"`
	// AgentPath is the host path of the moat binary bind-mounted into each
	// sandbox (default os.Executable()).
	AgentPath string `json:"agentPath,omitempty"`
	// Resources are the defaults for zero Spec.Resources fields. PidsLimit
	// defaults to 4096; CPU, memory and disk default to unlimited. A
	// DiskBytes quota puts the writable layer on a loop-mounted ext4 file
	// of that size (see disk.go; needs mkfs.ext4 and /dev/loop-control).
	Resources runtime.Resources `json:"resources"`
	// Network configures the bridge when Deps.Network is nil. Its StateDir
	// defaults to Root/network and NetnsDir to RunRoot/netns.
	Network network.Config `json:"network"`
	// DNSServers are written to each sandbox's /etc/resolv.conf. Empty
	// means the host's resolv.conf without loopback servers.
	DNSServers []string `json:"dnsServers,omitempty"`
	// Subreaper makes the process a child subreaper so that it reaps the
	// sandbox init processes (recording their exit codes) when they exit.
	// Enable it when PID 1 of the host does not reap orphans.
	Subreaper bool `json:"subreaper,omitempty"`
}

func (c *Config) setDefaults() error {
	if c.Root == "" {
		c.Root = DefaultRoot
	}
	if c.RunRoot == "" {
		c.RunRoot = DefaultRunRoot
	}
	if c.DefaultClass == "" {
		c.DefaultClass = DefaultClass
	}
	if c.AgentPath == "" {
		p, err := os.Executable()
		if err != nil {
			return fmt.Errorf("oci: agent path: %w", err)
		}
		c.AgentPath = p
	}
	if err := runtime.CheckAgentBinary(c.AgentPath); err != nil {
		return err
	}
	if c.Resources.PidsLimit == 0 {
		c.Resources.PidsLimit = DefaultPidsLimit
	}
	if c.Network.StateDir == "" {
		c.Network.StateDir = filepath.Join(c.Root, "network")
	}
	if c.Network.NetnsDir == "" {
		c.Network.NetnsDir = filepath.Join(c.RunRoot, "netns")
	}
	var err error
	if c.Root, err = filepath.Abs(c.Root); err != nil {
		return err
	}
	if c.RunRoot, err = filepath.Abs(c.RunRoot); err != nil {
		return err
	}
	return nil
}

// Rootfs is an image prepared for mounting.
type Rootfs struct {
	// Layers are extracted layer directories, bottom first, used as
	// overlayfs lower dirs. They must not be modified while in use.
	Layers []string
	// Config is the image's runtime configuration.
	Config image.Config
}

// Images resolves image references to layer directories. Implementations
// must be safe for concurrent use; Rootfs returns ErrNotFound for an
// unknown reference. The layers stay valid until the image is removed,
// which the caller (the image store) must refuse while sandboxes use it.
type Images interface {
	Rootfs(ctx context.Context, ref string) (Rootfs, error)
}

// Network gives sandboxes their network; *network.Manager implements it.
type Network interface {
	Setup(ctx context.Context, id string) (network.Attachment, error)
	Teardown(ctx context.Context, id string) error
	List(ctx context.Context) ([]network.Attachment, error)
}

// Deps are the collaborators of the backend.
type Deps struct {
	// Images is required.
	Images Images
	// Network is optional; nil opens a network.Manager with Config.Network.
	Network Network
	// Logger is optional.
	Logger *slog.Logger
}

// Runtime is the OCI backend. It implements runtime.Runtime and
// runtime.Pauser.
type Runtime struct {
	cfg     Config
	images  Images
	net     Network
	log     *slog.Logger
	classes map[string]string // available class -> binary path
	kinds   map[string]string // available class -> "runc", "crun" or "runsc" (binary base name)
	// checkpointable are the runsc classes whose release can checkpoint
	// (see checkpoint.go).
	checkpointable map[string]bool

	reapMu   sync.Mutex
	reapPids map[int]string // container init pid -> sandbox id
	// runsc leaves helper processes that, as a subreaper, we adopt when
	// they outlive their parents: the gofer (a sibling of the sandbox) and
	// the ptrace platform's stub processes (children of the Sentry).
	// helpers maps their PID to its start time (so a reused PID is never
	// waited for); runscInits are the sandbox PIDs whose descendants are
	// collected into helpers.
	helpers    map[int]uint64
	runscInits map[int]bool
	sawRunsc   bool // a runsc sandbox was started: scan for orphaned helpers (guarded by reapMu)
	stop       chan struct{}
	done       chan struct{}
}

var (
	_ runtime.Runtime = (*Runtime)(nil)
	_ runtime.Pauser  = (*Runtime)(nil)
)

var idPattern = regexp.MustCompile(`^[a-z0-9][a-z0-9-]{0,63}$`)

// New returns the backend. It creates the state directories, opens the
// network (unless given), and removes leftovers of sandboxes whose
// creation was interrupted. Call Close when done.
func New(ctx context.Context, cfg Config, deps Deps) (*Runtime, error) {
	if err := cfg.setDefaults(); err != nil {
		return nil, err
	}
	if deps.Images == nil {
		return nil, fmt.Errorf("oci: Deps.Images is required: %w", errdefs.ErrInvalidArgument)
	}
	if _, err := os.Stat(cfg.AgentPath); err != nil {
		return nil, fmt.Errorf("oci: agent binary: %w: %w", err, errdefs.ErrFailedPrecondition)
	}
	r := &Runtime{
		cfg:            cfg,
		images:         deps.Images,
		net:            deps.Network,
		log:            deps.Logger,
		classes:        map[string]string{},
		kinds:          map[string]string{},
		checkpointable: map[string]bool{},
		reapPids:       map[int]string{},
		helpers:        map[int]uint64{},
		runscInits:     map[int]bool{},
	}
	if r.log == nil {
		r.log = slog.New(slog.DiscardHandler)
	}
	classes := cfg.Classes
	if classes == nil {
		classes = map[string]string{}
		for _, c := range knownClasses {
			classes[c] = c
		}
	}
	for class, bin := range classes {
		p, err := exec.LookPath(bin)
		if err != nil {
			continue
		}
		if filepath.Base(p) == "crun" && hybridWithV2Controllers() {
			r.log.Warn("oci: crun refuses cgroup hybrid mode with controllers on the v2 hierarchy; "+
				"mount the remaining controllers as v1 (e.g. hugetlb) to enable it", "class", class)
			continue
		}
		r.classes[class] = p
		kind := p
		if real, err := filepath.EvalSymlinks(p); err == nil {
			kind = real
		}
		r.kinds[class] = filepath.Base(kind)
		if r.kinds[class] == runscKind && runscCanCheckpoint(ctx, p) {
			r.checkpointable[class] = true
		}
	}
	for class, p := range r.classes {
		target := filepath.Join(cfg.RunRoot, "bin", class)
		if err := bindReadOnly(p, target); err != nil {
			r.log.Warn("oci: cannot bind the runtime binary read-only; using it directly", "class", class, "err", err)
			continue
		}
		r.classes[class] = target
	}
	if _, ok := r.classes[cfg.DefaultClass]; !ok {
		return nil, fmt.Errorf("oci: default class %q is not installed: %w", cfg.DefaultClass, errdefs.ErrFailedPrecondition)
	}
	for _, d := range []string{r.sandboxesDir(), cfg.RunRoot} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return nil, fmt.Errorf("oci: %w", err)
		}
	}
	if r.net == nil {
		m, err := network.Open(ctx, cfg.Network, r.log)
		if err != nil {
			return nil, err
		}
		r.net = m
	}
	if cfg.Subreaper {
		if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
			return nil, fmt.Errorf("oci: set child subreaper: %w", err)
		}
		r.stop, r.done = make(chan struct{}), make(chan struct{})
		go r.reapLoop()
	}
	if err := r.recover(ctx); err != nil {
		r.Close()
		return nil, err
	}
	return r, nil
}

// Close stops background work and unmounts the read-only runtime binary
// binds (a later New re-creates them). Sandboxes keep running.
func (r *Runtime) Close() error {
	if r.stop != nil {
		close(r.stop)
		<-r.done
		r.stop = nil
	}
	var errs []error
	for _, p := range r.classes {
		if filepath.Dir(p) == filepath.Join(r.cfg.RunRoot, "bin") {
			if err := unmountAll(p); err != nil {
				errs = append(errs, err)
			}
		}
	}
	return errors.Join(errs...)
}

// Name implements runtime.Runtime.
func (r *Runtime) Name() string { return "oci" }

// Capabilities implements runtime.Runtime.
func (r *Runtime) Capabilities() runtime.Capabilities {
	return runtime.Capabilities{Pause: true, Snapshot: true, Classes: slices.Sorted(maps.Keys(r.classes))}
}

func (r *Runtime) sandboxesDir() string        { return filepath.Join(r.cfg.Root, "sandboxes") }
func (r *Runtime) sandboxDir(id string) string { return filepath.Join(r.sandboxesDir(), id) }

// runc returns the go-runc client for class.
func (r *Runtime) runc(class string) *gorunc.Runc {
	rc := &gorunc.Runc{Command: r.classes[class], Root: r.stateRoot(class)}
	if r.kinds[class] == runscKind {
		rc.ExtraArgs = runscArgs
	}
	return rc
}

// stateRoot is the OCI runtime's --root for class.
func (r *Runtime) stateRoot(class string) string { return filepath.Join(r.cfg.RunRoot, class) }

// hasState reports whether the OCI runtime of class holds state for id:
// a directory for runc and crun, flat files for runsc.
func (r *Runtime) hasState(class, id string) bool {
	if r.kinds[class] == runscKind {
		return runscStateExists(r.stateRoot(class), id)
	}
	return exists(filepath.Join(r.stateRoot(class), id))
}

// stateIDs lists the container IDs the OCI runtime of class holds state
// for, read from its state directory (without running the runtime).
func (r *Runtime) stateIDs(class string) []string {
	ents, _ := os.ReadDir(r.stateRoot(class))
	var ids []string
	for _, e := range ents {
		id := e.Name()
		if r.kinds[class] == runscKind {
			var ok bool
			if id, _, ok = strings.Cut(id, "_sandbox:"); !ok || !strings.HasSuffix(e.Name(), ".state") {
				continue
			}
		} else if !e.IsDir() {
			continue
		}
		if idPattern.MatchString(id) {
			ids = append(ids, id)
		}
	}
	return ids
}

// record is the persistent state of one sandbox (state.json).
type record struct {
	Spec      runtime.Spec `json:"spec"` // AgentToken is never stored (json:"-")
	Class     string       `json:"class"`
	IP        string       `json:"ip,omitempty"`
	CreatedAt time.Time    `json:"createdAt"`
	// Complete is set once the container has been started.
	Complete bool `json:"complete"`
}

func (r *Runtime) readRecord(id string) (record, error) {
	var rec record
	data, err := os.ReadFile(filepath.Join(r.sandboxDir(id), "state.json"))
	if errors.Is(err, os.ErrNotExist) {
		return rec, fmt.Errorf("sandbox %q: %w", id, errdefs.ErrNotFound)
	}
	if err != nil {
		return rec, fmt.Errorf("oci: %w", err)
	}
	if err := json.Unmarshal(data, &rec); err != nil {
		return rec, fmt.Errorf("oci: sandbox %q: corrupt state: %w: %w", id, err, errdefs.ErrInternal)
	}
	return rec, nil
}

func writeFileAtomic(path string, data []byte, perm os.FileMode) error {
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, data, perm); err != nil {
		return err
	}
	if err := os.Rename(tmp, path); err != nil {
		os.Remove(tmp)
		return err
	}
	return nil
}

func (r *Runtime) writeRecord(id string, rec record) error {
	data, err := json.Marshal(rec)
	if err != nil {
		return err
	}
	return writeFileAtomic(filepath.Join(r.sandboxDir(id), "state.json"), data, 0o600)
}

func invalid(msg string) error { return errdefs.Invalid("SANDBOX::INVALID_PARAMETER", msg) }

func (r *Runtime) validate(spec *runtime.Spec) error {
	if !idPattern.MatchString(spec.ID) {
		return invalid(fmt.Sprintf("invalid sandbox id %q", spec.ID))
	}
	if spec.Image == "" {
		return invalid("image is required")
	}
	if spec.Checkpoint != "" {
		if err := r.validateRestore(spec); err != nil {
			return err
		}
	}
	if spec.Class == "" {
		spec.Class = r.cfg.DefaultClass
	}
	if _, ok := r.classes[spec.Class]; !ok {
		return invalid(fmt.Sprintf("runtime class %q is not available", spec.Class))
	}
	res := spec.Resources
	if res.CPUMillis < 0 || res.MemoryBytes < 0 || res.PidsLimit < 0 || res.DiskBytes < 0 {
		return invalid("resource limits must not be negative")
	}
	if res.MemoryBytes != 0 && res.MemoryBytes < 4<<20 {
		return invalid("memory limit must be at least 4 MiB")
	}
	if res.DiskBytes != 0 && res.DiskBytes < minDiskBytes {
		return invalid("disk limit must be at least 16 MiB")
	}
	if spec.WorkingDir != "" && !filepath.IsAbs(spec.WorkingDir) {
		return invalid("working directory must be absolute")
	}
	for k := range spec.Env {
		if k == "" || strings.ContainsAny(k, "=\x00") {
			return invalid(fmt.Sprintf("invalid environment variable name %q", k))
		}
	}
	for _, m := range spec.Mounts {
		if !filepath.IsAbs(m.Source) || filepath.Clean(m.Source) != m.Source || !filepath.IsAbs(m.Destination) ||
			filepath.Clean(m.Destination) != m.Destination || m.Destination == "/" || m.Destination == "/.moat" ||
			strings.HasPrefix(m.Destination, "/.moat/") || strings.ContainsRune(m.Source+m.Destination, 0) {
			return invalid(fmt.Sprintf("invalid mount %s -> %s", m.Source, m.Destination))
		}
		if _, err := os.Stat(m.Source); err != nil {
			return invalid(fmt.Sprintf("mount source %s: %v", m.Source, err))
		}
	}
	return nil
}

// Create implements runtime.Runtime.
func (r *Runtime) Create(ctx context.Context, spec runtime.Spec) (_ runtime.Status, err error) {
	if err := r.validate(&spec); err != nil {
		return runtime.Status{}, err
	}
	id := spec.ID
	dir := r.sandboxDir(id)
	t0 := time.Now()
	var phases []any
	phase := func(name string) {
		phases = append(phases, name, time.Since(t0))
	}
	defer func() {
		if err == nil {
			r.log.Debug("oci: created", append([]any{"id", id, "class", spec.Class}, phases...)...)
		}
	}()
	if err := os.Mkdir(dir, 0o700); err != nil {
		if errors.Is(err, os.ErrExist) {
			return runtime.Status{}, fmt.Errorf("sandbox %q: %w", id, errdefs.ErrAlreadyExists)
		}
		return runtime.Status{}, fmt.Errorf("oci: %w", err)
	}
	defer func() {
		if err != nil {
			if cerr := r.cleanup(context.WithoutCancel(ctx), id); cerr != nil {
				r.log.Error("oci: rollback of failed create left resources", "id", id, "err", cerr)
			}
		}
	}()
	rec := record{Spec: spec, Class: spec.Class, CreatedAt: time.Now().UTC()}
	if err := r.writeRecord(id, rec); err != nil {
		return runtime.Status{}, fmt.Errorf("oci: %w", err)
	}
	// The network is independent of the filesystem: set it up meanwhile.
	// The wait is deferred after the rollback, so it runs before it.
	var att network.Attachment
	var netErr error
	netDone := make(chan struct{})
	go func() {
		defer close(netDone)
		att, netErr = r.net.Setup(ctx, id)
	}()
	defer func() { <-netDone }()
	img, err := r.images.Rootfs(ctx, spec.Image)
	if err != nil {
		return runtime.Status{}, fmt.Errorf("oci: image %q: %w", spec.Image, err)
	}
	disk := spec.Resources.DiskBytes
	if disk == 0 {
		disk = r.cfg.Resources.DiskBytes
	}
	dirs := []string{"rootfs", "bundle", "files"}
	if disk == 0 {
		dirs = append(dirs, "upper", "work")
	}
	for _, d := range dirs {
		if err := os.Mkdir(filepath.Join(dir, d), 0o700); err != nil {
			return runtime.Status{}, fmt.Errorf("oci: %w", err)
		}
	}
	if disk > 0 {
		if err := setupDisk(dir, disk); err != nil {
			return runtime.Status{}, err
		}
		phase("disk")
	} else if err := os.Chmod(filepath.Join(dir, "upper"), 0o755); err != nil {
		// The container root must be traversable by non-root users.
		return runtime.Status{}, fmt.Errorf("oci: %w", err)
	}
	rootfs := filepath.Join(dir, "rootfs")
	upper, work := writableDirs(dir)
	if err := mountOverlay(img.Layers, upper, work, rootfs); err != nil {
		return runtime.Status{}, err
	}
	volumes, err := prepareVolumes(dir, spec.Mounts)
	if err != nil {
		return runtime.Status{}, err
	}
	phase("mount")
	<-netDone
	if netErr != nil {
		return runtime.Status{}, netErr
	}
	phase("network")
	rec.IP = att.IP.String()

	files := filepath.Join(dir, "files")
	hostname := id
	if len(hostname) > 12 {
		hostname = strings.TrimRight(hostname[:12], "-")
	}
	agentConf, err := json.Marshal(struct {
		Token string `json:"token"`
		Port  int    `json:"port"`
	}{spec.AgentToken, runtime.AgentPort})
	if err != nil {
		return runtime.Status{}, err
	}
	for name, content := range map[string][]byte{
		"agent.json":  agentConf,
		"hostname":    []byte(hostname + "\n"),
		"hosts":       fmt.Appendf(nil, "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n%s\t%s\n", att.IP, hostname),
		"resolv.conf": r.resolvConf(),
	} {
		perm := os.FileMode(0o644)
		if name == "agent.json" {
			perm = 0o600
		}
		if err := os.WriteFile(filepath.Join(files, name), content, perm); err != nil {
			return runtime.Status{}, fmt.Errorf("oci: %w", err)
		}
	}

	res := spec.Resources
	if res.CPUMillis == 0 {
		res.CPUMillis = r.cfg.Resources.CPUMillis
	}
	if res.MemoryBytes == 0 {
		res.MemoryBytes = r.cfg.Resources.MemoryBytes
	}
	if res.PidsLimit == 0 {
		res.PidsLimit = r.cfg.Resources.PidsLimit
	}
	cwd := spec.WorkingDir
	if cwd == "" {
		cwd = img.Config.WorkingDir
	}
	if cwd == "" {
		cwd = "/"
	}
	ociSpec := buildSpec(bundleInput{
		ID:           id,
		Hostname:     hostname,
		Rootfs:       rootfs,
		Args:         processArgs(spec, img.Config),
		Env:          processEnv(img.Config.Env, spec.Env),
		Cwd:          cwd,
		AgentBin:     r.cfg.AgentPath,
		AgentConf:    filepath.Join(files, "agent.json"),
		HostsFile:    filepath.Join(files, "hosts"),
		HostnameFile: filepath.Join(files, "hostname"),
		ResolvConf:   filepath.Join(files, "resolv.conf"),
		NetnsPath:    att.NetnsPath,
		Resources:    res,
		Volumes:      volumes,
	})
	if spec.Checkpoint != "" {
		if err := r.restoreProcess(spec.Checkpoint, ociSpec.Process); err != nil {
			return runtime.Status{}, err
		}
	}
	data, err := json.Marshal(ociSpec)
	if err != nil {
		return runtime.Status{}, err
	}
	bundle := filepath.Join(dir, "bundle")
	if err := os.WriteFile(filepath.Join(bundle, "config.json"), data, 0o600); err != nil {
		return runtime.Status{}, fmt.Errorf("oci: %w", err)
	}

	logf, err := os.OpenFile(filepath.Join(dir, "agent.log"), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return runtime.Status{}, fmt.Errorf("oci: %w", err)
	}
	defer logf.Close()
	pidFile := filepath.Join(dir, "pid")
	rc := r.runc(spec.Class)
	phase("bundle")
	// One `run --detach` is a single exec of the runtime, measurably faster
	// than `create` followed by `start`.
	run := func() error {
		if spec.Checkpoint != "" {
			return r.restore(ctx, spec.Class, id, bundle, spec.Checkpoint, fileIO{logf}, pidFile)
		}
		_, err := rc.Run(ctx, id, bundle, &gorunc.CreateOpts{
			IO:      fileIO{logf},
			PidFile: pidFile,
			Detach:  true,
		})
		return err
	}
	if r.kinds[spec.Class] == runscKind {
		err = runscStart(att.NetnsPath, run)
	} else {
		err = run()
	}
	if err != nil {
		return runtime.Status{}, fmt.Errorf("oci: start %s: %w: %s: %w", spec.Class, err, tail(filepath.Join(dir, "agent.log")), errdefs.ErrInternal)
	}
	phase("run")
	pid, err := readPid(pidFile)
	if err != nil {
		return runtime.Status{}, err
	}
	r.track(pid, id)
	r.trackHelpers(spec.Class, id, pid)
	rec.Complete = true
	if err := r.writeRecord(id, rec); err != nil {
		return runtime.Status{}, fmt.Errorf("oci: %w", err)
	}
	return runtime.Status{
		ID:        id,
		State:     runtime.StateRunning,
		Pid:       pid,
		IP:        rec.IP,
		Class:     rec.Class,
		CreatedAt: rec.CreatedAt,
		Labels:    spec.Labels,
	}, nil
}

// resolvConf is the content of every sandbox's /etc/resolv.conf.
func (r *Runtime) resolvConf() []byte {
	var b strings.Builder
	if len(r.cfg.DNSServers) > 0 {
		for _, s := range r.cfg.DNSServers {
			fmt.Fprintf(&b, "nameserver %s\n", s)
		}
		return []byte(b.String())
	}
	host, _ := os.ReadFile("/etc/resolv.conf")
	for line := range strings.SplitSeq(string(host), "\n") {
		f := strings.Fields(line)
		// The host's loopback resolvers are unreachable from a sandbox.
		if len(f) >= 2 && f[0] == "nameserver" && (strings.HasPrefix(f[1], "127.") || f[1] == "::1") {
			continue
		}
		b.WriteString(line)
		b.WriteByte('\n')
	}
	return []byte(strings.TrimRight(b.String(), "\n") + "\n")
}

// fileIO hands a log file to the runtime as the container's stdout and
// stderr (stdin is /dev/null). With --detach the container inherits the
// descriptors directly, so no copying goroutine is involved.
type fileIO struct{ f *os.File }

func (fileIO) Close() error          { return nil }
func (fileIO) Stdin() io.WriteCloser { return nil }
func (fileIO) Stdout() io.ReadCloser { return nil }
func (fileIO) Stderr() io.ReadCloser { return nil }
func (i fileIO) Set(cmd *exec.Cmd)   { cmd.Stdout, cmd.Stderr = i.f, i.f }
func readPid(path string) (int, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return 0, fmt.Errorf("oci: pid file: %w", err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(data)))
	if err != nil || pid <= 0 {
		return 0, fmt.Errorf("oci: bad pid file %q: %w", data, errdefs.ErrInternal)
	}
	return pid, nil
}

// tail returns the last lines of a log file for error messages.
func tail(path string) string {
	data, _ := os.ReadFile(path)
	if len(data) > 2048 {
		data = data[len(data)-2048:]
	}
	return strings.TrimSpace(string(data))
}

// containerState asks the OCI runtime about id; ok is false if the runtime
// has no such container.
func (r *Runtime) containerState(ctx context.Context, class, id string) (c *gorunc.Container, ok bool, err error) {
	if _, avail := r.classes[class]; !avail {
		return nil, false, fmt.Errorf("oci: class %q of sandbox %q is no longer installed: %w", class, id, errdefs.ErrUnavailable)
	}
	if !r.hasState(class, id) {
		return nil, false, nil
	}
	c, err = r.runc(class).State(ctx, id)
	if err != nil {
		if !r.hasState(class, id) {
			return nil, false, nil
		}
		return nil, false, fmt.Errorf("oci: %s state %s: %w: %w", class, id, err, errdefs.ErrUnavailable)
	}
	return c, true, nil
}

func (r *Runtime) status(id string, rec record, c *gorunc.Container, found bool) runtime.Status {
	st := runtime.Status{
		ID:        id,
		IP:        rec.IP,
		Class:     rec.Class,
		CreatedAt: rec.CreatedAt,
		Labels:    rec.Spec.Labels,
	}
	switch {
	case !rec.Complete:
		st.State = runtime.StateCreating
	case !found:
		st.State = runtime.StateStopped
		st.Message = "container is gone from the OCI runtime (host reboot?)"
	default:
		st.Pid = c.Pid
		switch c.Status {
		case "running":
			st.State = runtime.StateRunning
		case "paused", "pausing":
			st.State = runtime.StatePaused
		case "stopped":
			st.State = runtime.StateStopped
			st.Pid = 0
		case "created", "creating":
			st.State = runtime.StateCreating
		default:
			st.State = runtime.StateUnknown
			st.Message = "OCI runtime status " + strconv.Quote(c.Status)
		}
	}
	if st.State == runtime.StateStopped {
		if data, err := os.ReadFile(filepath.Join(r.sandboxDir(id), "exit")); err == nil {
			st.ExitCode, _ = strconv.Atoi(strings.TrimSpace(string(data)))
		}
	}
	return st
}

// Status implements runtime.Runtime.
func (r *Runtime) Status(ctx context.Context, id string) (runtime.Status, error) {
	if !idPattern.MatchString(id) {
		return runtime.Status{}, fmt.Errorf("sandbox %q: %w", id, errdefs.ErrNotFound)
	}
	rec, err := r.readRecord(id)
	if err != nil {
		return runtime.Status{}, err
	}
	if !rec.Complete {
		return r.status(id, rec, nil, false), nil
	}
	c, found, err := r.containerState(ctx, rec.Class, id)
	if err != nil {
		st := r.status(id, rec, nil, false)
		st.State, st.Message = runtime.StateUnknown, err.Error()
		return st, nil
	}
	return r.status(id, rec, c, found), nil
}

// List implements runtime.Runtime. It asks each OCI runtime once.
func (r *Runtime) List(ctx context.Context) ([]runtime.Status, error) {
	entries, err := os.ReadDir(r.sandboxesDir())
	if err != nil {
		return nil, fmt.Errorf("oci: %w", err)
	}
	containers := map[string]map[string]*gorunc.Container{}
	listed := map[string]error{}
	var out []runtime.Status
	for _, e := range entries {
		id := e.Name()
		if !e.IsDir() || !idPattern.MatchString(id) {
			continue
		}
		rec, err := r.readRecord(id)
		if errdefs.IsNotFound(err) {
			continue // Create has made the directory but not the record yet
		}
		if err != nil {
			out = append(out, runtime.Status{ID: id, State: runtime.StateUnknown, Message: err.Error()})
			continue
		}
		if _, done := listed[rec.Class]; !done && rec.Complete {
			listed[rec.Class] = nil
			if _, avail := r.classes[rec.Class]; !avail {
				listed[rec.Class] = fmt.Errorf("class %q is not installed", rec.Class)
			} else if cs, err := r.runc(rec.Class).List(ctx); err != nil {
				listed[rec.Class] = err
			} else {
				m := map[string]*gorunc.Container{}
				for _, c := range cs {
					m[c.ID] = c
				}
				containers[rec.Class] = m
			}
		}
		if lerr := listed[rec.Class]; lerr != nil && rec.Complete {
			// `runc list` fails as a whole now and then (seen under churn
			// right after a crash); one bad answer must not make every
			// sandbox of the class look dead. Ask about this one alone.
			c, found, err := r.containerState(ctx, rec.Class, id)
			if err != nil {
				st := r.status(id, rec, nil, false)
				st.State, st.Message = runtime.StateUnknown, fmt.Sprintf("list: %v; state: %v", lerr, err)
				out = append(out, st)
				continue
			}
			out = append(out, r.status(id, rec, c, found))
			continue
		}
		c, found := containers[rec.Class][id]
		out = append(out, r.status(id, rec, c, found))
	}
	return out, nil
}

// Endpoint implements runtime.Runtime.
func (r *Runtime) Endpoint(ctx context.Context, id string, port int) (string, error) {
	if port <= 0 || port > 65535 {
		return "", invalid(fmt.Sprintf("invalid port %d", port))
	}
	if !idPattern.MatchString(id) {
		return "", fmt.Errorf("sandbox %q: %w", id, errdefs.ErrNotFound)
	}
	rec, err := r.readRecord(id)
	if err != nil {
		return "", err
	}
	if rec.IP == "" {
		return "", fmt.Errorf("sandbox %q has no address yet: %w", id, errdefs.ErrFailedPrecondition)
	}
	return rec.IP + ":" + strconv.Itoa(port), nil
}

// Stop implements runtime.Runtime.
func (r *Runtime) Stop(ctx context.Context, id string, grace time.Duration) error {
	if !idPattern.MatchString(id) {
		return fmt.Errorf("sandbox %q: %w", id, errdefs.ErrNotFound)
	}
	rec, err := r.readRecord(id)
	if err != nil {
		return err
	}
	c, found, err := r.containerState(ctx, rec.Class, id)
	if err != nil {
		return err
	}
	if !found || c.Status == "stopped" || c.Pid == 0 {
		return nil
	}
	rc := r.runc(rec.Class)
	r.collectHelpers()
	paused := c.Status == "paused"
	if grace > 0 {
		if err := rc.Kill(ctx, id, int(unix.SIGTERM), nil); err != nil && alive(c.Pid) {
			return fmt.Errorf("oci: kill %s: %w: %w", id, err, errdefs.ErrInternal)
		}
		if paused {
			// A frozen process cannot act on a signal; thaw so it can.
			if err := rc.Resume(ctx, id); err != nil && alive(c.Pid) {
				return fmt.Errorf("oci: resume %s: %w: %w", id, err, errdefs.ErrInternal)
			}
			paused = false
		}
		if waitExit(ctx, c.Pid, grace) {
			return nil
		}
	}
	if err := rc.Kill(ctx, id, int(unix.SIGKILL), &gorunc.KillOpts{All: true}); err != nil && alive(c.Pid) {
		return fmt.Errorf("oci: kill -9 %s: %w: %w", id, err, errdefs.ErrInternal)
	}
	if paused {
		// SIGKILL is not acted on by frozen tasks until they thaw.
		rc.Resume(ctx, id)
	}
	if !waitExit(ctx, c.Pid, 10*time.Second) {
		return fmt.Errorf("oci: sandbox %s did not die after SIGKILL: %w", id, errdefs.ErrInternal)
	}
	return nil
}

// alive reports whether pid exists and is not a zombie.
func alive(pid int) bool {
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	// The state follows the parenthesized command name.
	s := string(data)
	i := strings.LastIndexByte(s, ')')
	if i < 0 || i+2 >= len(s) {
		return false
	}
	switch s[i+2] {
	case 'Z', 'X', 'x':
		return false
	}
	return true
}

// waitExit polls until pid is gone, d has passed or ctx is done.
func waitExit(ctx context.Context, pid int, d time.Duration) bool {
	deadline := time.Now().Add(d)
	for {
		if !alive(pid) {
			return true
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return false
		}
		select {
		case <-ctx.Done():
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// Pause implements runtime.Pauser.
func (r *Runtime) Pause(ctx context.Context, id string) error {
	return r.freeze(ctx, id, true)
}

// Resume implements runtime.Pauser.
func (r *Runtime) Resume(ctx context.Context, id string) error {
	return r.freeze(ctx, id, false)
}

func (r *Runtime) freeze(ctx context.Context, id string, pause bool) error {
	if !idPattern.MatchString(id) {
		return fmt.Errorf("sandbox %q: %w", id, errdefs.ErrNotFound)
	}
	rec, err := r.readRecord(id)
	if err != nil {
		return err
	}
	c, found, err := r.containerState(ctx, rec.Class, id)
	if err != nil {
		return err
	}
	want, op := "running", r.runc(rec.Class).Pause
	if !pause {
		want, op = "paused", r.runc(rec.Class).Resume
	}
	if !found || c.Status != want {
		status := "gone"
		if found {
			status = c.Status
		}
		return fmt.Errorf("sandbox %q is %s, not %s: %w", id, status, want, errdefs.ErrFailedPrecondition)
	}
	if err := op(ctx, id); err != nil {
		return fmt.Errorf("oci: pause/resume %s: %w: %w", id, err, errdefs.ErrInternal)
	}
	return nil
}

// Delete implements runtime.Runtime.
func (r *Runtime) Delete(ctx context.Context, id string) error {
	if !idPattern.MatchString(id) {
		return nil
	}
	return r.cleanup(ctx, id)
}

// cleanup removes everything that may exist for id, in reverse order of
// creation. Each step tolerates its resource being absent, so it serves
// for Delete, for the rollback of a failed Create and for recovery.
func (r *Runtime) cleanup(ctx context.Context, id string) error {
	dir := r.sandboxDir(id)
	classes := slices.Sorted(maps.Keys(r.classes))
	if rec, err := r.readRecord(id); err == nil {
		classes = []string{rec.Class}
	}
	var errs []error
	for _, class := range classes {
		if err := r.deleteContainer(ctx, class, id); err != nil {
			errs = append(errs, err)
		}
	}
	// A container the runtime lost track of (a `run` of a crashed server
	// that finished late) is still in its cgroups: kill it there.
	killCgroupProcs(id)
	if err := unmountAll(filepath.Join(dir, "rootfs")); err != nil {
		errs = append(errs, err)
	} else if err := unmountAll(filepath.Join(dir, diskMount)); err != nil {
		// The loop device of the quota filesystem auto-clears here.
		errs = append(errs, err)
	}
	if err := unmountVolumes(dir); err != nil {
		errs = append(errs, err)
	}
	if err := r.net.Teardown(ctx, id); err != nil {
		errs = append(errs, err)
	}
	if err := removeCgroups(id); err != nil {
		errs = append(errs, err)
	}
	if len(errs) > 0 {
		// Keep the directory (and its record) so a later Delete retries.
		return fmt.Errorf("oci: delete %s: %w", id, errors.Join(errs...))
	}
	if left := mountsUnder(dir); len(left) > 0 {
		// Never RemoveAll through a mount (a host volume above all).
		return fmt.Errorf("oci: delete %s: still mounted: %v: %w", id, left, errdefs.ErrInternal)
	}
	if err := removeDirRetry(dir); err != nil {
		return fmt.Errorf("oci: delete %s: %w", id, err)
	}
	return nil
}

// removeDirRetry is os.RemoveAll retried a few times on ENOTEMPTY: a
// runsc helper that is exiting (seen under heavy load) can still create a
// file in the sandbox directory while it is being removed.
func removeDirRetry(dir string) error {
	var err error
	for i := range 5 {
		if err = os.RemoveAll(dir); err == nil || !errors.Is(err, unix.ENOTEMPTY) {
			return err
		}
		time.Sleep(time.Duration(50<<i) * time.Millisecond)
	}
	return err
}

func (r *Runtime) deleteContainer(ctx context.Context, class, id string) error {
	if _, ok := r.classes[class]; !ok {
		return nil
	}
	if r.kinds[class] == runscKind {
		// runsc delete removes the .state file but may leave .lock files.
		defer removeRunscLeftovers(r.stateRoot(class), id)
	}
	if !r.hasState(class, id) {
		return nil
	}
	rc := r.runc(class)
	r.collectHelpers()
	if c, err := rc.State(ctx, id); err == nil && c.Status == "paused" {
		// SIGKILL is not delivered to frozen tasks until they thaw.
		rc.Kill(ctx, id, int(unix.SIGKILL), &gorunc.KillOpts{All: true})
		rc.Resume(ctx, id)
	}
	if err := rc.Delete(ctx, id, &gorunc.DeleteOpts{Force: true}); err != nil {
		if !r.hasState(class, id) {
			return nil
		}
		return fmt.Errorf("%s delete: %w", class, err)
	}
	return nil
}

// removeCgroups removes /moat/<id> in every cgroup hierarchy, in case the
// OCI runtime did not (e.g. it crashed between creating and starting).
func removeCgroups(id string) error {
	dirs, _ := filepath.Glob("/sys/fs/cgroup/*/moat/" + id)
	if d := "/sys/fs/cgroup/moat/" + id; exists(d) {
		dirs = append(dirs, d)
	}
	var errs []error
	for _, d := range dirs {
		// Nested cgroups first (a cgroup namespace lets the sandbox make them).
		var sub []string
		filepath.WalkDir(d, func(p string, e os.DirEntry, err error) error {
			if err == nil && e.IsDir() && p != d {
				sub = append(sub, p)
			}
			return nil
		})
		for i := len(sub) - 1; i >= 0; i-- {
			unix.Rmdir(sub[i])
		}
		if err := unix.Rmdir(d); err != nil && !errors.Is(err, unix.ENOENT) {
			errs = append(errs, fmt.Errorf("remove cgroup %s: %w", d, err))
		}
	}
	return errors.Join(errs...)
}

func exists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}

// recover removes sandboxes whose creation never completed, OCI
// containers and network attachments that belong to no sandbox, and
// re-tracks the init processes of running sandboxes for reaping.
func (r *Runtime) recover(ctx context.Context) error {
	entries, err := os.ReadDir(r.sandboxesDir())
	if err != nil {
		return fmt.Errorf("oci: %w", err)
	}
	known := map[string]bool{}
	for _, e := range entries {
		id := e.Name()
		if !idPattern.MatchString(id) {
			continue
		}
		rec, err := r.readRecord(id)
		if err == nil && rec.Complete {
			known[id] = true
			if pid, err := readPid(filepath.Join(r.sandboxDir(id), "pid")); err == nil {
				r.track(pid, id)
				r.trackHelpers(rec.Class, id, pid)
			}
			continue
		}
		r.log.Info("oci: removing half-created sandbox", "id", id)
		if err := r.cleanupHalfCreated(ctx, id); err != nil {
			// Its directory stays, so the next start (or a Delete) retries;
			// refusing to start would strand every healthy sandbox.
			r.log.Error("oci: could not remove half-created sandbox", "id", id, "err", err)
		}
	}
	for class := range r.classes {
		for _, id := range r.stateIDs(class) {
			if !known[id] {
				r.log.Info("oci: removing orphaned container", "id", id, "class", class)
				if err := r.deleteContainer(ctx, class, id); err != nil {
					return err
				}
				removeCgroups(id)
			}
		}
	}
	atts, err := r.net.List(ctx)
	if err != nil {
		return err
	}
	for _, a := range atts {
		if !known[a.ID] {
			r.log.Info("oci: removing orphaned network", "id", a.ID)
			if err := r.net.Teardown(ctx, a.ID); err != nil {
				return err
			}
		}
	}
	return nil
}

// track registers a container init for reaping (if Subreaper is on).
func (r *Runtime) track(pid int, id string) {
	if r.stop == nil {
		return
	}
	r.reapMu.Lock()
	r.reapPids[pid] = id
	r.reapMu.Unlock()
	r.reap() // it may have exited before we tracked it
}

// trackHelpers registers the helper processes of a runsc sandbox (see
// Runtime.helpers) for reaping, if Subreaper is on.
func (r *Runtime) trackHelpers(class, id string, pid int) {
	if r.stop == nil || r.kinds[class] != runscKind {
		return
	}
	r.reapMu.Lock()
	defer r.reapMu.Unlock()
	r.runscInits[pid] = true
	r.sawRunsc = true
	if gofer := runscGoferPid(r.stateRoot(class), id); gofer > 0 {
		r.addHelperLocked(gofer)
	}
	r.collectHelpersLocked()
}

func (r *Runtime) addHelperLocked(pid int) {
	if _, ok := r.helpers[pid]; ok {
		return
	}
	if st, ok := readProcStat(pid); ok {
		r.helpers[pid] = st.start
	}
}

// collectHelpersLocked adds the current descendants of each live runsc
// sandbox to helpers.
func (r *Runtime) collectHelpersLocked() {
	for pid := range r.runscInits {
		if _, live := r.reapPids[pid]; !live {
			delete(r.runscInits, pid)
			continue
		}
		for _, d := range descendants(pid) {
			r.addHelperLocked(d)
		}
	}
}

// collectHelpers is collectHelpersLocked for callers about to kill a
// sandbox, so that helpers started since the last tick are known.
func (r *Runtime) collectHelpers() {
	if r.stop == nil {
		return
	}
	r.reapMu.Lock()
	r.collectHelpersLocked()
	r.reapMu.Unlock()
}

// reapLoop reaps exited sandbox inits on SIGCHLD. It waits only for the
// tracked PIDs, never for "any child", so it does not race with os/exec.
func (r *Runtime) reapLoop() {
	defer close(r.done)
	ch := make(chan os.Signal, 1)
	signal.Notify(ch, syscall.SIGCHLD)
	defer signal.Stop(ch)
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		select {
		case <-r.stop:
			return
		case <-ch:
		case <-tick.C:
		}
		r.reap()
	}
}

func (r *Runtime) reap() {
	r.reapMu.Lock()
	defer r.reapMu.Unlock()
	r.collectHelpersLocked()
	for pid, id := range r.reapPids {
		var ws unix.WaitStatus
		got, err := unix.Wait4(pid, &ws, unix.WNOHANG, nil)
		if got == 0 && err == nil {
			continue // still running
		}
		delete(r.reapPids, pid)
		if err != nil {
			continue // not our child (adopted by another process)
		}
		code := ws.ExitStatus()
		if ws.Signaled() {
			code = 128 + int(ws.Signal())
		}
		os.WriteFile(filepath.Join(r.sandboxDir(id), "exit"), []byte(strconv.Itoa(code)), 0o600)
	}
	self := os.Getpid()
	for pid, start := range r.helpers {
		st, ok := readProcStat(pid)
		if !ok || st.start != start {
			delete(r.helpers, pid) // gone, or the PID was reused
			continue
		}
		if st.state != 'Z' || st.ppid != self {
			continue // running, or not (yet) adopted by us
		}
		unix.Wait4(pid, nil, unix.WNOHANG, nil)
		delete(r.helpers, pid)
	}
	r.reapOrphanHelpersLocked()
}

// hybridWithV2Controllers reports a cgroup v1 host whose unified (v2)
// hierarchy still owns controllers, a setup crun rejects.
func hybridWithV2Controllers() bool {
	data, err := os.ReadFile("/sys/fs/cgroup/unified/cgroup.controllers")
	return err == nil && strings.TrimSpace(string(data)) != ""
}

// Package oci is the native sandbox backend: it runs each sandbox as an OCI
// container through runc, crun or runsc (no container daemon), with an
// overlayfs root over the image layers, its own network namespace on the
// moat bridge (package network), and the moat agent (cmd/moat-agent)
// bind-mounted as PID 1.
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
//	sandboxes/<id>/exit         exit code, once reaped, and the exit reason ("137 OOMKilled")
//	sandboxes/<id>/volumes/<i>  host-side binds of its volumes (host paths, named volumes)
//	volumes/<name>/...          named volumes (internal/volume.Store: a quota
//	                            filesystem each, mounted while a sandbox uses it)
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
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	gorunc "github.com/containerd/go-runc"
	"golang.org/x/sys/unix"

	"github.com/moat-sandbox/moat/internal/errdefs"
	"github.com/moat-sandbox/moat/internal/image"
	"github.com/moat-sandbox/moat/internal/network"
	"github.com/moat-sandbox/moat/internal/runtime"
	"github.com/moat-sandbox/moat/internal/volume"
)

// Defaults for Config.
const (
	DefaultRoot    = "/var/lib/moat/oci"
	DefaultRunRoot = "/run/moat"
	DefaultClass   = "runc"
	// DefaultPidsLimit applies when neither the spec nor Config sets one.
	DefaultPidsLimit = 4096
	// DefaultCgroupParent holds the sandboxes' cgroups.
	DefaultCgroupParent = "/moat"
)

// KnownClasses returns the OCI runtimes the backend knows, looked up on
// PATH when Config.Classes is nil.
func KnownClasses() []string { return []string{"runc", "crun", "runsc"} }

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
	// AgentPath is the host path of the agent binary (cmd/moat-agent)
	// bind-mounted read-only into each sandbox as PID 1. Required; it must
	// be a static binary. The server installs the agent moat carries
	// (internal/agentbin).
	AgentPath string `json:"agentPath,omitempty"`
	// VolumeDefaultSize is the capacity, in bytes, of a named volume
	// created without one (default volume.DefaultSize, 1 GiB).
	VolumeDefaultSize int64 `json:"volumeDefaultSize,omitempty"`
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
	// CgroupParent is the cgroup every sandbox's cgroup is made under, in
	// every hierarchy: <CgroupParent>/<id> (default "/moat"). Changing it
	// while sandboxes run strands their cgroups.
	CgroupParent string `json:"cgroupParent,omitempty"`
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
		return fmt.Errorf("oci: Config.AgentPath is required: %w", errdefs.ErrInvalidArgument)
	}
	if err := runtime.CheckAgentBinary(c.AgentPath); err != nil {
		return err
	}
	if c.Resources.PidsLimit == 0 {
		c.Resources.PidsLimit = DefaultPidsLimit
	}
	if c.CgroupParent == "" {
		c.CgroupParent = DefaultCgroupParent
	}
	if cg := path.Clean(c.CgroupParent); !path.IsAbs(cg) || cg == "/" || cg != c.CgroupParent || strings.ContainsAny(cg, ":\n") {
		return fmt.Errorf("oci: cgroup parent %q: want a clean absolute path below /: %w", c.CgroupParent, errdefs.ErrInvalidArgument)
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

// Images resolves image references to layer directories and pins the
// layers of every sandbox, so that image GC (in any process sharing the
// store) never removes what a sandbox runs on, also after its image lost
// its name. Implementations must be safe for concurrent use.
type Images interface {
	// Rootfs resolves ref (ErrNotFound if unknown) and pins its layers for
	// sandbox id until Unpin(id).
	Rootfs(ctx context.Context, id, ref string) (Rootfs, error)
	// Pin pins layers (as a Rootfs gave them) for sandbox id: a sandbox
	// re-adopted after a restart.
	Pin(id string, layers []string) error
	// Unpin releases what Rootfs or Pin pinned for id. It is idempotent.
	Unpin(id string)
}

// Network gives sandboxes their network; *network.Manager implements it.
type Network interface {
	Setup(ctx context.Context, id string) (network.Attachment, error)
	// NetnsPath is the path of the network namespace Setup makes for id
	// (known before Setup ends, so the bundle is written meanwhile).
	NetnsPath(id string) string
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
	ownNet  *network.Manager // the Manager New opened (Deps.Network unset), closed by Close
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
	sawRunsc   bool                 // a runsc sandbox was started: scan for orphaned helpers (guarded by reapMu)
	zombies    map[zombie]time.Time // untracked zombie children seen on the last pass, since when (guarded by reapMu)
	// lastOrphanScan is when reapOrphansLocked last read /proc (reapMu).
	lastOrphanScan time.Time
	stop           chan struct{}
	done           chan struct{}
	pidfds         map[int]*os.File // tracked init pid -> its pidfd, while awaitInit waits on it (reapMu)
	watching       sync.WaitGroup   // awaitInit goroutines

	exitMu  sync.Mutex
	exitFns []func(runtime.Exit) // NotifyExits subscribers (exitMu)

	// afterRuncList, if set (tests only), runs in List right after the
	// OCI runtimes were asked.
	afterRuncList func()

	// vols holds the named volumes (runtime.Volumes, volumes.go).
	vols *volume.Store

	// tasksFile is the cgroup v1 "tasks" file of moat's own pids cgroup
	// ("" without one); warming is set while warmCgroupAttach's write is
	// in flight, warmed ends with it (Close waits for it), creating
	// counts the creates in flight (cgwarm.go).
	tasksFile string
	warming   atomic.Bool
	warmed    sync.WaitGroup
	creating  atomic.Int32
}

var (
	_ runtime.Runtime = (*Runtime)(nil)
	_ runtime.Pauser  = (*Runtime)(nil)
	_ runtime.Volumes = (*Runtime)(nil)

	_ runtime.ExitNotifier = (*Runtime)(nil)
)

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
		tasksFile:      selfTasksFile(),
		cfg:            cfg,
		images:         deps.Images,
		net:            deps.Network,
		log:            deps.Logger,
		classes:        map[string]string{},
		kinds:          map[string]string{},
		checkpointable: map[string]bool{},
		reapPids:       map[int]string{},
		pidfds:         map[int]*os.File{},
		helpers:        map[int]uint64{},
		runscInits:     map[int]bool{},
	}
	if r.log == nil {
		r.log = slog.New(slog.DiscardHandler)
	}
	r.findClasses(ctx)
	if _, ok := r.classes[cfg.DefaultClass]; !ok {
		return nil, fmt.Errorf("oci: default class %q is not installed: %w", cfg.DefaultClass, errdefs.ErrFailedPrecondition)
	}
	for _, d := range []string{r.sandboxesDir(), cfg.RunRoot} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return nil, fmt.Errorf("oci: %w", err)
		}
	}
	vols, err := volume.OpenStore(filepath.Join(cfg.Root, "volumes"), cfg.VolumeDefaultSize)
	if err != nil {
		return nil, fmt.Errorf("oci: %w", err)
	}
	r.vols = vols
	if r.net == nil {
		m, err := network.Open(ctx, cfg.Network, r.log)
		if err != nil {
			return nil, err
		}
		r.net, r.ownNet = m, m
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

// findClasses fills r.classes and r.kinds with the OCI runtimes that are
// installed (Config.Classes, or KnownClasses on PATH), each bound
// read-only under RunRoot/bin when it can be, and marks the runsc ones
// that can checkpoint.
func (r *Runtime) findClasses(ctx context.Context) {
	classes := r.cfg.Classes
	if classes == nil {
		classes = map[string]string{}
		for _, c := range KnownClasses() {
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
		target := filepath.Join(r.cfg.RunRoot, "bin", class)
		if err := bindReadOnly(p, target); err != nil {
			r.log.Warn("oci: cannot bind the runtime binary read-only; using it directly", "class", class, "err", err)
			continue
		}
		r.classes[class] = target
	}
}

// Close stops background work and unmounts the read-only runtime binary
// binds (a later New re-creates them). Sandboxes keep running.
func (r *Runtime) Close() error {
	r.warmed.Wait()
	if r.stop != nil {
		close(r.stop)
		<-r.done
		r.stop = nil
	}
	r.stopAwaiting()
	var errs []error
	if r.ownNet != nil {
		errs = append(errs, r.ownNet.Close())
	}
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
	return runtime.Capabilities{Classes: slices.Sorted(maps.Keys(r.classes))}
}

// runc returns the go-runc client for class.
func (r *Runtime) runc(class string) *gorunc.Runc {
	rc := &gorunc.Runc{Command: r.classes[class], Root: r.stateRoot(class)}
	if r.kinds[class] == runscKind {
		rc.ExtraArgs = runscArgs
	}
	return rc
}

// Package runtime defines the contract every sandbox backend implements.
//
// A Runtime owns the machinery of a sandbox: its root filesystem, its
// process tree (with the moat agent, cmd/moat-agent, as PID 1), its network
// namespace and address, and its cgroup. The lifecycle service owns
// everything else (expiry, metadata, API state) and persists it; it talks to
// a backend only through this package.
//
// Identifiers: sandbox IDs are chosen by the caller (lifecycle) and are
// unique per server. They are at most 64 characters of [a-z0-9-].
//
// Concurrency: methods may be called concurrently for different IDs. Calls
// for the same ID are serialized by the caller.
//
// Errors: every method returns an errdefs class (ErrNotFound for an unknown
// ID, ErrInvalidArgument for a bad Spec, ErrFailedPrecondition for a call in
// the wrong state, ErrUnavailable when the backend cannot be reached).
package runtime

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/moat-sandbox/moat/internal/egress/policy"
	"github.com/moat-sandbox/moat/internal/errdefs"
)

// State is the backend-level state of a sandbox. It is coarser than the
// Lifecycle API state machine, which lifecycle derives from it.
type State string

// Backend states.
const (
	// StateCreating: resources are being set up; the process is not yet running.
	StateCreating State = "creating"
	// StateRunning: the agent process is running.
	StateRunning State = "running"
	// StatePaused: all processes are frozen.
	StatePaused State = "paused"
	// StateStopped: the agent process exited; resources still exist until Delete.
	StateStopped State = "stopped"
	// StateUnknown: the backend cannot tell (e.g. inconsistent leftovers).
	StateUnknown State = "unknown"
)

func (s State) String() string { return string(s) }

// Resources are the limits applied to a sandbox. Zero means "backend
// default" (see the backend's Config).
type Resources struct {
	// CPUMillis is the CPU quota in thousandths of a core (500 = half a core).
	CPUMillis int64 `json:"cpuMillis,omitempty"`
	// MemoryBytes is the memory limit (RSS + page cache), in bytes.
	MemoryBytes int64 `json:"memoryBytes,omitempty"`
	// PidsLimit caps the number of tasks in the sandbox.
	PidsLimit int64 `json:"pidsLimit,omitempty"`
	// DiskBytes caps the writable layer; 0 = unlimited (backend permitting).
	DiskBytes int64 `json:"diskBytes,omitempty"`
}

// Spec describes a sandbox to create.
type Spec struct {
	// ID is the sandbox ID (see package doc).
	ID string `json:"id"`
	// Image is the image reference, as accepted by the backend's image
	// store (a name like "registry:5000/busybox:latest" or a digest).
	Image string `json:"image"`
	// Entrypoint is the user command, run by the agent as its child. Empty
	// means the image's entrypoint+cmd, or an idle process if none.
	Entrypoint []string `json:"entrypoint,omitempty"`
	// Env is added to the image's environment, for the entrypoint and every
	// command the agent runs.
	Env map[string]string `json:"env,omitempty"`
	// WorkingDir overrides the image's working directory.
	WorkingDir string `json:"workingDir,omitempty"`
	// Resources are the limits.
	Resources Resources `json:"resources"`
	// Class selects a backend flavour, e.g. the OCI runtime binary
	// ("runc", "crun", "runsc"). Empty means the backend default.
	Class string `json:"class,omitempty"`
	// AgentToken is the execd access token; empty disables agent auth.
	AgentToken string `json:"-"`
	// Labels are opaque key/values a backend stores with the sandbox so
	// that List can return them after a server restart.
	Labels map[string]string `json:"labels,omitempty"`
	// Mounts are host directories or files bind-mounted into the sandbox.
	// The caller (lifecycle) has checked them against the server's
	// allow-list; backends only check their shape.
	Mounts []Mount `json:"mounts,omitempty"`
	// Checkpoint, when set, names a checkpoint (Checkpointer) to restore
	// instead of starting a fresh agent: the sandbox continues the
	// checkpointed processes, with their memory and writable layer. Image
	// must hold the checkpointed sandbox's root filesystem; Entrypoint and
	// WorkingDir are ignored (the checkpointed ones are running), Mounts
	// must be empty, and the restored agent still holds the checkpointed
	// sandbox's access token (AgentToken is not applied).
	Checkpoint string `json:"checkpoint,omitempty"`
	// Egress, when set, asks a backend that enforces egress inside the
	// sandbox (the kubernetes runtime's sidecar)
	// to start it under Policy, before the sandbox's processes run, with
	// Token guarding its egress API. Other backends ignore it: the
	// server's enforcer attaches from outside.
	Egress *Egress `json:"-"`
	// Tenant is the tenant that owns the sandbox ("default" for the
	// default tenant). Backends that give each tenant a place of its own
	// (the kubernetes backend's tenant namespaces) put the sandbox there;
	// others ignore it.
	Tenant string `json:"tenant,omitempty"`
}

// Egress is the egress enforcement a sandbox starts under (Spec.Egress).
type Egress struct {
	// Token authenticates the egress API (OPENSANDBOX-EGRESS-AUTH).
	Token string
	// Policy is the effective policy at start.
	Policy policy.NetworkPolicy
	// CredentialProxy: the sandbox has the Credential Vault, whose proxy
	// a backend enforcing egress inside the sandbox runs there too (its
	// CA and vault follow through the backend's Egress).
	CredentialProxy bool
}

// Mount is a bind mount of a host path, or of a named volume, into a
// sandbox.
type Mount struct {
	// Source is the absolute, symlink-free host path (host volumes);
	// empty when Volume is set.
	Source string `json:"source,omitempty"`
	// Volume names a named volume of the backend (Volumes) to mount
	// instead of a host path. It must exist when Create is called.
	Volume string `json:"volume,omitempty"`
	// SubPath is a relative path inside Volume to mount instead of its
	// root. The backend resolves it confined to the volume (no ".." and
	// no symlink may lead out of it) and creates missing directories.
	SubPath string `json:"subPath,omitempty"`
	// Destination is the absolute path inside the sandbox.
	Destination string `json:"destination"`
	// ReadOnly makes the mount read-only inside the sandbox.
	ReadOnly bool `json:"readOnly,omitempty"`
}

// Status is what a backend knows about one sandbox.
type Status struct {
	ID    string `json:"id"`
	State State  `json:"state"`
	// Pid is the host PID of the agent (0 if not running or not known).
	Pid int `json:"pid,omitempty"`
	// IP is the sandbox address reachable from the host, if any.
	IP string `json:"ip,omitempty"`
	// Class is the backend flavour actually used.
	Class string `json:"class,omitempty"`
	// ExitCode is set when State is StateStopped.
	ExitCode int `json:"exitCode,omitempty"`
	// ExitReason is how a stopped sandbox ended, if the backend knows
	// (ExitReasonOOMKilled, ExitReasonExited).
	ExitReason string `json:"exitReason,omitempty"`
	// CreatedAt is when the backend created the sandbox.
	CreatedAt time.Time `json:"createdAt"`
	// Message is a human-readable detail (e.g. why it is unknown).
	Message string `json:"message,omitempty"`
	// Labels are the Spec labels.
	Labels map[string]string `json:"labels,omitempty"`
}

// Capabilities describe what a backend offers beyond the interface. The
// optional features themselves (pause, snapshots, checkpoints, logs,
// volumes) are the optional interfaces below, discovered by type assertion:
// a backend implements one only if it can do it, and a method that cannot
// serve one sandbox (e.g. a class without checkpoints) answers
// ErrNotImplemented.
type Capabilities struct {
	// Classes are the accepted Spec.Class values (the first-class flavours
	// of the backend, e.g. the installed OCI runtimes).
	Classes []string `json:"classes,omitempty"`
}

// Runtime is a sandbox backend.
type Runtime interface {
	// Name is the backend name ("oci", "docker", "kubernetes", "fake").
	Name() string
	// Capabilities describes the backend (see Capabilities).
	Capabilities() Capabilities
	// Create sets up all resources and starts the agent. It returns once the
	// agent process has been started (not necessarily listening yet). On
	// error nothing is left behind. Creating an existing ID is ErrAlreadyExists.
	Create(ctx context.Context, spec Spec) (Status, error)
	// Stop signals the agent (SIGTERM, then SIGKILL after grace). The
	// sandbox's resources stay until Delete. Stopping a stopped sandbox is a no-op.
	Stop(ctx context.Context, id string, grace time.Duration) error
	// Delete stops the sandbox if needed and frees every resource it holds
	// (processes, mounts, network namespace, address, cgroup, state). It is
	// idempotent: deleting an unknown ID returns nil, and it cleans up
	// leftovers of a half-created sandbox.
	Delete(ctx context.Context, id string) error
	// Status reports one sandbox, ErrNotFound if the backend has no trace of it.
	Status(ctx context.Context, id string) (Status, error)
	// List reports every sandbox the backend holds, including ones created
	// by an earlier server process; the server re-adopts from it.
	List(ctx context.Context) ([]Status, error)
	// Endpoint returns "host:port" at which the host (the moat server) can
	// reach the given TCP port inside the sandbox.
	Endpoint(ctx context.Context, id string, port int) (string, error)
}

// Pauser is implemented by backends that can freeze a sandbox.
type Pauser interface {
	// Pause freezes every process; it returns once they are frozen.
	Pause(ctx context.Context, id string) error
	// Resume thaws a paused sandbox.
	Resume(ctx context.Context, id string) error
}

// Snapshotter is implemented by backends whose sandboxes keep their
// writable layer in a host directory that can be committed as an image
// layer (Capabilities.Snapshot reports it).
type Snapshotter interface {
	// SnapshotDir returns the host path of the sandbox's writable layer
	// (an overlayfs upper directory). The directory stays valid until
	// Delete; the caller freezes the sandbox (Pauser) while reading it so
	// that the captured tree is consistent.
	SnapshotDir(ctx context.Context, id string) (upperDir string, err error)
}

// ImageSnapshotter is implemented by backends that commit a sandbox's
// writable layer themselves, as an image their sandboxes can be created
// from (the kubernetes backend: on the pod's node, pushed to a
// registry), where Snapshotter hands the server a host directory.
type ImageSnapshotter interface {
	// SnapshotImage commits running or paused sandbox id's writable layer
	// on top of its image as snapshot name (an ID) and returns the image
	// that Spec.Image of a sandbox created from the snapshot names. The
	// sandbox keeps its state: a running one is frozen only while its
	// layer is read. Nothing is left behind on error.
	SnapshotImage(ctx context.Context, id, name string) (image string, err error)
	// RemoveSnapshotImage deletes snapshot name's image; an unknown name
	// is not an error.
	RemoveSnapshotImage(ctx context.Context, name string) error
}

// Checkpointer is implemented by backends that can save a running
// sandbox's memory and process state and start new sandboxes from it
// (Spec.Checkpoint): a fork of running processes.
type Checkpointer interface {
	// CanCheckpoint reports whether sandboxes of class can be checkpointed.
	CanCheckpoint(class string) bool
	// Checkpoint saves the state of running sandbox id as checkpoint name
	// (an ID, see package doc). The sandbox keeps running. ErrNotImplemented
	// if its class cannot be checkpointed; ErrAlreadyExists if name is taken.
	Checkpoint(ctx context.Context, id, name string) error
	// RemoveCheckpoint deletes checkpoint name; an unknown name is not an
	// error.
	RemoveCheckpoint(ctx context.Context, name string) error
}

// Hibernation modes (Hibernator.HibernateMode).
const (
	// HibernateMemory: the sandbox's memory and process state are written
	// to disk and its processes continue where they were on wake (gVisor
	// runsc checkpoint and restore).
	HibernateMemory = "memory"
	// HibernateRestart: the writable layer stays on disk and the processes
	// are stopped; on wake the sandbox starts afresh on that layer (its
	// agent and entrypoint run again; what was only in memory is gone).
	HibernateRestart = "restart"
)

// Hibernator is implemented by backends that can hibernate a sandbox:
// stop its processes and free their memory, keeping on disk what starts
// it again in place. Status reports a hibernated sandbox StatePaused (its
// Message says hibernated), and Pauser.Resume wakes it with the same ID,
// address and files.
type Hibernator interface {
	// HibernateMode tells how sandboxes of class hibernate:
	// HibernateMemory, HibernateRestart, or "" if they cannot.
	HibernateMode(class string) string
	// Hibernate hibernates running sandbox id. A sandbox the call was
	// interrupted in (a crash) is found running or hibernated, never
	// lost. ErrNotImplemented if its class cannot hibernate,
	// ErrFailedPrecondition if it is not running.
	Hibernate(ctx context.Context, id string) (Hibernation, error)
}

// Hibernation describes what a Hibernate did.
type Hibernation struct {
	// Mode is HibernateMemory or HibernateRestart.
	Mode string
	// FreedBytes is the memory the sandbox's cgroup held before (0 if the
	// backend cannot tell).
	FreedBytes int64
	// DiskBytes is the size of the saved memory image (HibernateMemory).
	DiskBytes int64
}

// CPUReader is implemented by backends that can tell how much CPU time a
// sandbox's processes used (its cgroup's counter).
type CPUReader interface {
	// CPUUsage is the CPU time sandbox id used since it started (a
	// counter that only grows while it runs). ErrNotFound for an unknown
	// ID; ErrUnavailable when it cannot be read (a hibernated sandbox).
	CPUUsage(ctx context.Context, id string) (time.Duration, error)
}

// LogReader is implemented by backends that keep each sandbox's console
// output (the agent's and the entrypoint's stdout and stderr).
type LogReader interface {
	// Logs returns at most max bytes from the end of the sandbox's output,
	// and whether older output was left out. ErrNotFound for an unknown ID.
	Logs(ctx context.Context, id string, max int64) (data []byte, truncated bool, err error)
}

// LogTrimmer is implemented by backends whose console logs grow without a
// bound of their own; the lifecycle service calls TrimLogs periodically.
type LogTrimmer interface {
	// TrimLogs cuts every sandbox log longer than max down to its last
	// max/2 bytes.
	TrimLogs(ctx context.Context, max int64) error
}

// Volumes is implemented by backends that keep named volumes (OpenSandbox's
// runtime-neutral `pvc` backend): storage that outlives the sandboxes
// mounting it (Mount.Volume). Names follow ValidVolumeName.
type Volumes interface {
	// CreateVolume makes a volume; ErrAlreadyExists if the name is taken,
	// ErrInvalidArgument for a size the backend cannot provide.
	CreateVolume(ctx context.Context, spec VolumeSpec) (Volume, error)
	// GetVolume reports one volume; ErrNotFound if there is none.
	GetVolume(ctx context.Context, name string) (Volume, error)
	// ListVolumes reports the volumes of this backend (for a shared
	// backend, those it created).
	ListVolumes(ctx context.Context) ([]Volume, error)
	// DeleteVolume removes a volume and its data; ErrNotFound if there is
	// none, ErrFailedPrecondition while a sandbox mounts it (as far as the
	// backend can tell), ErrPermissionDenied for a volume the backend did
	// not create and will not delete.
	DeleteVolume(ctx context.Context, name string) error
}

// Pools is implemented by backends that keep warm pools of sandboxes
// themselves (the kubernetes backend: Pool resources that `moat
// controller` fills). The lifecycle service then defines its pools there,
// instead of filling pools of its own, and claims from them with Claim;
// the pools, and the sandboxes claimed from them, are shared by every
// server on the backend (the replicas of a stateless server).
type Pools interface {
	// PutPool creates pool p.Name (create set: ErrAlreadyExists if the
	// name is taken) or replaces its definition (ErrNotFound if there is
	// none).
	PutPool(ctx context.Context, p PoolSpec, create bool) error
	// GetPool reports one pool; ErrNotFound if there is none.
	GetPool(ctx context.Context, name string) (PoolSpec, PoolStatus, error)
	// ListPools reports the pools of this backend.
	ListPools(ctx context.Context) ([]PoolSpec, []PoolStatus, error)
	// DeletePool removes a pool and its idle sandboxes; claimed ones live
	// on. ErrNotFound if there is none.
	DeletePool(ctx context.Context, name string) error
	// Claim turns idle sandboxes of pool into sandboxes ids[0], ids[1], ...
	// in one durable step (fewer when the pool has fewer idle ones: the
	// result says which). From then on each is an ordinary sandbox of the
	// backend (Status, Endpoint, Delete), running, with its own agent
	// token. ErrNotFound if there is no such pool.
	//
	// record, if set, makes the caller's record of a claimed sandbox: a
	// backend that can store it in the same durable step (where the
	// caller's store reads it) does so and sets Claimed.Recorded. It may
	// be called more than once per sandbox and with the backend's locks
	// held: it must be a pure function of its argument.
	Claim(ctx context.Context, pool string, ids []string, record func(Claimed) []byte) ([]Claimed, error)
}

// PoolSpec defines a pool kept by a Pools backend.
type PoolSpec struct {
	// Name is the pool's name in the backend.
	Name string
	// Template is what the pool's sandboxes are made from; its ID and
	// AgentToken are not used (each sandbox gets a token of its own).
	Template Spec
	// The pool's capacity, with OpenSandbox's capacitySpec meaning.
	BufferMin, BufferMax, PoolMin, PoolMax int
	// Definition is the caller's own record of the pool, kept with it
	// and returned as is (nil for a pool made without one, e.g. by hand).
	Definition []byte
	// Egress (read only: the backend decides) says the pool's sandboxes
	// take a network policy when claimed (Egress.Attach), staying warm.
	Egress bool
}

// PoolStatus counts a pool's sandboxes.
type PoolStatus struct {
	Total, Allocated, Available int
	// Revision identifies the template the idle sandboxes are made from.
	Revision string
}

// Claimed is one sandbox claimed from a pool.
type Claimed struct {
	Status Status
	// AgentToken is the sandbox's agent access token.
	AgentToken string
	// Recorded says the claim stored the caller's record (Claim's record)
	// with it.
	Recorded bool
}

// Deletable is the rule every backend applies before deleting volume v:
// a volume it did not create is ErrPermissionDenied, one a sandbox mounts
// is ErrFailedPrecondition.
func (v Volume) Deletable() error {
	if !v.Managed {
		return fmt.Errorf("volume %q was not created by this moat server: %w", v.Name, errdefs.ErrPermissionDenied)
	}
	if len(v.Users) > 0 {
		return fmt.Errorf("volume %q: in use by sandbox %s: %w", v.Name, strings.Join(v.Users, ", "), errdefs.ErrFailedPrecondition)
	}
	return nil
}

// VolumeSpec describes a named volume to create.
type VolumeSpec struct {
	Name string `json:"name"`
	// SizeBytes is the capacity; 0 = the backend's default. Backends that
	// can enforce it do (see Volume.SizeBytes).
	SizeBytes int64 `json:"sizeBytes,omitempty"`
	// StorageClass and AccessModes are Kubernetes PVC settings; other
	// backends ignore them.
	StorageClass string   `json:"storageClass,omitempty"`
	AccessModes  []string `json:"accessModes,omitempty"`
	// Labels are stored with the volume.
	Labels map[string]string `json:"labels,omitempty"`
}

// Volume is what a backend knows about one named volume.
type Volume struct {
	Name string `json:"name"`
	// SizeBytes is the enforced capacity; 0 if the backend enforces none.
	SizeBytes int64 `json:"sizeBytes,omitempty"`
	// UsedBytes is the storage the volume occupies, if the backend can
	// tell (0 otherwise).
	UsedBytes int64             `json:"usedBytes,omitempty"`
	CreatedAt time.Time         `json:"createdAt"`
	Labels    map[string]string `json:"labels,omitempty"`
	// Managed reports that the backend created the volume (and so may
	// delete it); false for one that existed before (e.g. made by hand).
	Managed bool `json:"managed"`
	// Users are the sandboxes of this backend that mount the volume, as
	// far as the backend tracks them.
	Users []string `json:"users,omitempty"`
	// StorageClass and AccessModes are set by the Kubernetes backend.
	StorageClass string   `json:"storageClass,omitempty"`
	AccessModes  []string `json:"accessModes,omitempty"`
}

// ErrCheckpointMissing marks a Spec.Checkpoint (or the memory image of a
// snapshot) the backend no longer has; it comes wrapped with
// errdefs.ErrFailedPrecondition.
var ErrCheckpointMissing = errors.New("checkpoint missing")

// ErrSubPathUnsupported marks a volume subPath the backend's volume driver
// cannot mount; it comes wrapped with errdefs.ErrInvalidArgument.
var ErrSubPathUnsupported = errors.New("volume subPath not supported by the driver")

// ErrTenantNamespaceMissing marks a create for a tenant whose place on
// the backend (the kubernetes backend's tenant namespace) does not exist;
// it comes wrapped with errdefs.ErrFailedPrecondition.
var ErrTenantNamespaceMissing = errors.New("tenant namespace missing")

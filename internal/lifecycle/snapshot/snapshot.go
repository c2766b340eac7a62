// Package snapshot is the snapshots of sandboxes: it captures a Running or
// Paused sandbox's root filesystem as a local image, or as the image a
// runtime.ImageSnapshotter commits itself (the kubernetes backend's, in
// a registry), and on a runtime that checkpoints, its processes too (a
// memory snapshot); it keeps the snapshot
// records, serves the snapshot API and is the source of sandboxes created
// from a snapshot (lifecycle.Snapshots).
package snapshot

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"
	"unicode"

	"github.com/moat-sandbox/moat/internal/errdefs"
	"github.com/moat-sandbox/moat/internal/image"
	"github.com/moat-sandbox/moat/internal/lifecycle"
	"github.com/moat-sandbox/moat/internal/runtime"
	"github.com/moat-sandbox/moat/internal/store"
	"github.com/moat-sandbox/moat/internal/tenant"
)

// SnapshotBucket is the store bucket holding snapshot records.
const SnapshotBucket = "snapshots"

// Committer turns a sandbox's writable layer into an image; the server
// adapts the image store (image.Store.CommitLayer) to it.
type Committer interface {
	// Commit stores the directory upperDir (an overlayfs upper dir) as a
	// new layer on top of the local image baseRef, under the name name,
	// and returns the new image. upperDir is not modified.
	Commit(ctx context.Context, upperDir, baseRef, name string) (image.Image, error)
	// Remove deletes the image name; layers still used elsewhere stay.
	Remove(ctx context.Context, ref string) error
}

// SnapshotState is the state of a snapshot (exact OpenSandbox spellings).
type SnapshotState string

// Snapshot states.
const (
	SnapshotCreating SnapshotState = "Creating"
	SnapshotDeleting SnapshotState = "Deleting"
	SnapshotReady    SnapshotState = "Ready"
	SnapshotFailed   SnapshotState = "Failed"
)

func (s SnapshotState) String() string { return string(s) }

// Snapshot reason codes (upstream spellings).
const (
	ReasonSnapshotAccepted      = "snapshot_accepted"
	ReasonSnapshotReady         = "snapshot_ready"
	ReasonSnapshotCaptureFailed = "snapshot_capture_failed"
	ReasonSnapshotDeleting      = "snapshot_deleting"
)

// ParseSnapshotState parses a snapshot state case-insensitively.
func ParseSnapshotState(s string) (SnapshotState, error) {
	for _, st := range []SnapshotState{SnapshotCreating, SnapshotDeleting, SnapshotReady, SnapshotFailed} {
		if strings.EqualFold(s, string(st)) {
			return st, nil
		}
	}
	return "", errdefs.Invalid("SANDBOX::INVALID_PARAMETER", fmt.Sprintf("unknown snapshot state %q", s))
}

// SnapshotStatus is the observable status of a snapshot.
type SnapshotStatus struct {
	State            SnapshotState `json:"state"`
	Reason           string        `json:"reason,omitempty"`
	Message          string        `json:"message,omitempty"`
	LastTransitionAt time.Time     `json:"lastTransitionAt"`
}

// Snapshot is a captured root filesystem of a sandbox, stored as a local
// image. It is persisted in the store (bucket "snapshots") from the moment
// it is accepted.
type Snapshot struct {
	ID        string         `json:"id"`
	SandboxID string         `json:"sandboxId"`
	Name      string         `json:"name,omitempty"`
	Status    SnapshotStatus `json:"status"`
	CreatedAt time.Time      `json:"createdAt"`
	// Image is the local image holding the snapshot.
	Image string `json:"image"`
	// BaseImage is the image the source sandbox ran.
	BaseImage string `json:"baseImage,omitempty"`
	// Kind is SnapshotMemory when the snapshot holds the source's running
	// processes (a runtime checkpoint named by the snapshot ID) besides
	// its filesystem; empty for a filesystem snapshot.
	Kind string `json:"kind,omitempty"`
	// Class, Entrypoint and AgentToken are the source's (memory
	// snapshots): a restored sandbox runs that class and entrypoint, and
	// its agent starts out with that token until the server rotates it.
	// The token never leaves the server (the API types omit it).
	Class      string   `json:"class,omitempty"`
	Entrypoint []string `json:"entrypoint,omitempty"`
	AgentToken string   `json:"agentToken,omitempty"`
	// Tenant owns the snapshot: the tenant of its source sandbox (its
	// files are that tenant's data). "" in records from before tenants.
	Tenant string `json:"tenant,omitempty"`
}

// SnapshotMemory is Snapshot.Kind of a snapshot with process memory.
const SnapshotMemory = "memory"

// memorySnapshotMessage tells a memory snapshot from a filesystem one.
const memorySnapshotMessage = "memory and filesystem (gVisor checkpoint)"

// SnapshotFilter selects snapshots; empty fields match everything.
type SnapshotFilter struct {
	SandboxID string
	States    []SnapshotState // OR
}

func snapshotNotFound(id string) error {
	return errdefs.WithPublic(fmt.Errorf("snapshot %q: %w", id, errdefs.ErrNotFound),
		"SNAPSHOT::NOT_FOUND", fmt.Sprintf("snapshot %s not found", id))
}

// loadSnapshots reads the snapshot records. A snapshot that was being
// created when the server stopped is Failed: its commit did not finish.
func loadSnapshots(db store.Store, now time.Time) (map[string]*Snapshot, error) {
	recs, err := store.List[Snapshot](db, SnapshotBucket)
	if err != nil {
		return nil, fmt.Errorf("load snapshots: %w", err)
	}
	out := make(map[string]*Snapshot, len(recs))
	for i := range recs {
		sn := recs[i]
		if sn.Status.State == SnapshotCreating {
			sn.Status = SnapshotStatus{State: SnapshotFailed, Reason: ReasonSnapshotCaptureFailed,
				Message: "interrupted by a server restart", LastTransitionAt: now}
			if err := db.Put(SnapshotBucket, sn.ID, &sn); err != nil {
				return nil, err
			}
		}
		out[sn.ID] = &sn
	}
	return out, nil
}

// Snapshots is the snapshot feature. It is safe for concurrent use.
//
// mu guards snaps and the snapshots in it. Lock order: a sandbox's lock
// before mu; mu is never held while the core or a pool is called.
type Snapshots struct {
	core      *lifecycle.Service
	deps      lifecycle.Deps
	log       *slog.Logger
	committer Committer
	pools     PoolUsers

	mu    sync.Mutex
	snaps map[string]*Snapshot
}

// PoolUsers tells which pools use a snapshot as their template.
type PoolUsers interface {
	// SnapshotPools returns the names of the pools whose template is
	// snapshot id, those ctx does not see as "(another tenant's)".
	SnapshotPools(ctx context.Context, id string) []string
}

// New loads the snapshot records of core's store. committer stores the
// snapshot images (nil: snapshots are refused, 501, unless the runtime
// is a runtime.ImageSnapshotter, which stores them); pools (optional)
// keeps a snapshot a pool uses from being deleted.
func New(core *lifecycle.Service, committer Committer, pools PoolUsers) (*Snapshots, error) {
	deps := core.Deps()
	snaps, err := loadSnapshots(deps.Store, core.Now())
	if err != nil {
		return nil, err
	}
	return &Snapshots{core: core, deps: deps, log: deps.Log, committer: committer, pools: pools, snaps: snaps}, nil
}

// Source returns snapshot id as the source of a create in ctx's scope.
func (s *Snapshots) Source(ctx context.Context, id string) (lifecycle.SnapshotSource, error) {
	sn, err := s.readySnapshot(ctx, id)
	if err != nil {
		return lifecycle.SnapshotSource{}, err
	}
	return source(&sn), nil
}

// Restore returns snapshot id whatever its state and tenant.
func (s *Snapshots) Restore(id string) (lifecycle.SnapshotSource, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	sn := s.snaps[id]
	if sn == nil {
		return lifecycle.SnapshotSource{}, false
	}
	return source(sn), true
}

func source(sn *Snapshot) lifecycle.SnapshotSource {
	return lifecycle.SnapshotSource{ID: sn.ID, Image: sn.Image, Memory: sn.Kind == SnapshotMemory, Class: sn.Class,
		Entrypoint: sn.Entrypoint, AgentToken: sn.AgentToken}
}

// TenantSnapshots counts the snapshots tenant name owns.
func (s *Snapshots) TenantSnapshots(name string) int {
	name = tenant.Normalize(name)
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, sn := range s.snaps {
		if tenant.Normalize(sn.Tenant) == name {
			n++
		}
	}
	return n
}

// snapshotter is the runtime's Snapshotter; nil (and no error) for a
// runtime that commits snapshot images itself (runtime.ImageSnapshotter).
func (s *Snapshots) snapshotter() (runtime.Snapshotter, error) {
	if _, ok := s.deps.Runtime.(runtime.ImageSnapshotter); ok {
		return nil, nil
	}
	sn, ok := s.deps.Runtime.(runtime.Snapshotter)
	if !ok || s.committer == nil {
		return nil, errdefs.WithPublic(errdefs.ErrNotImplemented, "SANDBOX::API_NOT_SUPPORTED", "this runtime cannot snapshot sandboxes")
	}
	return sn, nil
}

func validSnapshotName(n string) error {
	if len(n) > 253 || strings.IndexFunc(n, unicode.IsControl) >= 0 {
		return errdefs.Invalid("SNAPSHOT::INVALID_PARAMETER", "name must be at most 253 characters without control characters")
	}
	return nil
}

// CreateSnapshot captures the root filesystem of a Running or Paused
// sandbox. The sandbox is frozen during the commit and thawed afterwards
// if it was Running.
//
// The commit runs synchronously, so the returned snapshot is normally
// already Ready. Upstream answers 202 with state Creating and clients poll
// GET /snapshots/{id} until Ready, which works unchanged. A failed commit
// is returned as an error and the snapshot stays visible as Failed.
func (s *Snapshots) CreateSnapshot(ctx context.Context, sandboxID, name string) (Snapshot, error) {
	snapper, err := s.snapshotter()
	if err != nil {
		return Snapshot{}, err
	}
	if err := validSnapshotName(name); err != nil {
		return Snapshot{}, err
	}
	var out Snapshot
	err = s.core.WithLock(ctx, sandboxID, func(e *lifecycle.Entry) error {
		out, err = s.createLocked(ctx, snapper, e, name)
		return err
	})
	return out, err
}

// createLocked is CreateSnapshot of sandbox e; the caller holds e's lock.
func (s *Snapshots) createLocked(ctx context.Context, snapper runtime.Snapshotter, e *lifecycle.Entry, name string) (Snapshot, error) {
	sb := e.Sandbox()
	sandboxID := sb.ID
	st := sb.Status.State
	if st != lifecycle.StateRunning && st != lifecycle.StatePaused {
		return Snapshot{}, errdefs.WithPublic(
			fmt.Errorf("snapshot of sandbox %s in state %s: %w", sandboxID, st, errdefs.ErrFailedPrecondition),
			"SNAPSHOT::INVALID_SOURCE_STATE", fmt.Sprintf("sandbox %s is %s; only Running or Paused sandboxes can be snapshotted", sandboxID, st))
	}
	now := s.core.Now()
	id := lifecycle.NewID()
	sn := &Snapshot{ID: id, SandboxID: sandboxID, Name: name, CreatedAt: now, Tenant: e.Owner(),
		Image: lifecycle.SnapshotImagePrefix + id, BaseImage: sb.ImageRef(),
		Status: SnapshotStatus{State: SnapshotCreating, Reason: ReasonSnapshotAccepted, LastTransitionAt: now}}
	cp := lifecycle.Checkpointer(s.deps.Runtime, sb.Class)
	if cp != nil {
		// A memory snapshot continues processes, so it needs running ones
		// (runsc checkpoints a frozen sandbox as frozen forever).
		if st != lifecycle.StateRunning {
			return Snapshot{}, errdefs.WithPublic(
				fmt.Errorf("memory snapshot of sandbox %s in state %s: %w", sandboxID, st, errdefs.ErrFailedPrecondition),
				"SNAPSHOT::INVALID_SOURCE_STATE", fmt.Sprintf("sandbox %s is %s; %s sandboxes are snapshotted with their memory and must be Running (resume it first)", sandboxID, st, sb.Class))
		}
		sn.Kind, sn.Class, sn.AgentToken = SnapshotMemory, sb.Class, sb.AgentToken
		sn.Entrypoint = append([]string(nil), sb.Entrypoint...)
	}
	if err := s.deps.Store.Put(SnapshotBucket, id, sn); err != nil {
		return Snapshot{}, fmt.Errorf("persist snapshot %s: %w", id, err)
	}
	s.mu.Lock()
	s.snaps[id] = sn
	s.mu.Unlock()

	// The commit must end in a definite state even if the client leaves.
	var cerr error
	if cp != nil {
		cerr = s.captureMemory(context.WithoutCancel(ctx), cp, sandboxID, sn)
	} else if snapper == nil {
		cerr = s.captureImage(context.WithoutCancel(ctx), sandboxID, sn)
	} else {
		cerr = s.capture(context.WithoutCancel(ctx), snapper, sandboxID, st == lifecycle.StateRunning, sn)
	}
	if errors.Is(cerr, errdefs.ErrNotImplemented) {
		// Refused as a runtime without snapshots refuses: no record.
		s.mu.Lock()
		delete(s.snaps, id)
		s.mu.Unlock()
		if err := s.deps.Store.Delete(SnapshotBucket, id); err != nil {
			s.log.Error("delete refused snapshot", "id", id, "err", err)
		}
		return Snapshot{}, cerr
	}

	s.mu.Lock()
	if cerr != nil {
		sn.Status = SnapshotStatus{State: SnapshotFailed, Reason: ReasonSnapshotCaptureFailed, Message: "the snapshot could not be captured", LastTransitionAt: s.core.Now()}
	} else {
		sn.Status = SnapshotStatus{State: SnapshotReady, Reason: ReasonSnapshotReady, LastTransitionAt: s.core.Now()}
		if sn.Kind == SnapshotMemory {
			sn.Status.Message = memorySnapshotMessage
		}
	}
	out := *sn
	s.mu.Unlock()
	if err := s.deps.Store.Put(SnapshotBucket, id, &out); err != nil {
		s.log.Error("persist snapshot", "id", id, "err", err)
		if cerr == nil {
			cerr = fmt.Errorf("persist snapshot %s: %w", id, err)
		}
	}
	if cerr != nil {
		if _, ok := errdefs.PublicOf(cerr); ok {
			return out, cerr
		}
		return out, errdefs.WithPublic(cerr, "SNAPSHOT::CAPTURE_FAILED", "the snapshot could not be captured")
	}
	return out, nil
}

// capture freezes the sandbox (if running and the runtime can), commits
// its writable layer to sn.Image and thaws it. The caller holds the
// sandbox entry.
func (s *Snapshots) capture(ctx context.Context, snapper runtime.Snapshotter, id string, running bool, sn *Snapshot) error {
	upper, err := snapper.SnapshotDir(ctx, id)
	if err != nil {
		return err
	}
	if p, ok := s.deps.Runtime.(runtime.Pauser); ok && running {
		if err := p.Pause(ctx, id); err != nil {
			return fmt.Errorf("freeze %s for snapshot: %w", id, err)
		}
		defer func() {
			if err := p.Resume(ctx, id); err != nil {
				s.log.Error("thaw after snapshot", "id", id, "err", err)
			}
		}()
	}
	if _, err := s.committer.Commit(ctx, upper, sn.BaseImage, sn.Image); err != nil {
		return fmt.Errorf("commit snapshot %s of %s: %w", sn.ID, id, err)
	}
	return nil
}

// captureImage has the runtime commit the sandbox's writable layer to an
// image of its own (runtime.ImageSnapshotter), which becomes sn.Image.
// The caller holds the sandbox entry.
func (s *Snapshots) captureImage(ctx context.Context, id string, sn *Snapshot) error {
	img, err := s.deps.Runtime.(runtime.ImageSnapshotter).SnapshotImage(ctx, id, sn.ID)
	if err == nil {
		s.mu.Lock()
		sn.Image = img
		s.mu.Unlock()
		return nil
	}
	// The runtime's words say what went wrong (e.g. which node did not
	// answer); they name no secret.
	why := err.Error()
	if p, ok := errdefs.PublicOf(err); ok {
		why = p.Message
	}
	if errors.Is(err, errdefs.ErrNotImplemented) {
		return errdefs.WithPublic(err, "SANDBOX::API_NOT_SUPPORTED", "this sandbox cannot be snapshotted: "+why)
	}
	return errdefs.WithPublic(fmt.Errorf("snapshot %s of %s: %w", sn.ID, id, err), "SNAPSHOT::CAPTURE_FAILED", "the snapshot could not be captured: "+why)
}

// captureMemory checkpoints the sandbox's processes (the runtime keeps
// the sandbox running) and records an image for the restored sandboxes'
// root filesystem: the source's image plus an empty layer, since the
// checkpoint holds the writable layer. The caller holds the entry.
func (s *Snapshots) captureMemory(ctx context.Context, cp runtime.Checkpointer, id string, sn *Snapshot) error {
	if err := cp.Checkpoint(ctx, id, sn.ID); err != nil {
		return fmt.Errorf("checkpoint %s for snapshot %s: %w", id, sn.ID, err)
	}
	empty, err := os.MkdirTemp("", "moat-snapshot-")
	if err == nil {
		defer os.Remove(empty)
		_, err = s.committer.Commit(ctx, empty, sn.BaseImage, sn.Image)
	}
	if err != nil {
		if rerr := cp.RemoveCheckpoint(ctx, sn.ID); rerr != nil {
			s.log.Error("remove checkpoint of failed snapshot", "id", sn.ID, "err", rerr)
		}
		return fmt.Errorf("commit snapshot %s of %s: %w", sn.ID, id, err)
	}
	return nil
}

// GetSnapshot returns one snapshot.
func (s *Snapshots) GetSnapshot(ctx context.Context, id string) (Snapshot, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	sn, ok := s.snaps[id]
	if !ok || !lifecycle.Visible(ctx, sn.Tenant) {
		return Snapshot{}, snapshotNotFound(id)
	}
	return *sn, nil
}

// ListSnapshots returns the matching snapshots, newest first, and the
// total count before pagination. page is 1-based.
func (s *Snapshots) ListSnapshots(ctx context.Context, f SnapshotFilter, page, pageSize int) ([]Snapshot, int) {
	s.mu.Lock()
	var out []Snapshot
	for _, sn := range s.snaps {
		if !lifecycle.Visible(ctx, sn.Tenant) {
			continue
		}
		if f.SandboxID != "" && sn.SandboxID != f.SandboxID {
			continue
		}
		if len(f.States) > 0 && !slices.Contains(f.States, sn.Status.State) {
			continue
		}
		out = append(out, *sn)
	}
	s.mu.Unlock()
	sort.Slice(out, func(i, j int) bool {
		if !out[i].CreatedAt.Equal(out[j].CreatedAt) {
			return out[i].CreatedAt.After(out[j].CreatedAt)
		}
		return out[i].ID < out[j].ID
	})
	total := len(out)
	start := (page - 1) * pageSize
	if page < 1 || pageSize < 1 || start >= total {
		return nil, total
	}
	return out[start:min(start+pageSize, total)], total
}

// readySnapshot returns snapshot id if sandboxes can be created from it
// in ctx's tenant scope.
func (s *Snapshots) readySnapshot(ctx context.Context, id string) (Snapshot, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	sn, ok := s.snaps[id]
	if !ok || !lifecycle.Visible(ctx, sn.Tenant) {
		return Snapshot{}, snapshotNotFound(id)
	}
	if sn.Status.State != SnapshotReady {
		return Snapshot{}, errdefs.WithPublic(
			fmt.Errorf("snapshot %s is %s: %w", id, sn.Status.State, errdefs.ErrFailedPrecondition),
			"SNAPSHOT::INVALID_STATE", fmt.Sprintf("snapshot %s is %s, not Ready", id, sn.Status.State))
	}
	return *sn, nil
}

// snapshotUsers returns the IDs of live sandboxes created from snapshot
// id, those ctx does not see as "(another tenant's)".
func (s *Snapshots) snapshotUsers(ctx context.Context, id string) []string {
	var users []string
	s.core.Each(func(e *lifecycle.Entry) {
		sb := e.Sandbox()
		if sb.SnapshotID == id && sb.Status.State != lifecycle.StateTerminated && sb.Status.State != lifecycle.StateFailed {
			if lifecycle.Visible(ctx, e.Owner()) {
				users = append(users, sb.ID)
			} else {
				users = append(users, "(another tenant's)")
			}
		}
	})
	sort.Strings(users)
	return users
}

func (s *Snapshots) snapshotPools(ctx context.Context, id string) []string {
	if s.pools == nil {
		return nil
	}
	return s.pools.SnapshotPools(ctx, id)
}

// DeleteSnapshot removes a snapshot and its image. It is refused
// (SNAPSHOT::IN_USE) while a sandbox created from it still exists, and
// while the snapshot is being created.
//
// A create from the snapshot that passed validation just before the
// snapshot was marked Deleting may still race with the removal; it then
// fails to find the image and ends Failed.
func (s *Snapshots) DeleteSnapshot(ctx context.Context, id string) error {
	s.mu.Lock()
	sn, ok := s.snaps[id]
	if !ok || !lifecycle.Visible(ctx, sn.Tenant) {
		s.mu.Unlock()
		return snapshotNotFound(id)
	}
	prev := sn.Status
	// Deleting is never persisted: it only marks a delete in progress.
	if prev.State == SnapshotCreating || prev.State == SnapshotDeleting {
		s.mu.Unlock()
		return errdefs.WithPublic(fmt.Errorf("snapshot %s is %s: %w", id, prev.State, errdefs.ErrFailedPrecondition),
			"SNAPSHOT::INVALID_STATE", fmt.Sprintf("snapshot %s is %s", id, prev.State))
	}
	sn.Status = SnapshotStatus{State: SnapshotDeleting, Reason: ReasonSnapshotDeleting, LastTransitionAt: s.core.Now()}
	s.mu.Unlock()

	restore := func() {
		s.mu.Lock()
		sn.Status = prev
		s.mu.Unlock()
	}
	if pools := s.snapshotPools(ctx, id); len(pools) > 0 {
		restore()
		return errdefs.WithPublic(fmt.Errorf("snapshot %s is the template of pools %v: %w", id, pools, errdefs.ErrFailedPrecondition),
			"SNAPSHOT::IN_USE", fmt.Sprintf("snapshot %s is the template of pool %s (delete the pool first)", id, strings.Join(pools, ", ")))
	}
	if users := s.snapshotUsers(ctx, id); len(users) > 0 {
		restore()
		return errdefs.WithPublic(fmt.Errorf("snapshot %s is used by %d sandboxes: %w", id, len(users), errdefs.ErrFailedPrecondition),
			"SNAPSHOT::IN_USE", fmt.Sprintf("snapshot %s is in use by sandbox %s (delete its sandboxes first)", id, strings.Join(users, ", ")))
	}
	ctx = context.WithoutCancel(ctx)
	if is, ok := s.deps.Runtime.(runtime.ImageSnapshotter); ok {
		if err := is.RemoveSnapshotImage(ctx, id); err != nil {
			restore()
			return fmt.Errorf("remove snapshot image %s: %w", sn.Image, err)
		}
	} else if s.committer != nil {
		if err := s.committer.Remove(ctx, sn.Image); err != nil && !errdefs.IsNotFound(err) {
			restore()
			return fmt.Errorf("remove snapshot image %s: %w", sn.Image, err)
		}
	}
	// Every snapshot may have a checkpoint: a failed or interrupted
	// memory snapshot can leave a partial one (removal is idempotent).
	if cp, ok := s.deps.Runtime.(runtime.Checkpointer); ok {
		if err := cp.RemoveCheckpoint(ctx, id); err != nil {
			restore()
			return fmt.Errorf("remove snapshot checkpoint %s: %w", id, err)
		}
	}
	if err := s.deps.Store.Delete(SnapshotBucket, id); err != nil {
		restore()
		return fmt.Errorf("delete snapshot record %s: %w", id, err)
	}
	s.mu.Lock()
	delete(s.snaps, id)
	s.mu.Unlock()
	return nil
}

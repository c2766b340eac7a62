package lifecycle

import (
	"context"
	"fmt"
	"os"
	"slices"
	"sort"
	"strings"
	"time"
	"unicode"

	"github.com/moat-sandbox/moat/internal/errdefs"
	"github.com/moat-sandbox/moat/internal/image"
	"github.com/moat-sandbox/moat/internal/runtime"
	"github.com/moat-sandbox/moat/internal/store"
)

// SnapshotBucket is the store bucket holding snapshot records.
const SnapshotBucket = "snapshots"

// snapshotImagePrefix names snapshot images in the image store. The
// registry host is loopback, so a lookup of a vanished snapshot image can
// never reach out of the host.
const snapshotImagePrefix = image.SnapshotRepo + ":"

// defaultSnapshotEntrypoint is the entrypoint of a sandbox restored from a
// snapshot when the request has none (as upstream).
var defaultSnapshotEntrypoint = []string{"tail", "-f", "/dev/null"}

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
	return "", errdefs.Invalid(codeInvalid, fmt.Sprintf("unknown snapshot state %q", s))
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

// imageRef is the image a sandbox's root filesystem is built from.
func imageRef(sb *Sandbox) string {
	if sb.SnapshotID != "" {
		return snapshotImagePrefix + sb.SnapshotID
	}
	return sb.Image
}

func (s *Service) snapshotter() (runtime.Snapshotter, error) {
	sn, ok := s.deps.Runtime.(runtime.Snapshotter)
	if !ok || s.deps.Committer == nil {
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
func (s *Service) CreateSnapshot(ctx context.Context, sandboxID, name string) (Snapshot, error) {
	snapper, err := s.snapshotter()
	if err != nil {
		return Snapshot{}, err
	}
	if err := validSnapshotName(name); err != nil {
		return Snapshot{}, err
	}
	e, err := s.get(ctx, sandboxID)
	if err != nil {
		return Snapshot{}, err
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	st := e.sb.Status.State
	if st != StateRunning && st != StatePaused {
		return Snapshot{}, errdefs.WithPublic(
			fmt.Errorf("snapshot of sandbox %s in state %s: %w", sandboxID, st, errdefs.ErrFailedPrecondition),
			"SNAPSHOT::INVALID_SOURCE_STATE", fmt.Sprintf("sandbox %s is %s; only Running or Paused sandboxes can be snapshotted", sandboxID, st))
	}
	now := s.now()
	id := newID()
	sn := &Snapshot{ID: id, SandboxID: sandboxID, Name: name, CreatedAt: now, Tenant: e.owner,
		Image: snapshotImagePrefix + id, BaseImage: imageRef(&e.sb),
		Status: SnapshotStatus{State: SnapshotCreating, Reason: ReasonSnapshotAccepted, LastTransitionAt: now}}
	cp := s.checkpointer(e.sb.Class)
	if cp != nil {
		// A memory snapshot continues processes, so it needs running ones
		// (runsc checkpoints a frozen sandbox as frozen forever).
		if st != StateRunning {
			return Snapshot{}, errdefs.WithPublic(
				fmt.Errorf("memory snapshot of sandbox %s in state %s: %w", sandboxID, st, errdefs.ErrFailedPrecondition),
				"SNAPSHOT::INVALID_SOURCE_STATE", fmt.Sprintf("sandbox %s is %s; %s sandboxes are snapshotted with their memory and must be Running (resume it first)", sandboxID, st, e.sb.Class))
		}
		sn.Kind, sn.Class, sn.AgentToken = SnapshotMemory, e.sb.Class, e.sb.AgentToken
		sn.Entrypoint = append([]string(nil), e.sb.Entrypoint...)
	}
	if err := s.deps.Store.Put(SnapshotBucket, id, sn); err != nil {
		return Snapshot{}, fmt.Errorf("persist snapshot %s: %w", id, err)
	}
	s.snapMu.Lock()
	s.snaps[id] = sn
	s.snapMu.Unlock()

	// The commit must end in a definite state even if the client leaves.
	var cerr error
	if cp != nil {
		cerr = s.captureMemory(context.WithoutCancel(ctx), cp, sandboxID, sn)
	} else {
		cerr = s.capture(context.WithoutCancel(ctx), snapper, sandboxID, st == StateRunning, sn)
	}

	s.snapMu.Lock()
	if cerr != nil {
		sn.Status = SnapshotStatus{State: SnapshotFailed, Reason: ReasonSnapshotCaptureFailed, Message: "the snapshot could not be captured", LastTransitionAt: s.now()}
	} else {
		sn.Status = SnapshotStatus{State: SnapshotReady, Reason: ReasonSnapshotReady, LastTransitionAt: s.now()}
		if sn.Kind == SnapshotMemory {
			sn.Status.Message = memorySnapshotMessage
		}
	}
	out := *sn
	s.snapMu.Unlock()
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
func (s *Service) capture(ctx context.Context, snapper runtime.Snapshotter, id string, running bool, sn *Snapshot) error {
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
	if _, err := s.deps.Committer.Commit(ctx, upper, sn.BaseImage, sn.Image); err != nil {
		return fmt.Errorf("commit snapshot %s of %s: %w", sn.ID, id, err)
	}
	return nil
}

// checkpointer returns the runtime's Checkpointer if it can checkpoint
// sandboxes of class, else nil.
func (s *Service) checkpointer(class string) runtime.Checkpointer {
	cp, ok := s.deps.Runtime.(runtime.Checkpointer)
	if !ok || !cp.CanCheckpoint(class) {
		return nil
	}
	return cp
}

// captureMemory checkpoints the sandbox's processes (the runtime keeps
// the sandbox running) and records an image for the restored sandboxes'
// root filesystem: the source's image plus an empty layer, since the
// checkpoint holds the writable layer. The caller holds the entry.
func (s *Service) captureMemory(ctx context.Context, cp runtime.Checkpointer, id string, sn *Snapshot) error {
	if err := cp.Checkpoint(ctx, id, sn.ID); err != nil {
		return fmt.Errorf("checkpoint %s for snapshot %s: %w", id, sn.ID, err)
	}
	empty, err := os.MkdirTemp("", "moat-snapshot-")
	if err == nil {
		defer os.Remove(empty)
		_, err = s.deps.Committer.Commit(ctx, empty, sn.BaseImage, sn.Image)
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
func (s *Service) GetSnapshot(ctx context.Context, id string) (Snapshot, error) {
	s.snapMu.Lock()
	defer s.snapMu.Unlock()
	sn, ok := s.snaps[id]
	if !ok || !visible(ctx, sn.Tenant) {
		return Snapshot{}, snapshotNotFound(id)
	}
	return *sn, nil
}

// ListSnapshots returns the matching snapshots, newest first, and the
// total count before pagination. page is 1-based.
func (s *Service) ListSnapshots(ctx context.Context, f SnapshotFilter, page, pageSize int) ([]Snapshot, int) {
	s.snapMu.Lock()
	var out []Snapshot
	for _, sn := range s.snaps {
		if !visible(ctx, sn.Tenant) {
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
	s.snapMu.Unlock()
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
func (s *Service) readySnapshot(ctx context.Context, id string) (Snapshot, error) {
	s.snapMu.Lock()
	defer s.snapMu.Unlock()
	sn, ok := s.snaps[id]
	if !ok || !visible(ctx, sn.Tenant) {
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
func (s *Service) snapshotUsers(ctx context.Context, id string) []string {
	s.mu.RLock()
	entries := make([]*entry, 0, len(s.sandboxes))
	for _, e := range s.sandboxes {
		entries = append(entries, e)
	}
	s.mu.RUnlock()
	var users []string
	for _, e := range entries {
		e.mu.Lock()
		if e.sb.SnapshotID == id && !isTerminal(e.sb.Status.State) {
			if visible(ctx, e.owner) {
				users = append(users, e.sb.ID)
			} else {
				users = append(users, "(another tenant's)")
			}
		}
		e.mu.Unlock()
	}
	sort.Strings(users)
	return users
}

// snapshotPools returns the names of pools whose template is snapshot
// id, those ctx does not see as "(another tenant's)".
func (s *Service) snapshotPools(ctx context.Context, id string) []string {
	s.poolsMu.Lock()
	pls := make([]*pool, 0, len(s.pools))
	for _, pl := range s.pools {
		pls = append(pls, pl)
	}
	s.poolsMu.Unlock()
	var names []string
	for _, pl := range pls {
		pl.mu.Lock()
		if pl.def.Template.SnapshotID == id && !pl.deleted {
			if visible(ctx, pl.owner) {
				names = append(names, pl.def.Name)
			} else {
				names = append(names, "(another tenant's)")
			}
		}
		pl.mu.Unlock()
	}
	sort.Strings(names)
	return names
}

// DeleteSnapshot removes a snapshot and its image. It is refused
// (SNAPSHOT::IN_USE) while a sandbox created from it still exists, and
// while the snapshot is being created.
//
// A create from the snapshot that passed validation just before the
// snapshot was marked Deleting may still race with the removal; it then
// fails to find the image and ends Failed.
func (s *Service) DeleteSnapshot(ctx context.Context, id string) error {
	s.snapMu.Lock()
	sn, ok := s.snaps[id]
	if !ok || !visible(ctx, sn.Tenant) {
		s.snapMu.Unlock()
		return snapshotNotFound(id)
	}
	prev := sn.Status
	// Deleting is never persisted: it only marks a delete in progress.
	if prev.State == SnapshotCreating || prev.State == SnapshotDeleting {
		s.snapMu.Unlock()
		return errdefs.WithPublic(fmt.Errorf("snapshot %s is %s: %w", id, prev.State, errdefs.ErrFailedPrecondition),
			"SNAPSHOT::INVALID_STATE", fmt.Sprintf("snapshot %s is %s", id, prev.State))
	}
	sn.Status = SnapshotStatus{State: SnapshotDeleting, Reason: ReasonSnapshotDeleting, LastTransitionAt: s.now()}
	s.snapMu.Unlock()

	restore := func() {
		s.snapMu.Lock()
		sn.Status = prev
		s.snapMu.Unlock()
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
	if s.deps.Committer != nil {
		if err := s.deps.Committer.Remove(ctx, sn.Image); err != nil && !errdefs.IsNotFound(err) {
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
	s.snapMu.Lock()
	delete(s.snaps, id)
	s.snapMu.Unlock()
	return nil
}

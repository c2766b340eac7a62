// Package fork is the fork of a running sandbox into N children in one
// call: it snapshots the source through the snapshot feature (its files
// on every class; its memory too where the runtime checkpoints: runsc),
// creates the children from that snapshot through the core with their
// own overrides, gives each child its own identity (hygiene.go) and
// tracks the work as an operation persisted in the store (bucket
// "operations"), so that a client polls it and a restarted server
// reconciles it.
//
// A fork is all or nothing, like a batch: if a child fails, every child
// made so far is deleted and the operation is Failed. A server killed
// mid-fork finds the operation Running on start (Reconcile): the
// children that were made are deleted (the core already removed the
// half-made ones, which have no record), and the operation is Failed
// with the reason. The source is never touched beyond the snapshot.
package fork

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"maps"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/moat-sandbox/moat/internal/errdefs"
	"github.com/moat-sandbox/moat/internal/lifecycle"
	"github.com/moat-sandbox/moat/internal/lifecycle/snapshot"
	"github.com/moat-sandbox/moat/internal/store"
)

// Bucket is the store bucket holding operation records.
const Bucket = "operations"

// MaxCount is the largest fork.
const MaxCount = 100

// ExtOperation is the extension key that marks a child with the
// operation that made it (so a restarted server finds every child of an
// interrupted fork, recorded in the operation or not).
const ExtOperation = "moat.fork.operation"

// Retention is how long a finished operation stays readable.
const Retention = 24 * time.Hour

// concurrency bounds the children created at a time.
const concurrency = 8

// State is the state of an operation.
type State string

// Operation states.
const (
	StateRunning   State = "Running"
	StateSucceeded State = "Succeeded"
	StateFailed    State = "Failed"
)

// Error is why an operation failed, in the API's error shape.
type Error struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

// Child is one sandbox a fork made.
type Child struct {
	ID string `json:"id"`
	// Hostname and MachineID are the child's own identity (hygiene.go).
	Hostname  string `json:"hostname,omitempty"`
	MachineID string `json:"machineId,omitempty"`
}

// Operation is one fork, persisted from the moment it is accepted.
type Operation struct {
	ID         string    `json:"id"`
	Kind       string    `json:"kind"`
	Tenant     string    `json:"tenant,omitempty"`
	SourceID   string    `json:"sourceId"`
	SnapshotID string    `json:"snapshotId,omitempty"`
	Count      int       `json:"count"`
	State      State     `json:"state"`
	Error      *Error    `json:"error,omitempty"`
	Children   []Child   `json:"children"`
	CreatedAt  time.Time `json:"createdAt"`
	UpdatedAt  time.Time `json:"updatedAt"`
	// Memory is set when the children continue the source's processes
	// (a memory snapshot), not only its files.
	Memory bool `json:"memory,omitempty"`
}

// KindFork is Operation.Kind of a fork.
const KindFork = "fork"

func (op *Operation) done() bool { return op.State != StateRunning }

// Override is what a child changes from its source; zero fields keep the
// source's value.
type Override struct {
	// Env is merged over the source's env (memory children: applied
	// through the agent, as for a claim).
	Env map[string]string
	// Metadata is merged over the source's metadata.
	Metadata map[string]string
	// Timeout is the child's lifetime; 0 keeps the source's expiry.
	Timeout time.Duration
	// NetworkPolicy is the raw networkPolicy JSON of the child; nil
	// copies the source's policy.
	NetworkPolicy []byte
}

// Request is a fork of one source into Count children.
type Request struct {
	Count int
	// All applies to every child; Children[i] (optional, at most Count)
	// to child i, over All.
	All      Override
	Children []Override
	// CopyCredentialVault copies the source's Credential Vault
	// (credentials and bindings) into every child; by default a child's
	// vault starts empty.
	CopyCredentialVault bool
}

// VaultCopier copies a sandbox's Credential Vault into another's (the
// credvault feature).
type VaultCopier interface {
	CopyVault(ctx context.Context, from, to string) error
}

// Creator makes a sandbox (the core's Create) and deletes one.
type Creator interface {
	Create(ctx context.Context, req lifecycle.CreateRequest) (lifecycle.Sandbox, error)
	Delete(ctx context.Context, id string) error
}

// Snapshotter captures the source (the snapshot feature) and removes the
// fork's snapshot once no child uses it.
type Snapshotter interface {
	CreateSnapshot(ctx context.Context, sandboxID, name string) (snapshot.Snapshot, error)
	DeleteSnapshot(ctx context.Context, id string) error
}

// Forks is the fork feature. It is safe for concurrent use; mu guards
// ops and the operations in it, and is never held while the core is
// called.
type Forks struct {
	core    *lifecycle.Service
	creator Creator
	snaps   Snapshotter
	hygiene Hygiene
	db      store.Store
	log     *slog.Logger
	// Vaults copies vaults for CopyCredentialVault (nil: refused).
	Vaults VaultCopier

	mu  sync.Mutex
	ops map[string]*Operation
	wg  sync.WaitGroup
}

// New returns the fork feature of core: children are made by creator
// from snapshots of snaps, and given their identity by hygiene (nil:
// AgentHygiene). Call Reconcile after the core's Recover.
func New(core *lifecycle.Service, creator Creator, snaps Snapshotter, hygiene Hygiene) *Forks {
	d := core.Deps()
	if hygiene == nil {
		hygiene = AgentHygiene{Deps: d}
	}
	return &Forks{core: core, creator: creator, snaps: snaps, hygiene: hygiene, db: d.Store, log: d.Log, ops: map[string]*Operation{}}
}

func operationNotFound(id string) error {
	return errdefs.WithPublic(fmt.Errorf("operation %q: %w", id, errdefs.ErrNotFound),
		"OPERATION::NOT_FOUND", fmt.Sprintf("operation %s not found", id))
}

// Reconcile loads the operations after a restart. An operation that was
// Running when the server stopped is Failed, and the children it made
// are deleted (a fork is all or nothing); finished operations past
// Retention are forgotten. Call it after the core recovered its
// sandboxes.
func (f *Forks) Reconcile(ctx context.Context) error {
	recs, err := store.List[Operation](f.db, Bucket)
	if err != nil {
		return fmt.Errorf("load operations: %w", err)
	}
	now := f.core.Now()
	for i := range recs {
		op := recs[i]
		if op.done() && now.Sub(op.UpdatedAt) > Retention {
			if err := f.db.Delete(Bucket, op.ID); err != nil {
				return err
			}
			continue
		}
		if !op.done() {
			n := f.removeChildren(ctx, op.ID)
			op.Children = nil
			op.State, op.UpdatedAt = StateFailed, now
			op.Error = &Error{Code: "OPERATION::INTERRUPTED", Message: fmt.Sprintf(
				"the server stopped during the fork; the %d children it had made were deleted", n)}
			if err := f.db.Put(Bucket, op.ID, &op); err != nil {
				return err
			}
			f.dropSnapshot(ctx, op.SnapshotID)
		}
		f.ops[op.ID] = &op
	}
	return nil
}

// removeChildren deletes every sandbox marked with operation id and
// returns how many there were.
func (f *Forks) removeChildren(ctx context.Context, id string) int {
	var ids []string
	f.core.Each(func(e *lifecycle.Entry) {
		if e.Sandbox().Extensions[ExtOperation] == id {
			ids = append(ids, e.ID())
		}
	})
	for _, c := range ids {
		if err := f.creator.Delete(ctx, c); err != nil && !errdefs.IsNotFound(err) {
			f.log.Error("fork: delete the child of an unfinished fork", "operation", id, "child", c, "err", err)
		}
	}
	return len(ids)
}

// dropSnapshot deletes the fork's snapshot if no child uses it any more
// (refusals are expected while children live: they keep it).
func (f *Forks) dropSnapshot(ctx context.Context, id string) {
	if id == "" {
		return
	}
	if err := f.snaps.DeleteSnapshot(context.WithoutCancel(ctx), id); err != nil && !errdefs.IsNotFound(err) && !errdefs.IsFailedPrecondition(err) {
		f.log.Error("fork: delete the fork's snapshot", "snapshot", id, "err", err)
	}
}

// Wait waits for the forks in flight (tests; shutdown).
func (f *Forks) Wait() { f.wg.Wait() }

// Get returns operation id if ctx's tenant sees it.
func (f *Forks) Get(ctx context.Context, id string) (Operation, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	op := f.ops[id]
	if op == nil || !lifecycle.Visible(ctx, op.Tenant) {
		return Operation{}, operationNotFound(id)
	}
	return clone(op), nil
}

func clone(op *Operation) Operation {
	c := *op
	c.Children = append([]Child{}, op.Children...)
	if op.Error != nil {
		e := *op.Error
		c.Error = &e
	}
	return c
}

// source is what children copy from the source sandbox.
type source struct {
	sb lifecycle.Sandbox
}

// Fork validates req, snapshots sandbox id and starts making the
// children in the background. It returns the Running operation; the
// source keeps running (frozen only while its snapshot is taken).
func (f *Forks) Fork(ctx context.Context, id string, req Request) (Operation, error) {
	var src source
	err := f.core.WithLock(ctx, id, func(e *lifecycle.Entry) error {
		src.sb = e.Sandbox().Clone()
		return nil
	})
	if err != nil {
		return Operation{}, err
	}
	if req.Count < 1 || req.Count > MaxCount {
		return Operation{}, errdefs.Invalid("SANDBOX::INVALID_PARAMETER", fmt.Sprintf("count must be between 1 and %d", MaxCount))
	}
	if len(req.Children) > req.Count {
		return Operation{}, errdefs.Invalid("SANDBOX::INVALID_PARAMETER", fmt.Sprintf("children has %d entries, more than count (%d)", len(req.Children), req.Count))
	}
	if st := src.sb.Status.State; st != lifecycle.StateRunning {
		return Operation{}, errdefs.WithPublic(
			fmt.Errorf("fork of sandbox %s in state %s: %w", id, st, errdefs.ErrFailedPrecondition),
			"SANDBOX::INVALID_STATE", fmt.Sprintf("sandbox %s is %s; only a Running sandbox can be forked (resume it first)", id, st))
	}
	if len(src.sb.Mounts) > 0 || len(src.sb.Claims) > 0 {
		return Operation{}, errdefs.Invalid("SANDBOX::INVALID_PARAMETER",
			fmt.Sprintf("sandbox %s mounts volumes, which a fork cannot share or copy", id))
	}
	if req.CopyCredentialVault && (src.sb.CredentialProxy == nil || f.Vaults == nil) {
		return Operation{}, errdefs.Invalid("SANDBOX::INVALID_PARAMETER",
			fmt.Sprintf("copyCredentialVault: sandbox %s has no credential proxy", id))
	}
	if src.sb.CredentialProxy != nil && lifecycle.Checkpointer(f.core.Deps().Runtime, src.sb.Class) != nil {
		return Operation{}, errdefs.Invalid("SANDBOX::INVALID_PARAMETER",
			fmt.Sprintf("sandbox %s has a credential proxy and forks with its memory, which restores without the children's own CAs", id))
	}
	reqs := make([]lifecycle.CreateRequest, req.Count)
	for i := range reqs {
		o := req.All
		if i < len(req.Children) {
			o = merge(o, req.Children[i])
		}
		if reqs[i], err = src.child(o, f.core.Now()); err != nil {
			if i < len(req.Children) {
				return Operation{}, errdefs.Invalid("SANDBOX::INVALID_PARAMETER", fmt.Sprintf("children[%d]: %s", i, lifecycle.PublicCause(err)))
			}
			return Operation{}, err
		}
	}
	// Check every child's request before anything is made (a bad env
	// name in child 7 fails the call, not the operation).
	var res lifecycle.Sandbox
	for i := range reqs {
		r := reqs[i]
		r.SnapshotID, r.Image = "", "moat.fork/validate"
		if len(r.Entrypoint) == 0 {
			r.Entrypoint = []string{"true"}
		}
		if res, err = f.core.Validate(ctx, r); err != nil {
			return Operation{}, err
		}
	}
	// The whole fork must fit the tenant's quota (each child is still
	// charged on its own when it is made).
	if err := f.core.Quota().Check(lifecycle.OwnerOf(ctx), req.Count, res.Resources.CPUMillis, res.Resources.MemoryBytes); err != nil {
		return Operation{}, err
	}
	now := f.core.Now()
	op := &Operation{ID: lifecycle.NewID(), Kind: KindFork, Tenant: lifecycle.OwnerOf(ctx), SourceID: id,
		Count: req.Count, State: StateRunning, Children: []Child{}, CreatedAt: now, UpdatedAt: now}
	if err := f.db.Put(Bucket, op.ID, op); err != nil {
		return Operation{}, fmt.Errorf("persist operation %s: %w", op.ID, err)
	}
	sn, err := f.snaps.CreateSnapshot(ctx, id, "fork "+op.ID)
	if err != nil {
		if derr := f.db.Delete(Bucket, op.ID); derr != nil {
			f.log.Error("fork: delete the operation of a failed snapshot", "operation", op.ID, "err", derr)
		}
		if sn.ID != "" {
			f.dropSnapshot(ctx, sn.ID)
		}
		return Operation{}, err
	}
	op.SnapshotID, op.Memory = sn.ID, sn.Kind == snapshot.SnapshotMemory
	if err := f.db.Put(Bucket, op.ID, op); err != nil {
		f.dropSnapshot(ctx, sn.ID)
		return Operation{}, fmt.Errorf("persist operation %s: %w", op.ID, err)
	}
	for i := range reqs {
		reqs[i].SnapshotID = sn.ID
		reqs[i].Extensions[ExtOperation] = op.ID
		if op.Memory {
			// A restored child runs the source's processes and entrypoint.
			reqs[i].Entrypoint = nil
		}
	}
	f.mu.Lock()
	f.ops[op.ID] = op
	out := clone(op)
	f.mu.Unlock()
	f.wg.Add(1)
	go func() {
		defer f.wg.Done()
		f.run(context.WithoutCancel(ctx), op, reqs, req.CopyCredentialVault)
	}()
	return out, nil
}

// merge lays b over a.
func merge(a, b Override) Override {
	out := Override{Env: mergeMaps(a.Env, b.Env), Metadata: mergeMaps(a.Metadata, b.Metadata), Timeout: a.Timeout, NetworkPolicy: a.NetworkPolicy}
	if b.Timeout != 0 {
		out.Timeout = b.Timeout
	}
	if b.NetworkPolicy != nil {
		out.NetworkPolicy = b.NetworkPolicy
	}
	return out
}

func mergeMaps(a, b map[string]string) map[string]string {
	if len(a) == 0 && len(b) == 0 {
		return nil
	}
	out := make(map[string]string, len(a)+len(b))
	maps.Copy(out, a)
	maps.Copy(out, b)
	return out
}

// child is the create request of a child with override o.
func (s source) child(o Override, now time.Time) (lifecycle.CreateRequest, error) {
	sb := s.sb
	r := lifecycle.CreateRequest{
		Entrypoint:      append([]string(nil), sb.Entrypoint...),
		Env:             mergeMaps(sb.Env, o.Env),
		Metadata:        mergeMaps(sb.Metadata, o.Metadata),
		ResourceLimits:  maps.Clone(sb.ResourceLimits),
		Extensions:      map[string]string{},
		Platform:        sb.Platform,
		NetworkPolicy:   o.NetworkPolicy,
		CredentialProxy: sb.CredentialProxy != nil,
		SecureAccess:    sb.AccessToken != "",
		Timeout:         o.Timeout,
	}
	for k, v := range sb.Extensions {
		// The pool and template a source came from are not the child's.
		if k != lifecycle.ExtPoolRef && k != lifecycle.ExtTemplate && k != ExtOperation {
			r.Extensions[k] = v
		}
	}
	if sb.Class != "" {
		r.Extensions[lifecycle.ExtRuntimeClass] = sb.Class
	}
	if r.NetworkPolicy == nil && sb.NetworkPolicy != nil {
		b, err := json.Marshal(sb.NetworkPolicy)
		if err != nil {
			return r, fmt.Errorf("copy the network policy of %s: %w", sb.ID, err)
		}
		r.NetworkPolicy = b
	}
	if r.Timeout == 0 && sb.ExpiresAt != nil {
		// The child expires when its source does (at least a second on).
		r.Timeout = max(sb.ExpiresAt.Sub(now).Round(time.Second), time.Second)
		r.ShortTimeout = true
	}
	return r, nil
}

// run makes the children of op, all or nothing, and ends op.
func (f *Forks) run(ctx context.Context, op *Operation, reqs []lifecycle.CreateRequest, copyVault bool) {
	children := make([]Child, len(reqs))
	errs := make([]error, len(reqs))
	sem := make(chan struct{}, concurrency)
	var wg sync.WaitGroup
	for i := range reqs {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			children[i], errs[i] = f.makeChild(ctx, op, reqs[i], copyVault)
		}()
	}
	wg.Wait()
	var first error
	for _, err := range errs {
		if err != nil {
			first = err
			break
		}
	}
	if first != nil {
		// Clean up before the operation says Failed, so that a client
		// that sees Failed sees no child.
		f.log.Warn("fork failed", "operation", op.ID, "source", op.SourceID, "err", first)
		for _, c := range children {
			if c.ID != "" {
				if err := f.creator.Delete(ctx, c.ID); err != nil && !errdefs.IsNotFound(err) {
					f.log.Error("fork: delete a child of a failed fork", "child", c.ID, "err", err)
				}
			}
		}
		f.removeChildren(ctx, op.ID)
		f.dropSnapshot(ctx, op.SnapshotID)
	}
	f.mu.Lock()
	op.UpdatedAt = f.core.Now()
	if first != nil {
		op.State = StateFailed
		code, msg := "SANDBOX::FORK_FAILED", "a child of the fork could not be made"
		if p, ok := errdefs.PublicOf(first); ok {
			code, msg = p.Code, p.Message
		}
		op.Error = &Error{Code: code, Message: msg}
	} else {
		op.State = StateSucceeded
		op.Children = children
	}
	rec := clone(op)
	f.mu.Unlock()
	if err := f.db.Put(Bucket, op.ID, &rec); err != nil {
		f.log.Error("persist operation", "operation", op.ID, "err", err)
	}
}

// makeChild creates one child and gives it its identity.
func (f *Forks) makeChild(ctx context.Context, op *Operation, req lifecycle.CreateRequest, copyVault bool) (Child, error) {
	sb, err := f.creator.Create(ctx, req)
	c := Child{ID: sb.ID}
	if err != nil {
		return c, err
	}
	if copyVault {
		if err := f.Vaults.CopyVault(ctx, op.SourceID, sb.ID); err != nil {
			if _, ok := errdefs.PublicOf(err); ok {
				return c, err
			}
			return c, errdefs.WithPublic(err, "SANDBOX::FORK_FAILED", fmt.Sprintf("the source's credential vault could not be copied to child %s", sb.ID))
		}
	}
	id, err := f.hygiene.Apply(ctx, sb, op.Memory)
	if err != nil {
		return c, errdefs.WithPublic(err, "SANDBOX::FORK_FAILED", fmt.Sprintf("child %s could not be given its own identity", sb.ID))
	}
	c.Hostname, c.MachineID = id.Hostname, id.MachineID
	return c, nil
}

// Sweep forgets operations finished more than Retention ago, and deletes
// the snapshots of finished forks once none of their children is left.
func (f *Forks) Sweep(ctx context.Context) {
	now := f.core.Now()
	var old []string
	var snaps []string
	f.mu.Lock()
	for id, op := range f.ops {
		switch {
		case op.done() && now.Sub(op.UpdatedAt) > Retention:
			old = append(old, id)
			delete(f.ops, id)
			if op.SnapshotID != "" {
				snaps = append(snaps, op.SnapshotID)
			}
		case op.done() && op.SnapshotID != "":
			snaps = append(snaps, op.SnapshotID)
		}
	}
	f.mu.Unlock()
	sort.Strings(old)
	for _, id := range old {
		if err := f.db.Delete(Bucket, id); err != nil {
			f.log.Error("fork: forget an old operation", "operation", id, "err", err)
		}
	}
	for _, id := range snaps {
		if strings.TrimSpace(id) != "" && !f.childrenLive(id) {
			f.dropSnapshot(ctx, id)
		}
	}
}

// childrenLive reports whether a live sandbox uses snapshot id.
func (f *Forks) childrenLive(id string) bool {
	live := false
	f.core.Each(func(e *lifecycle.Entry) {
		sb := e.Sandbox()
		if sb.SnapshotID == id && sb.Status.State != lifecycle.StateTerminated && sb.Status.State != lifecycle.StateFailed {
			live = true
		}
	})
	return live
}

// Run sweeps every interval until ctx is done.
func (f *Forks) Run(ctx context.Context, interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			f.Sweep(ctx)
		}
	}
}

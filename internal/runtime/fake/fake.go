// Package fake is an in-memory sandbox backend for unit tests of the
// lifecycle service and for `moat serve --runtime fake` (a server without
// processes, for console and SDK work). It starts no processes: each
// running sandbox is an HTTP server on loopback (agentServer) that answers
// the agent protocol with the stand-in agent of package fakeagent, so
// Endpoint(id, agentproto.Port) behaves like a real agent endpoint.
//
// It passes the runtimetest conformance suite. Tests can inject failures
// with the function fields of Hooks.
package fake

import (
	"context"
	"fmt"
	"maps"
	"os"
	"slices"
	"sync"
	"time"

	"github.com/moat-sandbox/moat/internal/agentproto"
	"github.com/moat-sandbox/moat/internal/errdefs"
	"github.com/moat-sandbox/moat/internal/runtime"
	"github.com/moat-sandbox/moat/internal/runtime/fake/fakeagent"
)

// Class is the only Spec.Class the fake accepts (besides "").
const Class = "fake"

// Hooks let tests inject behaviour. A nil field does nothing; a non-nil
// error aborts the operation with that error (nothing is changed).
type Hooks struct {
	Create func(spec runtime.Spec) error
	Stop   func(id string) error
	Delete func(id string) error
}

// Runtime is the fake backend. Its methods are safe for concurrent use.
type Runtime struct {
	st    *state
	hooks Hooks

	exitMu  sync.Mutex
	exitFns []func(runtime.Exit) // NotifyExits subscribers (exitMu)
}

// state is shared by every instance made with Reopen, like the disk of a
// real backend survives a server restart.
type state struct {
	mu        sync.Mutex
	sandboxes map[string]*sandbox
	// checkpointable enables runtime.Checkpointer (SetCheckpointable);
	// checkpoints maps a checkpoint name to the source's agent token.
	checkpointable bool
	checkpoints    map[string]string
	// agentVersion is the protocol version new agents claim (0: the
	// current one; see SetAgentVersion).
	agentVersion int
	// volumes are the named volumes (runtime.Volumes).
	volumes map[string]runtime.Volume
}

type sandbox struct {
	spec    runtime.Spec
	upper   string // SnapshotDir, made on first use
	status  runtime.Status
	srv     *agentServer
	agent   *fakeagent.Agent
	paused  bool
	created time.Time
}

var (
	_ runtime.Runtime      = (*Runtime)(nil)
	_ runtime.Pauser       = (*Runtime)(nil)
	_ runtime.Snapshotter  = (*Runtime)(nil)
	_ runtime.Checkpointer = (*Runtime)(nil)
	_ runtime.Volumes      = (*Runtime)(nil)
	_ runtime.ExitNotifier = (*Runtime)(nil)
)

// New returns an empty fake backend.
func New(hooks Hooks) *Runtime {
	return &Runtime{st: &state{sandboxes: map[string]*sandbox{}, volumes: map[string]runtime.Volume{}}, hooks: hooks}
}

// Reopen returns a second instance over the same sandboxes, simulating a
// server restart.
func (r *Runtime) Reopen(hooks Hooks) *Runtime {
	return &Runtime{st: r.st, hooks: hooks}
}

// Close stops every agent server (sandboxes are forgotten).
func (r *Runtime) Close() error {
	r.st.mu.Lock()
	defer r.st.mu.Unlock()
	for id, sb := range r.st.sandboxes {
		if sb.srv != nil {
			sb.srv.Close()
		}
		if sb.upper != "" {
			os.RemoveAll(sb.upper)
		}
		delete(r.st.sandboxes, id)
	}
	return nil
}

// Name implements runtime.Runtime.
func (r *Runtime) Name() string { return "fake" }

// Capabilities implements runtime.Runtime.
func (r *Runtime) Capabilities() runtime.Capabilities {
	return runtime.Capabilities{Classes: []string{Class}}
}

// validate checks spec: the common rules (runtime.Spec.Validate) and the
// fake's one class.
func validate(spec *runtime.Spec) error {
	if err := spec.Validate(); err != nil {
		return err
	}
	if spec.Class != "" && spec.Class != Class {
		return runtime.Invalid("runtime class %q is not available", spec.Class)
	}
	spec.Class = Class
	return nil
}

// AgentState reports a sandbox's agent token and the env it was given
// through POST /moat/v1/env.
func (r *Runtime) AgentState(id string) (token string, env map[string]string, err error) {
	r.st.mu.Lock()
	sb, err := r.get(id)
	r.st.mu.Unlock()
	if err != nil {
		return "", nil, err
	}
	return sb.agent.Token(), sb.agent.Env(), nil
}

// SetAgentVersion makes the agents of sandboxes created from now on claim
// protocol version v (agentproto), e.g. 1 for agents from before
// versioning; 0 restores the current version.
func (r *Runtime) SetAgentVersion(v int) {
	r.st.mu.Lock()
	defer r.st.mu.Unlock()
	r.st.agentVersion = v
}

// SetCheckpointable turns runtime.Checkpointer support on or off (off by
// default, like a backend without it).
func (r *Runtime) SetCheckpointable(on bool) {
	r.st.mu.Lock()
	defer r.st.mu.Unlock()
	r.st.checkpointable = on
}

// CanCheckpoint implements runtime.Checkpointer.
func (r *Runtime) CanCheckpoint(class string) bool {
	r.st.mu.Lock()
	defer r.st.mu.Unlock()
	return r.st.checkpointable && (class == "" || class == Class)
}

// Checkpoint implements runtime.Checkpointer: it remembers the source's
// agent token, which a restored agent starts with.
func (r *Runtime) Checkpoint(ctx context.Context, id, name string) error {
	r.st.mu.Lock()
	defer r.st.mu.Unlock()
	if !r.st.checkpointable {
		return fmt.Errorf("fake: checkpoint: %w", errdefs.ErrNotImplemented)
	}
	sb, err := r.get(id)
	if err != nil {
		return err
	}
	if sb.status.State != runtime.StateRunning {
		return fmt.Errorf("fake: checkpoint of %s sandbox: %w", sb.status.State, errdefs.ErrFailedPrecondition)
	}
	if _, ok := r.st.checkpoints[name]; ok {
		return fmt.Errorf("checkpoint %q: %w", name, errdefs.ErrAlreadyExists)
	}
	if r.st.checkpoints == nil {
		r.st.checkpoints = map[string]string{}
	}
	r.st.checkpoints[name] = sb.agent.Token()
	return nil
}

// RemoveCheckpoint implements runtime.Checkpointer.
func (r *Runtime) RemoveCheckpoint(ctx context.Context, name string) error {
	r.st.mu.Lock()
	defer r.st.mu.Unlock()
	delete(r.st.checkpoints, name)
	return nil
}

// HasCheckpoint reports whether checkpoint name exists.
func (r *Runtime) HasCheckpoint(name string) bool {
	r.st.mu.Lock()
	defer r.st.mu.Unlock()
	_, ok := r.st.checkpoints[name]
	return ok
}

// Create implements runtime.Runtime.
func (r *Runtime) Create(ctx context.Context, spec runtime.Spec) (runtime.Status, error) {
	if err := validate(&spec); err != nil {
		return runtime.Status{}, err
	}
	if r.hooks.Create != nil {
		if err := r.hooks.Create(spec); err != nil {
			return runtime.Status{}, err
		}
	}
	r.st.mu.Lock()
	defer r.st.mu.Unlock()
	if _, ok := r.st.sandboxes[spec.ID]; ok {
		return runtime.Status{}, fmt.Errorf("sandbox %q: %w", spec.ID, errdefs.ErrAlreadyExists)
	}
	for _, m := range spec.Mounts {
		if m.Volume == "" {
			continue
		}
		if _, ok := r.st.volumes[m.Volume]; !ok {
			return runtime.Status{}, fmt.Errorf("volume %q: %w", m.Volume, errdefs.ErrNotFound)
		}
	}
	token := spec.AgentToken
	if spec.Checkpoint != "" {
		tok, ok := r.st.checkpoints[spec.Checkpoint]
		if !ok {
			return runtime.Status{}, fmt.Errorf("checkpoint %q: %w", spec.Checkpoint, errdefs.ErrFailedPrecondition)
		}
		token = tok
	}
	agent := fakeagent.New(token)
	agent.Version = r.st.agentVersion
	srv, err := serveAgent(agent)
	if err != nil {
		return runtime.Status{}, fmt.Errorf("sandbox %q: agent: %w", spec.ID, err)
	}
	sb := &sandbox{spec: spec, srv: srv, agent: agent, created: time.Now().UTC()}
	sb.status = runtime.Status{
		ID:        spec.ID,
		State:     runtime.StateRunning,
		Pid:       1,
		IP:        "127.0.0.1",
		Class:     Class,
		CreatedAt: sb.created,
		Labels:    maps.Clone(spec.Labels),
	}
	r.st.sandboxes[spec.ID] = sb
	return sb.status, nil
}

func (r *Runtime) get(id string) (*sandbox, error) {
	sb, ok := r.st.sandboxes[id]
	if !ok {
		return nil, fmt.Errorf("sandbox %q: %w", id, errdefs.ErrNotFound)
	}
	return sb, nil
}

// Stop implements runtime.Runtime.
func (r *Runtime) Stop(ctx context.Context, id string, grace time.Duration) error {
	if r.hooks.Stop != nil {
		if err := r.hooks.Stop(id); err != nil {
			return err
		}
	}
	r.st.mu.Lock()
	defer r.st.mu.Unlock()
	sb, err := r.get(id)
	if err != nil {
		return err
	}
	if sb.srv != nil {
		sb.srv.Close()
		sb.srv = nil
	}
	sb.paused = false
	running := sb.status.State == runtime.StateRunning
	sb.status.State, sb.status.Pid = runtime.StateStopped, 0
	if grace == 0 {
		sb.status.ExitCode = 137
	}
	if running {
		r.notifyExit(runtime.Exit{ID: id, Reason: runtime.ExitReasonExited, ExitCode: sb.status.ExitCode})
	}
	return nil
}

// Delete implements runtime.Runtime.
func (r *Runtime) Delete(ctx context.Context, id string) error {
	if r.hooks.Delete != nil {
		if err := r.hooks.Delete(id); err != nil {
			return err
		}
	}
	r.st.mu.Lock()
	defer r.st.mu.Unlock()
	sb, ok := r.st.sandboxes[id]
	if !ok {
		return nil
	}
	if sb.srv != nil {
		sb.srv.Close()
	}
	if sb.upper != "" {
		os.RemoveAll(sb.upper)
	}
	delete(r.st.sandboxes, id)
	return nil
}

// Status implements runtime.Runtime.
func (r *Runtime) Status(ctx context.Context, id string) (runtime.Status, error) {
	r.st.mu.Lock()
	defer r.st.mu.Unlock()
	sb, err := r.get(id)
	if err != nil {
		return runtime.Status{}, err
	}
	return sb.snapshot(), nil
}

func (sb *sandbox) snapshot() runtime.Status {
	st := sb.status
	st.Labels = maps.Clone(st.Labels)
	return st
}

// List implements runtime.Runtime.
func (r *Runtime) List(ctx context.Context) ([]runtime.Status, error) {
	r.st.mu.Lock()
	defer r.st.mu.Unlock()
	out := make([]runtime.Status, 0, len(r.st.sandboxes))
	for _, id := range slices.Sorted(maps.Keys(r.st.sandboxes)) {
		out = append(out, r.st.sandboxes[id].snapshot())
	}
	return out, nil
}

// Endpoint implements runtime.Runtime. Only the agent port is served;
// other ports resolve to a loopback address nobody listens on.
func (r *Runtime) Endpoint(ctx context.Context, id string, port int) (string, error) {
	if port <= 0 || port > 65535 {
		return "", runtime.Invalid("invalid port %d", port)
	}
	r.st.mu.Lock()
	defer r.st.mu.Unlock()
	sb, err := r.get(id)
	if err != nil {
		return "", err
	}
	if port == agentproto.Port && sb.srv != nil {
		return sb.srv.addr(), nil
	}
	return fmt.Sprintf("127.0.0.1:%d", port), nil
}

// Pause implements runtime.Pauser.
func (r *Runtime) Pause(ctx context.Context, id string) error { return r.setPaused(id, true) }

// Resume implements runtime.Pauser.
func (r *Runtime) Resume(ctx context.Context, id string) error { return r.setPaused(id, false) }

func (r *Runtime) setPaused(id string, pause bool) error {
	r.st.mu.Lock()
	defer r.st.mu.Unlock()
	sb, err := r.get(id)
	if err != nil {
		return err
	}
	want := runtime.StateRunning
	if !pause {
		want = runtime.StatePaused
	}
	if sb.status.State != want {
		return fmt.Errorf("sandbox %q is %s, not %s: %w", id, sb.status.State, want, errdefs.ErrFailedPrecondition)
	}
	sb.paused = pause
	if pause {
		sb.status.State = runtime.StatePaused
	} else {
		sb.status.State = runtime.StateRunning
	}
	return nil
}

// SnapshotDir implements runtime.Snapshotter with an empty temporary
// directory per sandbox, removed by Delete (tests may write files into it
// to stand for the sandbox's writes).
func (r *Runtime) SnapshotDir(ctx context.Context, id string) (string, error) {
	r.st.mu.Lock()
	defer r.st.mu.Unlock()
	sb, err := r.get(id)
	if err != nil {
		return "", err
	}
	if sb.upper == "" {
		d, err := os.MkdirTemp("", "moat-fake-upper-")
		if err != nil {
			return "", fmt.Errorf("fake: %w", err)
		}
		sb.upper = d
	}
	return sb.upper, nil
}

// CreateVolume implements runtime.Volumes (in memory; the size is recorded).
func (r *Runtime) CreateVolume(ctx context.Context, spec runtime.VolumeSpec) (runtime.Volume, error) {
	if spec.Name == "" || spec.SizeBytes < 0 {
		return runtime.Volume{}, fmt.Errorf("volume %q: %w", spec.Name, errdefs.ErrInvalidArgument)
	}
	r.st.mu.Lock()
	defer r.st.mu.Unlock()
	if _, ok := r.st.volumes[spec.Name]; ok {
		return runtime.Volume{}, fmt.Errorf("volume %q: %w", spec.Name, errdefs.ErrAlreadyExists)
	}
	v := runtime.Volume{Name: spec.Name, SizeBytes: spec.SizeBytes, CreatedAt: time.Now().UTC(), Labels: maps.Clone(spec.Labels),
		Managed: true, StorageClass: spec.StorageClass, AccessModes: slices.Clone(spec.AccessModes)}
	r.st.volumes[spec.Name] = v
	return v, nil
}

// GetVolume implements runtime.Volumes.
func (r *Runtime) GetVolume(ctx context.Context, name string) (runtime.Volume, error) {
	r.st.mu.Lock()
	defer r.st.mu.Unlock()
	v, ok := r.st.volumes[name]
	if !ok {
		return runtime.Volume{}, fmt.Errorf("volume %q: %w", name, errdefs.ErrNotFound)
	}
	v.Users = r.volumeUsersLocked(name)
	return v, nil
}

// ListVolumes implements runtime.Volumes.
func (r *Runtime) ListVolumes(ctx context.Context) ([]runtime.Volume, error) {
	r.st.mu.Lock()
	defer r.st.mu.Unlock()
	out := make([]runtime.Volume, 0, len(r.st.volumes))
	for _, name := range slices.Sorted(maps.Keys(r.st.volumes)) {
		v := r.st.volumes[name]
		v.Users = r.volumeUsersLocked(name)
		out = append(out, v)
	}
	return out, nil
}

// DeleteVolume implements runtime.Volumes: refused while a sandbox mounts it.
func (r *Runtime) DeleteVolume(ctx context.Context, name string) error {
	r.st.mu.Lock()
	defer r.st.mu.Unlock()
	if _, ok := r.st.volumes[name]; !ok {
		return fmt.Errorf("volume %q: %w", name, errdefs.ErrNotFound)
	}
	if users := r.volumeUsersLocked(name); len(users) > 0 {
		return fmt.Errorf("volume %q is used by %v: %w", name, users, errdefs.ErrFailedPrecondition)
	}
	delete(r.st.volumes, name)
	return nil
}

func (r *Runtime) volumeUsersLocked(name string) []string {
	var out []string
	for id, sb := range r.st.sandboxes {
		for _, m := range sb.spec.Mounts {
			if m.Volume == name {
				out = append(out, id)
				break
			}
		}
	}
	slices.Sort(out)
	return out
}

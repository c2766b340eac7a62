package oci

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"time"

	gorunc "github.com/containerd/go-runc"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/moat-sandbox/moat/internal/atomicfile"
	"github.com/moat-sandbox/moat/internal/errdefs"
	"github.com/moat-sandbox/moat/internal/runtime"
)

var _ runtime.Checkpointer = (*Runtime)(nil)

// minCheckpointRunsc is the oldest runsc release (by the date in its
// version string) whose checkpoint moat uses. Checkpointing a sandbox
// whose netstack has, or recently had, a TCP connection (every moat
// sandbox: the agent is reached over TCP) fails on older releases and
// stops the sandbox even with --leave-running (seen with Debian 12's
// 0.0~20221219); 0.0~20260905 resets such endpoints at save and works.
// Releases in between were not tried, so they are not offered.
const minCheckpointRunsc = 20260101

// runscDate matches the release date in `runsc --version`, e.g.
// "runsc version 0.0~20260905.0" (Debian) or "release-20260905.0".
var runscDate = regexp.MustCompile(`(?:~|release-)(20\d{6})`)

// runscCanCheckpoint runs `bin --version` and reports whether the release
// is at least minCheckpointRunsc.
func runscCanCheckpoint(ctx context.Context, bin string) bool {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, bin, "--version").Output()
	if err != nil {
		return false
	}
	m := runscDate.FindSubmatch(out)
	if m == nil {
		return false
	}
	d, err := strconv.Atoi(string(m[1]))
	return err == nil && d >= minCheckpointRunsc
}

// checkpointMeta is what a restore needs besides runsc's image: runsc
// refuses a restore whose process arguments or working directory differ
// from the checkpointed ones.
type checkpointMeta struct {
	Source    string    `json:"source"` // sandbox ID
	Class     string    `json:"class"`
	Image     string    `json:"image"` // the source's image reference
	Args      []string  `json:"args"`
	Cwd       string    `json:"cwd"`
	CreatedAt time.Time `json:"createdAt"`
}

func (r *Runtime) checkpointsDir() string { return filepath.Join(r.cfg.Root, "checkpoints") }

// checkpointDir is <Root>/checkpoints/<name>: meta.json and image/ (runsc's
// checkpoint files).
func (r *Runtime) checkpointDir(name string) string { return filepath.Join(r.checkpointsDir(), name) }

// CanCheckpoint implements runtime.Checkpointer: runsc classes whose
// release can checkpoint a networked sandbox.
func (r *Runtime) CanCheckpoint(class string) bool {
	if class == "" {
		class = r.cfg.DefaultClass
	}
	return r.checkpointable[class]
}

func notCheckpointable(class string) error {
	return errdefs.WithPublic(fmt.Errorf("checkpoint of a %s sandbox: %w", class, errdefs.ErrNotImplemented),
		"", fmt.Sprintf("runtime %s cannot checkpoint sandboxes (gVisor runsc 0.0~%d or later can)", class, minCheckpointRunsc))
}

// Checkpoint implements runtime.Checkpointer with `runsc checkpoint
// --leave-running`. runsc stops the sandbox's tasks while it writes the
// image (memory, kernel state and the writable layer, which gVisor keeps
// in the Sentry) and resumes them afterwards.
func (r *Runtime) Checkpoint(ctx context.Context, id, name string) (err error) {
	if !runtime.ValidID(id) {
		return fmt.Errorf("sandbox %q: %w", id, errdefs.ErrNotFound)
	}
	if !runtime.ValidID(name) {
		return runtime.Invalid("invalid checkpoint name %q", name)
	}
	rec, err := r.readRecord(id)
	if err != nil {
		return err
	}
	if !r.checkpointable[rec.Class] {
		return notCheckpointable(rec.Class)
	}
	if len(rec.Spec.Mounts) > 0 {
		return errdefs.WithPublic(fmt.Errorf("checkpoint of sandbox %q with volumes: %w", id, errdefs.ErrNotImplemented),
			"", "sandboxes with volumes cannot be snapshotted with their memory")
	}
	if !rec.Complete {
		return fmt.Errorf("sandbox %q is not started: %w", id, errdefs.ErrFailedPrecondition)
	}
	var cfg specs.Spec
	data, err := os.ReadFile(filepath.Join(r.sandboxDir(id), "bundle", "config.json"))
	if err == nil {
		err = json.Unmarshal(data, &cfg)
	}
	if err != nil || cfg.Process == nil {
		return fmt.Errorf("oci: sandbox %q bundle: %v: %w", id, err, errdefs.ErrInternal)
	}
	meta, err := json.Marshal(checkpointMeta{Source: id, Class: rec.Class, Image: rec.Spec.Image,
		Args: cfg.Process.Args, Cwd: cfg.Process.Cwd, CreatedAt: time.Now().UTC()})
	if err != nil {
		return err
	}
	if err := os.MkdirAll(r.checkpointsDir(), 0o700); err != nil {
		return fmt.Errorf("oci: %w", err)
	}
	dir := r.checkpointDir(name)
	if err := os.Mkdir(dir, 0o700); err != nil {
		if errors.Is(err, os.ErrExist) {
			return fmt.Errorf("checkpoint %q: %w", name, errdefs.ErrAlreadyExists)
		}
		return fmt.Errorf("oci: %w", err)
	}
	defer func() {
		if err != nil {
			os.RemoveAll(dir)
		}
	}()
	image := filepath.Join(dir, "image")
	if err := os.Mkdir(image, 0o700); err != nil {
		return fmt.Errorf("oci: %w", err)
	}
	t0 := time.Now()
	if err := r.runc(rec.Class).Checkpoint(ctx, id, &gorunc.CheckpointOpts{ImagePath: image}, gorunc.LeaveRunning); err != nil {
		return fmt.Errorf("oci: checkpoint %s: %w: %w", id, err, errdefs.ErrInternal)
	}
	// meta.json last: a checkpoint without it is incomplete.
	if err := atomicfile.WriteFile(filepath.Join(dir, "meta.json"), meta, 0o600); err != nil {
		return fmt.Errorf("oci: %w", err)
	}
	r.log.Debug("oci: checkpointed", "id", id, "checkpoint", name, "took", time.Since(t0))
	return nil
}

// RemoveCheckpoint implements runtime.Checkpointer.
func (r *Runtime) RemoveCheckpoint(ctx context.Context, name string) error {
	if !runtime.ValidID(name) {
		return nil
	}
	if err := os.RemoveAll(r.checkpointDir(name)); err != nil {
		return fmt.Errorf("oci: remove checkpoint %s: %w", name, err)
	}
	return nil
}

// readCheckpoint returns the metadata of a complete checkpoint.
func (r *Runtime) readCheckpoint(name string) (checkpointMeta, error) {
	var m checkpointMeta
	if !runtime.ValidID(name) {
		return m, runtime.Invalid("invalid checkpoint name %q", name)
	}
	data, err := os.ReadFile(filepath.Join(r.checkpointDir(name), "meta.json"))
	if errors.Is(err, os.ErrNotExist) {
		return m, errdefs.WithPublic(fmt.Errorf("checkpoint %q: %w: %w", name, runtime.ErrCheckpointMissing, errdefs.ErrFailedPrecondition),
			"", fmt.Sprintf("the memory image of snapshot %s is missing", name))
	}
	if err == nil {
		err = json.Unmarshal(data, &m)
	}
	if err != nil {
		return m, fmt.Errorf("oci: checkpoint %q: %v: %w", name, err, errdefs.ErrInternal)
	}
	return m, nil
}

// validateRestore checks a Spec with Checkpoint set and fills its class
// from the checkpoint.
func (r *Runtime) validateRestore(spec *runtime.Spec) error {
	m, err := r.readCheckpoint(spec.Checkpoint)
	if err != nil {
		return err
	}
	if spec.Class == "" {
		spec.Class = m.Class
	}
	if spec.Class != m.Class {
		return runtime.Invalid("checkpoint %s was taken with runtime %s, not %s", spec.Checkpoint, m.Class, spec.Class)
	}
	if !r.checkpointable[spec.Class] {
		return notCheckpointable(spec.Class)
	}
	if len(spec.Mounts) > 0 {
		return runtime.Invalid("volumes cannot be added to a sandbox restored from a memory snapshot")
	}
	return nil
}

// restoreProcess makes process match the checkpointed one, as runsc
// requires.
func (r *Runtime) restoreProcess(name string, p *specs.Process) error {
	m, err := r.readCheckpoint(name)
	if err != nil {
		return err
	}
	p.Args, p.Cwd = slices.Clone(m.Args), m.Cwd
	return nil
}

// restore starts sandbox id from the runsc image in directory img with
// `runsc restore --detach --background` (the caller wraps it in
// runscStart). --background lets the Sentry go on loading the memory
// pages after the restore returns (the image is uncompressed, runsc's
// default), so the first command does not wait for the whole image:
// runsc opens the image files itself and hands them to the sandbox, so
// the files may be removed (a hibernation's, once woken) while it reads.
// Every child of one snapshot reads the same image files (nothing is
// copied per child on disk), through the host's page cache.
func (r *Runtime) restore(ctx context.Context, class, id, bundle, img string, io gorunc.IO, pidFile string) error {
	_, err := r.runc(class).Restore(ctx, id, bundle, &gorunc.RestoreOpts{
		CheckpointOpts: gorunc.CheckpointOpts{ImagePath: img},
		IO:             io,
		Detach:         true,
		PidFile:        pidFile,
		ExtraArgs:      []string{"--background"},
	})
	return err
}

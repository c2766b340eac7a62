package docker

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/moby/moby/api/types/mount"
	"github.com/moby/moby/api/types/volume"
	"github.com/moby/moby/client"
	"golang.org/x/sys/unix"

	"github.com/moat-sandbox/moat/internal/errdefs"
	"github.com/moat-sandbox/moat/internal/runtime"
	vol "github.com/moat-sandbox/moat/internal/volume"
)

// Named volumes are local-driver Docker volumes named after the claim;
// moat deletes only those it made (LabelScope), and SizeBytes is a label
// (the driver enforces none). A subPath is opened confined to the volume's
// host dir (volume.BindSubPath) and bound at StateDir/<id>.volumes/<i>:
// API 1.41 has no subpath option, and a path handed to the daemon would be
// resolved again, through whatever symlinks the volume holds by then.

// Labels of named volumes and of the containers that mount them.
const (
	// LabelVolumeSize holds the requested size in bytes (not enforced).
	LabelVolumeSize = "moat.dev/volume-size"
	// labelUsesVolume prefixes a container label per named volume it
	// mounts, so that the users of a volume are one filtered list.
	labelUsesVolume = "moat.dev/volume."
)

var _ runtime.Volumes = (*Runtime)(nil)

func volumeNotFound(name string) error {
	return fmt.Errorf("volume %q: %w", name, errdefs.ErrNotFound)
}

// CreateVolume implements runtime.Volumes.
func (r *Runtime) CreateVolume(ctx context.Context, spec runtime.VolumeSpec) (runtime.Volume, error) {
	if !runtime.ValidVolumeName(spec.Name) {
		return runtime.Volume{}, fmt.Errorf("volume name %q: %w", spec.Name, errdefs.ErrInvalidArgument)
	}
	if spec.SizeBytes < 0 {
		return runtime.Volume{}, fmt.Errorf("volume size %d: %w", spec.SizeBytes, errdefs.ErrInvalidArgument)
	}
	if _, err := r.cli.VolumeInspect(ctx, spec.Name, client.VolumeInspectOptions{}); err == nil {
		return runtime.Volume{}, fmt.Errorf("volume %q: %w", spec.Name, errdefs.ErrAlreadyExists)
	} else if !cerrdefs.IsNotFound(err) {
		return runtime.Volume{}, classify("inspect volume "+spec.Name, err)
	}
	labels := maps.Clone(spec.Labels)
	if labels == nil {
		labels = map[string]string{}
	}
	labels[LabelScope] = r.cfg.Scope
	if spec.SizeBytes > 0 {
		labels[LabelVolumeSize] = strconv.FormatInt(spec.SizeBytes, 10)
	}
	res, err := r.cli.VolumeCreate(ctx, client.VolumeCreateOptions{Name: spec.Name, Driver: "local", Labels: labels})
	if err != nil {
		return runtime.Volume{}, classify("create volume "+spec.Name, err)
	}
	return r.volumeInfo(ctx, res.Volume)
}

// volumeInfo converts a Docker volume; users are this scope's containers
// labelled as mounting it.
func (r *Runtime) volumeInfo(ctx context.Context, v volume.Volume) (runtime.Volume, error) {
	out := runtime.Volume{Name: v.Name, Managed: v.Labels[LabelScope] == r.cfg.Scope}
	if t, err := time.Parse(time.RFC3339Nano, v.CreatedAt); err == nil {
		out.CreatedAt = t.UTC()
	}
	for k, val := range v.Labels {
		if k == LabelScope || k == LabelVolumeSize {
			continue
		}
		if out.Labels == nil {
			out.Labels = map[string]string{}
		}
		out.Labels[k] = val
	}
	if v.UsageData != nil && v.UsageData.Size > 0 {
		out.UsedBytes = v.UsageData.Size
	}
	users, err := r.volumeUsers(ctx, v.Name)
	if err != nil {
		return runtime.Volume{}, err
	}
	out.Users = users
	return out, nil
}

func (r *Runtime) volumeUsers(ctx context.Context, name string) ([]string, error) {
	f := make(client.Filters).Add("label", LabelScope+"="+r.cfg.Scope).Add("label", labelUsesVolume+name)
	res, err := r.cli.ContainerList(ctx, client.ContainerListOptions{All: true, Filters: f})
	if err != nil {
		return nil, classify("list users of volume "+name, err)
	}
	var out []string
	for _, c := range res.Items {
		out = append(out, c.Labels[LabelSandbox])
	}
	slices.Sort(out)
	return out, nil
}

// GetVolume implements runtime.Volumes.
func (r *Runtime) GetVolume(ctx context.Context, name string) (runtime.Volume, error) {
	if !runtime.ValidVolumeName(name) {
		return runtime.Volume{}, volumeNotFound(name)
	}
	res, err := r.cli.VolumeInspect(ctx, name, client.VolumeInspectOptions{})
	if cerrdefs.IsNotFound(err) {
		return runtime.Volume{}, volumeNotFound(name)
	}
	if err != nil {
		return runtime.Volume{}, classify("inspect volume "+name, err)
	}
	return r.volumeInfo(ctx, res.Volume)
}

// ListVolumes implements runtime.Volumes: the volumes of this Config.Scope.
func (r *Runtime) ListVolumes(ctx context.Context) ([]runtime.Volume, error) {
	f := make(client.Filters).Add("label", LabelScope+"="+r.cfg.Scope)
	res, err := r.cli.VolumeList(ctx, client.VolumeListOptions{Filters: f})
	if err != nil {
		return nil, classify("list volumes", err)
	}
	out := make([]runtime.Volume, 0, len(res.Items))
	for _, v := range res.Items {
		info, err := r.volumeInfo(ctx, v)
		if err != nil {
			return nil, err
		}
		out = append(out, info)
	}
	slices.SortFunc(out, func(a, b runtime.Volume) int { return strings.Compare(a.Name, b.Name) })
	return out, nil
}

// DeleteVolume implements runtime.Volumes. Volumes moat did not create are
// ErrPermissionDenied; a volume mounted by a container is refused by the
// daemon as well (ErrConflict).
func (r *Runtime) DeleteVolume(ctx context.Context, name string) error {
	v, err := r.GetVolume(ctx, name)
	if err != nil {
		return err
	}
	if err := v.Deletable(); err != nil {
		return err
	}
	if _, err := r.cli.VolumeRemove(ctx, name, client.VolumeRemoveOptions{}); err != nil {
		if cerrdefs.IsNotFound(err) {
			return volumeNotFound(name)
		}
		return classify("remove volume "+name, err)
	}
	return nil
}

// volumesStageDir holds the host binds of a sandbox's subPath mounts.
func (r *Runtime) volumesStageDir(id string) string {
	return filepath.Join(r.cfg.StateDir, id+".volumes")
}

// namedVolumeMounts turns the named-volume mounts of spec into Docker
// mounts and container labels, staging subPath binds (see the file
// comment). The caller removes the stage (unstageVolumes) on failure.
func (r *Runtime) namedVolumeMounts(ctx context.Context, id string, mounts []runtime.Mount) ([]mount.Mount, map[string]string, error) {
	var out []mount.Mount
	labels := map[string]string{}
	for i, m := range mounts {
		if m.Volume == "" {
			continue
		}
		res, err := r.cli.VolumeInspect(ctx, m.Volume, client.VolumeInspectOptions{})
		if cerrdefs.IsNotFound(err) {
			return nil, nil, volumeNotFound(m.Volume)
		}
		if err != nil {
			return nil, nil, classify("inspect volume "+m.Volume, err)
		}
		labels[labelUsesVolume+m.Volume] = "1"
		if m.SubPath == "" {
			out = append(out, mount.Mount{Type: mount.TypeVolume, Source: m.Volume, Target: m.Destination, ReadOnly: m.ReadOnly,
				VolumeOptions: &mount.VolumeOptions{NoCopy: true}})
			continue
		}
		v := res.Volume
		if v.Driver != "local" || v.Mountpoint == "" {
			return nil, nil, errdefs.WithPublic(fmt.Errorf("volume %s: %w: %w", m.Volume, runtime.ErrSubPathUnsupported, errdefs.ErrInvalidArgument),
				"", fmt.Sprintf("subPath needs a volume of the local driver; volume %s uses driver %q", m.Volume, v.Driver))
		}
		if _, err := os.Stat(v.Mountpoint); err != nil {
			return nil, nil, fmt.Errorf("volume %s: its directory %s is not on this host (%v): %w", m.Volume, v.Mountpoint, err, errdefs.ErrFailedPrecondition)
		}
		stage := r.volumesStageDir(id)
		if err := os.MkdirAll(stage, 0o700); err != nil {
			return nil, nil, fmt.Errorf("docker: %w", err)
		}
		target := filepath.Join(stage, strconv.Itoa(i))
		if err := vol.BindSubPath(v.Mountpoint, m.SubPath, target, m.ReadOnly); err != nil {
			return nil, nil, err
		}
		out = append(out, mount.Mount{Type: mount.TypeBind, Source: target, Target: m.Destination, ReadOnly: m.ReadOnly,
			BindOptions: &mount.BindOptions{NonRecursive: true, Propagation: mount.PropagationRPrivate}})
	}
	return out, labels, nil
}

// unstageVolumes unmounts and removes a sandbox's subPath binds.
func (r *Runtime) unstageVolumes(id string) error {
	stage := r.volumesStageDir(id)
	ents, err := os.ReadDir(stage)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	var errs []error
	for _, e := range ents {
		p := filepath.Join(stage, e.Name())
		for {
			err := unix.Unmount(p, unix.MNT_DETACH)
			if err != nil {
				if !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
					errs = append(errs, fmt.Errorf("docker: unmount %s: %w", p, err))
				}
				break
			}
		}
	}
	if len(errs) > 0 {
		return errors.Join(errs...)
	}
	// Remove, never recursively: anything left is a mount not undone.
	for _, e := range ents {
		if err := os.Remove(filepath.Join(stage, e.Name())); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	if err := os.Remove(stage); err != nil && !errors.Is(err, os.ErrNotExist) {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// sweepStages removes the subPath binds of sandboxes that have no
// container (a create cut short by a crash).
func (r *Runtime) sweepStages(ctx context.Context) error {
	ents, err := os.ReadDir(r.cfg.StateDir)
	if err != nil {
		return fmt.Errorf("docker: %w", err)
	}
	var errs []error
	for _, e := range ents {
		id, ok := strings.CutSuffix(e.Name(), ".volumes")
		if !ok || !runtime.ValidID(id) {
			continue
		}
		if _, err := r.inspect(ctx, id); errdefs.IsNotFound(err) {
			errs = append(errs, r.unstageVolumes(id))
		}
	}
	return errors.Join(errs...)
}

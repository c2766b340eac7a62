// Package mounts is the volumes of sandboxes: it validates the host and
// named (pvc) volumes of a create, makes the named volumes a create needs
// and removes those it made again when the create fails or (if marked
// deleteOnSandboxTermination) when the sandbox is deleted, and serves the
// volume API (list, get, delete). The runtime keeps the volumes
// (runtime.Volumes); internal/volume is the native runtime's store of them.
package mounts

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"sync"

	"log/slog"

	"github.com/moat-sandbox/moat/internal/errdefs"
	"github.com/moat-sandbox/moat/internal/lifecycle"
	"github.com/moat-sandbox/moat/internal/runtime"
	"github.com/moat-sandbox/moat/internal/tenant"
	"github.com/moat-sandbox/moat/internal/volume"
)

// Volume error codes (OpenSandbox VOLUME::*, plus moat's IN_USE, NOT_FOUND
// and INVALID_STORAGE for the volume API and the pvc storage quota).
const (
	codeInvalidMountPath   = "VOLUME::INVALID_MOUNT_PATH"
	codeInvalidName        = "VOLUME::INVALID_NAME"
	codeDuplicateName      = "VOLUME::DUPLICATE_NAME"
	codeInvalidBackend     = "VOLUME::INVALID_BACKEND"
	codeUnsupportedBackend = "VOLUME::UNSUPPORTED_BACKEND"
	codeInvalidPVCName     = "VOLUME::INVALID_PVC_NAME"
	codeInvalidStorage     = "VOLUME::INVALID_STORAGE"
	codePVCNotFound        = "VOLUME::PVC_NOT_FOUND"
	codeVolumeNotFound     = "VOLUME::NOT_FOUND"
	codeVolumeInUse        = "VOLUME::IN_USE"
)

// Volumes is the volumes feature (lifecycle.Volumes). It is safe for
// concurrent use.
//
// mu serializes the named-volume decisions: a create making sure its
// claims exist, a volume delete checking that no sandbox uses the volume,
// and the deletion of a sandbox's volumes. Lock order: a sandbox's lock
// before mu before the core's table lock (ClaimUsers).
type Volumes struct {
	core    *lifecycle.Service
	rt      runtime.Runtime
	log     *slog.Logger
	allowed []string
	mu      sync.Mutex
}

// New returns the volumes feature of core. allowed are the host
// directories host volumes may mount (prefix match after cleaning and
// symlink resolution); empty refuses every host volume.
func New(core *lifecycle.Service, rt runtime.Runtime, log *slog.Logger, allowed []string) *Volumes {
	return &Volumes{core: core, rt: rt, log: log, allowed: allowed}
}

// createdKey keys the claims a sandbox's create made (Entry.Value).
type createdKey struct{}

// Mounts validates the volumes of a create request.
func (s *Volumes) Mounts(req lifecycle.CreateRequest) ([]runtime.Mount, []lifecycle.Claim, error) {
	if req.HasVolumes && len(req.Volumes) == 0 {
		return nil, nil, errdefs.WithPublic(errdefs.ErrInvalidArgument, lifecycle.CodeHostPathNotAllowed, "volumes are not allowed by this server's configuration")
	}
	mounts, claims, err := volumeMounts(req.Volumes, s.allowed, filepath.EvalSymlinks)
	if err != nil {
		return nil, nil, err
	}
	if len(claims) > 0 {
		if _, err := s.volumesRuntime(); err != nil {
			return nil, nil, err
		}
	}
	return mounts, claims, nil
}

// Ensure makes the claims of sandbox e exist (ensureLocked) and records
// which this create made. The caller holds e's lock and has put e in the
// table, so DeleteVolume sees it as a user from here on.
func (s *Volumes) Ensure(ctx context.Context, e *lifecycle.Entry) error {
	sb := e.Sandbox()
	s.mu.Lock()
	created, err := s.ensureLocked(ctx, sb.ID, sb.Claims)
	s.mu.Unlock()
	e.SetValue(createdKey{}, created)
	for i := range sb.Claims {
		sb.Claims[i].Created = slices.Contains(created, sb.Claims[i].Name)
	}
	return err
}

var volumeName = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$`)

// accessModes are the Kubernetes PVC access modes.
var accessModes = []string{"ReadWriteOnce", "ReadOnlyMany", "ReadWriteMany", "ReadWriteOncePod"}

// reservedMountPaths are sandbox paths a volume may not cover or sit
// under: the agent, the kernel filesystems and the per-sandbox /etc files.
var reservedMountPaths = []string{"/.moat", "/proc", "/sys", "/dev", "/etc/hosts", "/etc/hostname", "/etc/resolv.conf"}

// volumeMounts validates volumes and returns the sandbox's mounts and the
// named volumes (claims) they use. Host paths are checked against the
// allow-list: allowed holds absolute directories; a host path is accepted
// if, after filepath.Clean, subPath and symlink resolution, it is one of
// them or lies beneath one (itself resolved). An empty list refuses every
// host volume. A pvc volume's subPath is only checked for shape here; the
// runtime resolves it inside the volume.
func volumeMounts(vols []lifecycle.Volume, allowed []string, evalSymlinks func(string) (string, error)) ([]runtime.Mount, []lifecycle.Claim, error) {
	names := map[string]bool{}
	dests := map[string]bool{}
	var out []runtime.Mount
	var claims []lifecycle.Claim
	for i, v := range vols {
		at := fmt.Sprintf("volumes[%d]", i)
		if !volumeName.MatchString(v.Name) {
			return nil, nil, errdefs.Invalid(codeInvalidName, fmt.Sprintf("%s.name %q: want a DNS label (a-z, 0-9, '-', at most 63)", at, v.Name))
		}
		if names[v.Name] {
			return nil, nil, errdefs.Invalid(codeDuplicateName, fmt.Sprintf("%s.name %q is used twice", at, v.Name))
		}
		names[v.Name] = true
		ossfs := len(v.OSSFS) > 0 && string(v.OSSFS) != "null"
		backends := 0
		for _, set := range []bool{v.Host != nil, v.PVC != nil, ossfs} {
			if set {
				backends++
			}
		}
		if backends != 1 {
			return nil, nil, errdefs.Invalid(codeInvalidBackend, fmt.Sprintf("%s: exactly one of host, pvc or ossfs is required (got %d)", at, backends))
		}
		if ossfs {
			return nil, nil, errdefs.WithPublic(errdefs.ErrNotImplemented, codeUnsupportedBackend,
				fmt.Sprintf("%s: ossfs volumes are not supported by this server; use pvc (a named volume) or host (a path allowed by --allow-host-path)", at))
		}
		dest, err := mountPath(at, v.MountPath)
		if err != nil {
			return nil, nil, err
		}
		if dests[dest] {
			return nil, nil, errdefs.Invalid(codeInvalidMountPath, fmt.Sprintf("%s.mountPath %s is used twice", at, dest))
		}
		dests[dest] = true
		if err := runtime.CheckSubPath(v.SubPath); err != nil {
			return nil, nil, errdefs.Invalid(lifecycle.CodeInvalidSubPath, fmt.Sprintf("%s.subPath %q must be a relative path inside the volume, without '..'", at, v.SubPath))
		}
		if v.PVC != nil {
			c, err := pvcClaim(at, v.PVC)
			if err != nil {
				return nil, nil, err
			}
			claims = mergeClaim(claims, c)
			out = append(out, runtime.Mount{Volume: c.Name, SubPath: filepath.Clean("/" + v.SubPath)[1:], Destination: dest, ReadOnly: v.ReadOnly})
			continue
		}
		src, err := hostPath(at, v.Host.Path, v.SubPath, allowed, evalSymlinks)
		if err != nil {
			return nil, nil, err
		}
		out = append(out, runtime.Mount{Source: src, Destination: dest, ReadOnly: v.ReadOnly})
	}
	return out, claims, nil
}

// pvcClaim validates the pvc backend of volumes[i] (at).
func pvcClaim(at string, p *lifecycle.PVCVolume) (lifecycle.Claim, error) {
	// No dots: "<tenant>.<claim>" is the runtime name of a tenant's claim.
	if !runtime.ValidVolumeName(p.ClaimName) || strings.Contains(p.ClaimName, ".") {
		return lifecycle.Claim{}, errdefs.Invalid(codeInvalidPVCName, fmt.Sprintf("%s.pvc.claimName %q: want a Kubernetes resource name (a-z, 0-9, '-', starting and ending alphanumeric, at most 253)", at, p.ClaimName))
	}
	c := lifecycle.Claim{Name: p.ClaimName, Create: p.CreateIfNotExists == nil || *p.CreateIfNotExists,
		DeleteOnTermination: p.DeleteOnSandboxTermination, StorageClass: p.StorageClass}
	if p.Storage != "" {
		n, err := lifecycle.ParseBytes(at+".pvc.storage", p.Storage)
		if err != nil {
			return lifecycle.Claim{}, errdefs.Invalid(codeInvalidStorage, fmt.Sprintf("%s.pvc.storage: %q is not a size (e.g. \"512Mi\", \"1Gi\")", at, p.Storage))
		}
		if n < volume.MinQuotaBytes || n > volume.MaxQuotaBytes {
			return lifecycle.Claim{}, errdefs.Invalid(codeInvalidStorage, fmt.Sprintf("%s.pvc.storage: %s is out of range (16Mi to 16Ti)", at, p.Storage))
		}
		c.SizeBytes = n
	}
	if p.StorageClass != "" && !runtime.ValidVolumeName(p.StorageClass) {
		return lifecycle.Claim{}, errdefs.Invalid(lifecycle.CodeInvalidVolume, fmt.Sprintf("%s.pvc.storageClass %q is not a valid name", at, p.StorageClass))
	}
	for _, m := range p.AccessModes {
		if !slices.Contains(accessModes, m) {
			return lifecycle.Claim{}, errdefs.Invalid(lifecycle.CodeInvalidVolume, fmt.Sprintf("%s.pvc.accessModes: %q is not one of %s", at, m, strings.Join(accessModes, ", ")))
		}
	}
	c.AccessModes = slices.Clone(p.AccessModes)
	return c, nil
}

// mergeClaim adds c to claims; a claim mounted twice (e.g. two subPaths)
// is ensured once, with the settings of its first mount, and deleted on
// termination if any mount asks for it.
func mergeClaim(claims []lifecycle.Claim, c lifecycle.Claim) []lifecycle.Claim {
	for i := range claims {
		if claims[i].Name == c.Name {
			claims[i].DeleteOnTermination = claims[i].DeleteOnTermination || c.DeleteOnTermination
			return claims
		}
	}
	return append(claims, c)
}

func mountPath(at, p string) (string, error) {
	if !strings.HasPrefix(p, "/") || strings.ContainsRune(p, 0) {
		return "", errdefs.Invalid(codeInvalidMountPath, fmt.Sprintf("%s.mountPath %q must be an absolute path", at, p))
	}
	clean := filepath.Clean(p)
	if clean == "/" {
		return "", errdefs.Invalid(codeInvalidMountPath, fmt.Sprintf("%s.mountPath must not be /", at))
	}
	for _, r := range reservedMountPaths {
		if clean == r || strings.HasPrefix(clean, r+"/") {
			return "", errdefs.Invalid(codeInvalidMountPath, fmt.Sprintf("%s.mountPath %s is reserved (%s)", at, clean, r))
		}
	}
	return clean, nil
}

func hostPath(at, p, sub string, allowed []string, evalSymlinks func(string) (string, error)) (string, error) {
	refuse := func(why string) error {
		return errdefs.WithPublic(errdefs.ErrInvalidArgument, lifecycle.CodeHostPathNotAllowed, fmt.Sprintf("%s.host.path %q %s", at, p, why))
	}
	if !filepath.IsAbs(p) || strings.ContainsRune(p, 0) {
		return "", refuse("must be an absolute path")
	}
	if sub != "" {
		p = filepath.Join(p, sub)
	}
	if len(allowed) == 0 {
		return "", refuse("is not allowed: this server allows no host paths (moat serve --allow-host-path)")
	}
	resolved, err := evalSymlinks(filepath.Clean(p))
	if err != nil {
		return "", refuse("does not exist or cannot be resolved")
	}
	for _, a := range allowed {
		ra, err := evalSymlinks(filepath.Clean(a))
		if err != nil {
			continue
		}
		if resolved == ra || strings.HasPrefix(resolved, strings.TrimSuffix(ra, "/")+"/") {
			return resolved, nil
		}
	}
	return "", refuse("is not under an allowed host path")
}

// volumesRuntime returns the runtime's named volumes, or a 501 for a
// runtime without them.
func (s *Volumes) volumesRuntime() (runtime.Volumes, error) {
	if v, ok := s.rt.(runtime.Volumes); ok {
		return v, nil
	}
	return nil, errdefs.WithPublic(errdefs.ErrNotImplemented, codeUnsupportedBackend,
		fmt.Sprintf("named volumes (pvc) are not supported by the %s runtime", s.rt.Name()))
}

// ensureLocked makes sure every claim of a sandbox being created exists:
// all are looked up first, so that a missing claim without
// createIfNotExists fails the create before anything is made, then the
// missing ones are created (and removed again if a later one fails). The
// caller holds s.mu and has registered the sandbox, so DeleteVolume
// sees it as a user from here on. It returns the claims it created.
func (s *Volumes) ensureLocked(ctx context.Context, id string, claims []lifecycle.Claim) ([]string, error) {
	if len(claims) == 0 {
		return nil, nil
	}
	vr, err := s.volumesRuntime()
	if err != nil {
		return nil, err
	}
	var missing []lifecycle.Claim
	for _, c := range claims {
		_, err := vr.GetVolume(ctx, c.Name)
		switch {
		case err == nil:
		case errdefs.IsNotFound(err) && c.Create:
			missing = append(missing, c)
		case errdefs.IsNotFound(err):
			return nil, errdefs.WithPublic(fmt.Errorf("volume %s: %w", c.Name, errdefs.ErrNotFound), codePVCNotFound,
				fmt.Sprintf("volume %s does not exist and createIfNotExists is false", c.Name))
		default:
			return nil, fmt.Errorf("look up volume %s: %w", c.Name, err)
		}
	}
	var created []string
	for _, c := range missing {
		_, err := vr.CreateVolume(ctx, runtime.VolumeSpec{Name: c.Name, SizeBytes: c.SizeBytes, StorageClass: c.StorageClass,
			AccessModes: c.AccessModes, Labels: map[string]string{"moat.dev/created-by-sandbox": id}})
		if err != nil && !errdefs.IsAlreadyExists(err) {
			for _, n := range created {
				if derr := vr.DeleteVolume(context.WithoutCancel(ctx), n); derr != nil {
					s.log.Error("remove volume of a failed create", "volume", n, "err", derr)
				}
			}
			if errdefs.IsInvalidArgument(err) {
				return nil, errdefs.WithPublic(err, codeInvalidStorage, fmt.Sprintf("volume %s cannot be created: %s", c.Name, publicReason(err)))
			}
			return nil, fmt.Errorf("create volume %s: %w", c.Name, err)
		}
		if err == nil {
			created = append(created, c.Name)
		}
	}
	return created, nil
}

// publicReason is the client-safe tail of a runtime's invalid-argument
// error: the text after the last ": " before the class.
func publicReason(err error) string {
	msg := strings.TrimSuffix(err.Error(), ": "+errdefs.ErrInvalidArgument.Error())
	if i := strings.LastIndex(msg, ": "); i >= 0 {
		msg = msg[i+2:]
	}
	return msg
}

// Release deletes the claims of e marked deleteOnSandboxTermination
// that e's create made, once e is gone, unless another sandbox uses them
// (a pre-existing volume is never deleted). Errors are logged: the
// sandbox is gone either way.
func (s *Volumes) Release(ctx context.Context, e *lifecycle.Entry) {
	sb := e.Sandbox()
	var names []string
	for _, c := range sb.Claims {
		if c.DeleteOnTermination && c.Created {
			names = append(names, c.Name)
		}
	}
	if len(names) == 0 {
		return
	}
	vr, err := s.volumesRuntime()
	if err != nil {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, n := range names {
		if users := s.core.ClaimUsers(n); len(users) > 0 {
			s.log.Info("volume kept: still in use", "volume", n, "sandbox", sb.ID, "users", users)
			continue
		}
		v, err := vr.GetVolume(ctx, n)
		if err != nil || !v.Managed {
			continue
		}
		if err := vr.DeleteVolume(ctx, n); err != nil && !errdefs.IsNotFound(err) {
			s.log.Error("delete volume on sandbox termination", "volume", n, "sandbox", e.ID(), "err", err)
		}
	}
}

// VolumeInfo is a named volume as the volume API shows it.
type VolumeInfo struct {
	runtime.Volume
	// Sandboxes are the live sandboxes that mount the volume.
	Sandboxes []string
}

func volumeNotFound(name string) error {
	return errdefs.WithPublic(fmt.Errorf("volume %q: %w", name, errdefs.ErrNotFound), codeVolumeNotFound, fmt.Sprintf("volume %s not found", name))
}

// ListVolumes returns the runtime's named volumes, sorted by name.
func (s *Volumes) ListVolumes(ctx context.Context) ([]VolumeInfo, error) {
	vr, err := s.volumesRuntime()
	if err != nil {
		return nil, err
	}
	vols, err := vr.ListVolumes(ctx)
	if err != nil {
		return nil, fmt.Errorf("list volumes: %w", err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]VolumeInfo, 0, len(vols))
	for _, v := range vols {
		if !lifecycle.Visible(ctx, volumeOwner(v.Name)) {
			continue
		}
		users := s.core.ClaimUsers(v.Name)
		v.Name = volumeDisplay(ctx, v.Name)
		out = append(out, VolumeInfo{Volume: v, Sandboxes: users})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

// GetVolume returns one named volume.
func (s *Volumes) GetVolume(ctx context.Context, name string) (VolumeInfo, error) {
	vr, err := s.volumesRuntime()
	if err != nil {
		return VolumeInfo{}, err
	}
	key, ok := volumeLookup(ctx, name)
	if !ok {
		return VolumeInfo{}, volumeNotFound(name)
	}
	v, err := vr.GetVolume(ctx, key)
	if errdefs.IsNotFound(err) {
		return VolumeInfo{}, volumeNotFound(name)
	}
	if err != nil {
		return VolumeInfo{}, fmt.Errorf("get volume %s: %w", name, err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	users := s.core.ClaimUsers(key)
	v.Name = volumeDisplay(ctx, key)
	return VolumeInfo{Volume: v, Sandboxes: users}, nil
}

// DeleteVolume deletes a named volume and its data. A volume that a live
// sandbox (or a warm pool sandbox) mounts is refused with 409
// VOLUME::IN_USE.
func (s *Volumes) DeleteVolume(ctx context.Context, name string) error {
	vr, err := s.volumesRuntime()
	if err != nil {
		return err
	}
	key, ok := volumeLookup(ctx, name)
	if !ok {
		return volumeNotFound(name)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if users := s.core.ClaimUsers(key); len(users) > 0 {
		return errdefs.WithPublic(fmt.Errorf("volume %s: %w", name, errdefs.ErrConflict), codeVolumeInUse,
			fmt.Sprintf("volume %s is in use by sandbox %s", name, strings.Join(users, ", ")))
	}
	switch err := vr.DeleteVolume(context.WithoutCancel(ctx), key); {
	case err == nil:
		return nil
	case errdefs.IsNotFound(err):
		return volumeNotFound(name)
	case errdefs.IsFailedPrecondition(err), errdefs.IsConflict(err):
		return errdefs.WithPublic(fmt.Errorf("volume %s: %w: %v", name, errdefs.ErrConflict, err), codeVolumeInUse,
			fmt.Sprintf("volume %s is in use", name))
	case errors.Is(err, errdefs.ErrPermissionDenied):
		return errdefs.WithPublic(err, "VOLUME::NOT_MANAGED", fmt.Sprintf("volume %s was not created by moat; it is not deleted through this API", name))
	default:
		return fmt.Errorf("delete volume %s: %w", name, err)
	}
}

// Abort deletes the volumes that the failed create of e made,
// unless another sandbox has started to use them meanwhile: a sandbox
// that never came to be leaves no volume behind. The caller holds e.mu
// and e is Failed.
func (s *Volumes) Abort(ctx context.Context, e *lifecycle.Entry) {
	created, _ := e.Value(createdKey{}).([]string)
	if len(created) == 0 {
		return
	}
	vr, err := s.volumesRuntime()
	if err != nil {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, n := range created {
		if len(s.core.ClaimUsers(n)) > 0 {
			continue
		}
		if err := vr.DeleteVolume(context.WithoutCancel(ctx), n); err != nil && !errdefs.IsNotFound(err) {
			s.log.Error("remove volume of a failed create", "volume", n, "sandbox", e.ID(), "err", err)
		}
	}
	e.SetValue(createdKey{}, nil)
}

// volumeOwner is the tenant of a runtime volume name.
func volumeOwner(key string) string {
	if owner, _, ok := strings.Cut(key, "."); ok {
		return owner
	}
	return tenant.Default
}

// volumeLookup maps a volume name of the API to its runtime name in ctx's
// scope: a plain name is the acting tenant's claim; a qualified one
// ("<tenant>.<claim>", as an admin's list shows other tenants' volumes)
// only resolves for a scope that sees that tenant. ok is false for a name
// that cannot be a volume of the scope.
func volumeLookup(ctx context.Context, name string) (key string, ok bool) {
	if !runtime.ValidVolumeName(name) {
		return "", false
	}
	if strings.Contains(name, ".") {
		owner, claim, _ := strings.Cut(name, ".")
		if strings.Contains(claim, ".") || tenant.Normalize(owner) == tenant.Default || !lifecycle.Visible(ctx, owner) {
			return "", false
		}
		return name, true
	}
	return lifecycle.VolumeKey(lifecycle.OwnerOf(ctx), name), true
}

// volumeDisplay is the API name of runtime volume key for ctx: the plain
// claim name in the acting tenant, the qualified name otherwise (an
// admin's view of other tenants).
func volumeDisplay(ctx context.Context, key string) string {
	owner, claim, ok := strings.Cut(key, ".")
	if ok && owner == lifecycle.OwnerOf(ctx) {
		return claim
	}
	return key
}

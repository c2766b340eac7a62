package lifecycle

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"

	"github.com/moat-sandbox/moat/internal/errdefs"
	"github.com/moat-sandbox/moat/internal/runtime"
	"github.com/moat-sandbox/moat/internal/volume"
)

// Volume error codes (OpenSandbox VOLUME::*, plus moat's IN_USE, NOT_FOUND
// and INVALID_STORAGE for the volume API and the pvc storage quota).
const (
	codeHostPathNotAllowed = "VOLUME::HOST_PATH_NOT_ALLOWED"
	codeInvalidMountPath   = "VOLUME::INVALID_MOUNT_PATH"
	codeInvalidVolume      = "VOLUME::INVALID_VOLUME"
	codeInvalidName        = "VOLUME::INVALID_NAME"
	codeDuplicateName      = "VOLUME::DUPLICATE_NAME"
	codeInvalidBackend     = "VOLUME::INVALID_BACKEND"
	codeUnsupportedBackend = "VOLUME::UNSUPPORTED_BACKEND"
	codeInvalidSubPath     = "VOLUME::INVALID_SUB_PATH"
	codeInvalidPVCName     = "VOLUME::INVALID_PVC_NAME"
	codeInvalidStorage     = "VOLUME::INVALID_STORAGE"
	codePVCNotFound        = "VOLUME::PVC_NOT_FOUND"
	codeVolumeNotFound     = "VOLUME::NOT_FOUND"
	codeVolumeInUse        = "VOLUME::IN_USE"
)

// Volume is one OpenSandbox volume of a create request: a host path
// (checked against the server's allow-list) or a named volume (pvc) of the
// runtime. ossfs is refused.
type Volume struct {
	Name      string          `json:"name"`
	MountPath string          `json:"mountPath"`
	ReadOnly  bool            `json:"readOnly,omitempty"`
	SubPath   string          `json:"subPath,omitempty"`
	Host      *HostVolume     `json:"host,omitempty"`
	PVC       *PVCVolume      `json:"pvc,omitempty"`
	OSSFS     json.RawMessage `json:"ossfs,omitempty"`
}

// HostVolume is the host backend of a Volume.
type HostVolume struct {
	Path string `json:"path"`
}

// PVCVolume is the pvc backend of a Volume: a named volume of the runtime
// (a moat-managed volume on the native runtime, a Docker named volume, a
// Kubernetes PersistentVolumeClaim).
type PVCVolume struct {
	ClaimName string `json:"claimName"`
	// CreateIfNotExists defaults to true.
	CreateIfNotExists          *bool    `json:"createIfNotExists,omitempty"`
	DeleteOnSandboxTermination bool     `json:"deleteOnSandboxTermination,omitempty"`
	StorageClass               string   `json:"storageClass,omitempty"`
	Storage                    string   `json:"storage,omitempty"`
	AccessModes                []string `json:"accessModes,omitempty"`
}

// Claim is one named volume a sandbox mounts, as recorded with it.
type Claim struct {
	Name string `json:"name"`
	// Create: make the volume if it does not exist (createIfNotExists).
	Create bool `json:"create,omitempty"`
	// DeleteOnTermination: delete the volume when the sandbox is deleted,
	// if this sandbox's create made it (Created) and no other sandbox uses
	// it then. A pre-existing volume is never deleted (upstream's rule).
	DeleteOnTermination bool `json:"deleteOnTermination,omitempty"`
	// Created records that this sandbox's create made the volume.
	Created      bool     `json:"created,omitempty"`
	SizeBytes    int64    `json:"sizeBytes,omitempty"`
	StorageClass string   `json:"storageClass,omitempty"`
	AccessModes  []string `json:"accessModes,omitempty"`
}

var volumeName = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$`)

// accessModes are the Kubernetes PVC access modes.
var accessModes = []string{"ReadWriteOnce", "ReadOnlyMany", "ReadWriteMany", "ReadWriteOncePod"}

// reservedMountPaths are sandbox paths a volume may not cover or sit
// under: the agent, the kernel filesystems and the per-sandbox /etc files.
var reservedMountPaths = []string{"/.moat", "/proc", "/sys", "/dev", "/etc/hosts", "/etc/hostname", "/etc/resolv.conf"}

// ParseVolumes decodes the raw volumes of a create request.
func ParseVolumes(raw []json.RawMessage) ([]Volume, error) {
	out := make([]Volume, 0, len(raw))
	for i, r := range raw {
		var v Volume
		dec := json.NewDecoder(bytes.NewReader(r))
		if err := dec.Decode(&v); err != nil {
			return nil, errdefs.Invalid(codeInvalidVolume, fmt.Sprintf("volumes[%d]: %v", i, err))
		}
		out = append(out, v)
	}
	return out, nil
}

// volumeMounts validates volumes and returns the sandbox's mounts and the
// named volumes (claims) they use. Host paths are checked against the
// allow-list: allowed holds absolute directories; a host path is accepted
// if, after filepath.Clean, subPath and symlink resolution, it is one of
// them or lies beneath one (itself resolved). An empty list refuses every
// host volume. A pvc volume's subPath is only checked for shape here; the
// runtime resolves it inside the volume.
func volumeMounts(vols []Volume, allowed []string, evalSymlinks func(string) (string, error)) ([]runtime.Mount, []Claim, error) {
	names := map[string]bool{}
	dests := map[string]bool{}
	var out []runtime.Mount
	var claims []Claim
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
			return nil, nil, errdefs.Invalid(codeInvalidSubPath, fmt.Sprintf("%s.subPath %q must be a relative path inside the volume, without '..'", at, v.SubPath))
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
func pvcClaim(at string, p *PVCVolume) (Claim, error) {
	// No dots: "<tenant>.<claim>" is the runtime name of a tenant's claim.
	if !runtime.ValidVolumeName(p.ClaimName) || strings.Contains(p.ClaimName, ".") {
		return Claim{}, errdefs.Invalid(codeInvalidPVCName, fmt.Sprintf("%s.pvc.claimName %q: want a Kubernetes resource name (a-z, 0-9, '-', starting and ending alphanumeric, at most 253)", at, p.ClaimName))
	}
	c := Claim{Name: p.ClaimName, Create: p.CreateIfNotExists == nil || *p.CreateIfNotExists,
		DeleteOnTermination: p.DeleteOnSandboxTermination, StorageClass: p.StorageClass}
	if p.Storage != "" {
		n, err := parseBytes(at+".pvc.storage", p.Storage)
		if err != nil {
			return Claim{}, errdefs.Invalid(codeInvalidStorage, fmt.Sprintf("%s.pvc.storage: %q is not a size (e.g. \"512Mi\", \"1Gi\")", at, p.Storage))
		}
		if n < volume.MinQuotaBytes || n > volume.MaxQuotaBytes {
			return Claim{}, errdefs.Invalid(codeInvalidStorage, fmt.Sprintf("%s.pvc.storage: %s is out of range (16Mi to 16Ti)", at, p.Storage))
		}
		c.SizeBytes = n
	}
	if p.StorageClass != "" && !runtime.ValidVolumeName(p.StorageClass) {
		return Claim{}, errdefs.Invalid(codeInvalidVolume, fmt.Sprintf("%s.pvc.storageClass %q is not a valid name", at, p.StorageClass))
	}
	for _, m := range p.AccessModes {
		if !slices.Contains(accessModes, m) {
			return Claim{}, errdefs.Invalid(codeInvalidVolume, fmt.Sprintf("%s.pvc.accessModes: %q is not one of %s", at, m, strings.Join(accessModes, ", ")))
		}
	}
	c.AccessModes = slices.Clone(p.AccessModes)
	return c, nil
}

// mergeClaim adds c to claims; a claim mounted twice (e.g. two subPaths)
// is ensured once, with the settings of its first mount, and deleted on
// termination if any mount asks for it.
func mergeClaim(claims []Claim, c Claim) []Claim {
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
		return errdefs.WithPublic(errdefs.ErrInvalidArgument, codeHostPathNotAllowed, fmt.Sprintf("%s.host.path %q %s", at, p, why))
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
func (s *Service) volumesRuntime() (runtime.Volumes, error) {
	if v, ok := s.deps.Runtime.(runtime.Volumes); ok {
		return v, nil
	}
	return nil, errdefs.WithPublic(errdefs.ErrNotImplemented, codeUnsupportedBackend,
		fmt.Sprintf("named volumes (pvc) are not supported by the %s runtime", s.deps.Runtime.Name()))
}

// ensureClaims makes sure every claim of a sandbox being created exists:
// all are looked up first, so that a missing claim without
// createIfNotExists fails the create before anything is made, then the
// missing ones are created (and removed again if a later one fails). The
// caller holds s.volMu and has registered the sandbox, so DeleteVolume
// sees it as a user from here on. It returns the claims it created.
func (s *Service) ensureClaimsLocked(ctx context.Context, id string, claims []Claim) ([]string, error) {
	if len(claims) == 0 {
		return nil, nil
	}
	vr, err := s.volumesRuntime()
	if err != nil {
		return nil, err
	}
	var missing []Claim
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

// volumeUsersLocked returns the IDs of the live sandboxes (not Failed or
// Terminated) that mount volume name, sorted. The caller holds s.volMu.
func (s *Service) volumeUsersLocked(name string) []string {
	s.mu.RLock()
	defer s.mu.RUnlock()
	var out []string
	for id, e := range s.sandboxes {
		if !e.done.Load() && slices.Contains(e.claims, name) {
			out = append(out, id)
		}
	}
	sort.Strings(out)
	return out
}

// releaseClaims deletes the claims of e marked deleteOnSandboxTermination
// that e's create made, once e is gone, unless another sandbox uses them
// (a pre-existing volume is never deleted). Errors are logged: the
// sandbox is gone either way.
func (s *Service) releaseClaims(ctx context.Context, e *entry) {
	var names []string
	for _, c := range e.sb.Claims {
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
	s.volMu.Lock()
	defer s.volMu.Unlock()
	for _, n := range names {
		if users := s.volumeUsersLocked(n); len(users) > 0 {
			s.log.Info("volume kept: still in use", "volume", n, "sandbox", e.sb.ID, "users", users)
			continue
		}
		v, err := vr.GetVolume(ctx, n)
		if err != nil || !v.Managed {
			continue
		}
		if err := vr.DeleteVolume(ctx, n); err != nil && !errdefs.IsNotFound(err) {
			s.log.Error("delete volume on sandbox termination", "volume", n, "sandbox", e.sb.ID, "err", err)
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
func (s *Service) ListVolumes(ctx context.Context) ([]VolumeInfo, error) {
	vr, err := s.volumesRuntime()
	if err != nil {
		return nil, err
	}
	vols, err := vr.ListVolumes(ctx)
	if err != nil {
		return nil, fmt.Errorf("list volumes: %w", err)
	}
	s.volMu.Lock()
	defer s.volMu.Unlock()
	out := make([]VolumeInfo, 0, len(vols))
	for _, v := range vols {
		if !visible(ctx, volumeOwner(v.Name)) {
			continue
		}
		users := s.volumeUsersLocked(v.Name)
		v.Name = volumeDisplay(ctx, v.Name)
		out = append(out, VolumeInfo{Volume: v, Sandboxes: users})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

// GetVolume returns one named volume.
func (s *Service) GetVolume(ctx context.Context, name string) (VolumeInfo, error) {
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
	s.volMu.Lock()
	defer s.volMu.Unlock()
	users := s.volumeUsersLocked(key)
	v.Name = volumeDisplay(ctx, key)
	return VolumeInfo{Volume: v, Sandboxes: users}, nil
}

// DeleteVolume deletes a named volume and its data. A volume that a live
// sandbox (or a warm pool sandbox) mounts is refused with 409
// VOLUME::IN_USE.
func (s *Service) DeleteVolume(ctx context.Context, name string) error {
	vr, err := s.volumesRuntime()
	if err != nil {
		return err
	}
	key, ok := volumeLookup(ctx, name)
	if !ok {
		return volumeNotFound(name)
	}
	s.volMu.Lock()
	defer s.volMu.Unlock()
	if users := s.volumeUsersLocked(key); len(users) > 0 {
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

// dropCreatedClaims deletes the volumes that the failed create of e made,
// unless another sandbox has started to use them meanwhile: a sandbox
// that never came to be leaves no volume behind. The caller holds e.mu
// and e is Failed.
func (s *Service) dropCreatedClaims(ctx context.Context, e *entry) {
	if len(e.createdClaims) == 0 {
		return
	}
	vr, err := s.volumesRuntime()
	if err != nil {
		return
	}
	s.volMu.Lock()
	defer s.volMu.Unlock()
	for _, n := range e.createdClaims {
		if len(s.volumeUsersLocked(n)) > 0 {
			continue
		}
		if err := vr.DeleteVolume(context.WithoutCancel(ctx), n); err != nil && !errdefs.IsNotFound(err) {
			s.log.Error("remove volume of a failed create", "volume", n, "sandbox", e.sb.ID, "err", err)
		}
	}
	e.createdClaims = nil
}

package lifecycle

import (
	"bytes"
	"encoding/json"
	"fmt"
	"path/filepath"
	"regexp"
	"strings"

	"github.com/moat-sandbox/moat/internal/errdefs"
	"github.com/moat-sandbox/moat/internal/runtime"
)

// Volume error codes (OpenSandbox VOLUME::*).
const (
	codeHostPathNotAllowed = "VOLUME::HOST_PATH_NOT_ALLOWED"
	codeInvalidMountPath   = "VOLUME::INVALID_MOUNT_PATH"
	codeInvalidVolume      = "VOLUME::INVALID_VOLUME"
)

// Volume is one OpenSandbox volume of a create request. Only the host
// backend is implemented; pvc and ossfs are refused.
type Volume struct {
	Name      string          `json:"name"`
	MountPath string          `json:"mountPath"`
	ReadOnly  bool            `json:"readOnly"`
	SubPath   string          `json:"subPath"`
	Host      *HostVolume     `json:"host"`
	PVC       json.RawMessage `json:"pvc"`
	OSSFS     json.RawMessage `json:"ossfs"`
}

// HostVolume is the host backend of a Volume.
type HostVolume struct {
	Path string `json:"path"`
}

var volumeName = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$`)

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

// volumeMounts validates volumes against the host-path allow-list and
// returns the bind mounts. allowed holds absolute directories; a host path
// is accepted if, after filepath.Clean, subPath and symlink resolution, it
// is one of them or lies beneath one (itself resolved). An empty list
// refuses every host volume.
func volumeMounts(vols []Volume, allowed []string, evalSymlinks func(string) (string, error)) ([]runtime.Mount, error) {
	names := map[string]bool{}
	dests := map[string]bool{}
	var out []runtime.Mount
	for i, v := range vols {
		at := fmt.Sprintf("volumes[%d]", i)
		if !volumeName.MatchString(v.Name) {
			return nil, errdefs.Invalid(codeInvalidVolume, fmt.Sprintf("%s.name %q: want a DNS label (a-z, 0-9, '-', at most 63)", at, v.Name))
		}
		if names[v.Name] {
			return nil, errdefs.Invalid(codeInvalidVolume, fmt.Sprintf("%s.name %q is used twice", at, v.Name))
		}
		names[v.Name] = true
		backends := 0
		for _, set := range []bool{v.Host != nil, len(v.PVC) > 0 && string(v.PVC) != "null", len(v.OSSFS) > 0 && string(v.OSSFS) != "null"} {
			if set {
				backends++
			}
		}
		if backends != 1 {
			return nil, errdefs.Invalid(codeInvalidVolume, fmt.Sprintf("%s: exactly one of host, pvc or ossfs is required", at))
		}
		if v.Host == nil {
			return nil, errdefs.WithPublic(errdefs.ErrNotImplemented, "SANDBOX::API_NOT_SUPPORTED",
				fmt.Sprintf("%s: only host volumes are supported by this server", at))
		}
		dest, err := mountPath(at, v.MountPath)
		if err != nil {
			return nil, err
		}
		if dests[dest] {
			return nil, errdefs.Invalid(codeInvalidMountPath, fmt.Sprintf("%s.mountPath %s is used twice", at, dest))
		}
		dests[dest] = true
		src, err := hostPath(at, v.Host.Path, v.SubPath, allowed, evalSymlinks)
		if err != nil {
			return nil, err
		}
		out = append(out, runtime.Mount{Source: src, Destination: dest, ReadOnly: v.ReadOnly})
	}
	return out, nil
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
		if filepath.IsAbs(sub) || strings.ContainsRune(sub, 0) || !filepath.IsLocal(sub) {
			return "", errdefs.Invalid(codeInvalidVolume, fmt.Sprintf("%s.subPath %q must be a relative path without '..'", at, sub))
		}
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

package runtime

import (
	"fmt"
	"path"
	"path/filepath"
	"regexp"
	"strings"

	"github.com/moat-sandbox/moat/internal/errdefs"
)

// idPattern is the one sandbox ID rule: a DNS label (RFC 1123), which
// every backend can use as is (a directory name, a container name, a
// Kubernetes object name). The lifecycle's ids (lifecycle.NewID) and
// upstream's UUIDs match it.
var idPattern = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$`)

// ValidID reports whether id is a valid sandbox or checkpoint ID: 1 to 63
// characters of [a-z0-9-], starting and ending alphanumeric.
func ValidID(id string) bool { return idPattern.MatchString(id) }

// volumeNamePattern: DNS labels joined by dots (a Kubernetes resource name).
var volumeNamePattern = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`)

// ValidVolumeName reports whether name is a valid volume name: a
// Kubernetes resource name (DNS labels joined by dots), at most 253
// characters. Every backend can use it as is (a directory name, a Docker
// volume name, a PVC name); "." and ".." cannot match. Claim names of the
// API have no dots (as upstream OpenSandbox checks claimName); the
// lifecycle puts a tenant's volumes in their own namespace as
// "<tenant>.<claim>".
func ValidVolumeName(name string) bool {
	return len(name) <= 253 && volumeNamePattern.MatchString(name)
}

// CheckSubPath checks the shape of a volume subPath: relative, without
// "..", without NUL, at most 4096 bytes. The empty subPath (the volume's
// root) is fine. It is the lexical half of the confinement; the backend
// resolves the rest on the volume (internal/volume.OpenSubPath).
func CheckSubPath(sub string) error {
	if sub == "" {
		return nil
	}
	if strings.ContainsRune(sub, 0) || filepath.IsAbs(sub) || !filepath.IsLocal(sub) || len(sub) > 4096 {
		return fmt.Errorf("subPath %q must be a relative path inside the volume, without '..': %w", sub, errdefs.ErrInvalidArgument)
	}
	for p := range strings.SplitSeq(sub, "/") {
		if p == ".." {
			return fmt.Errorf("subPath %q must not contain '..': %w", sub, errdefs.ErrInvalidArgument)
		}
	}
	return nil
}

// MinMemoryBytes is the smallest memory limit a sandbox may have (the
// agent alone needs a few MiB). Backends may require more.
const MinMemoryBytes = 4 << 20

// AgentDir is the directory inside every sandbox that belongs to moat
// (the agent binary and its config); no mount may cover it.
const AgentDir = "/.moat"

// Invalid returns an ErrInvalidArgument whose message is safe for API
// clients. The API edge picks the wire code from the class.
func Invalid(format string, args ...any) error {
	return errdefs.Newf(errdefs.ErrInvalidArgument, format, args...)
}

// Validate checks the rules every backend shares: the ID rule, an image,
// non-negative resources with at least MinMemoryBytes of memory, an
// absolute working directory, environment names, label keys, and the
// shape of mounts (absolute clean destinations that cover neither / nor
// AgentDir; a host path or a volume, never both). A backend calls it
// first in Create and adds only its own extras (its classes, larger
// minimums, whether a host path exists). Errors are ErrInvalidArgument
// with a public message.
func (s *Spec) Validate() error {
	if !ValidID(s.ID) {
		return Invalid("invalid sandbox id %q", s.ID)
	}
	if s.Image == "" {
		return Invalid("image is required")
	}
	res := s.Resources
	if res.CPUMillis < 0 || res.MemoryBytes < 0 || res.PidsLimit < 0 || res.DiskBytes < 0 {
		return Invalid("resource limits must not be negative")
	}
	if res.MemoryBytes != 0 && res.MemoryBytes < MinMemoryBytes {
		return Invalid("memory limit must be at least %d MiB", MinMemoryBytes>>20)
	}
	if s.WorkingDir != "" && !path.IsAbs(s.WorkingDir) {
		return Invalid("working directory must be absolute")
	}
	for k := range s.Env {
		if k == "" || strings.ContainsAny(k, "=\x00") {
			return Invalid("invalid environment variable name %q", k)
		}
	}
	for k := range s.Labels {
		if k == "" {
			return Invalid("label keys must not be empty")
		}
	}
	for _, m := range s.Mounts {
		if err := m.validate(); err != nil {
			return err
		}
	}
	return nil
}

// validate checks one mount's shape (see Spec.Validate).
func (m Mount) validate() error {
	d := m.Destination
	if !path.IsAbs(d) || path.Clean(d) != d || d == "/" || d == AgentDir || strings.HasPrefix(d, AgentDir+"/") ||
		strings.ContainsRune(d, 0) {
		return Invalid("invalid mount destination %q", d)
	}
	if m.Volume != "" {
		if m.Source != "" || !ValidVolumeName(m.Volume) || CheckSubPath(m.SubPath) != nil {
			return Invalid("invalid volume mount %s (subPath %q) -> %s", m.Volume, m.SubPath, d)
		}
		return nil
	}
	if m.SubPath != "" || !filepath.IsAbs(m.Source) || filepath.Clean(m.Source) != m.Source || strings.ContainsRune(m.Source, 0) {
		return Invalid("invalid mount %s -> %s", m.Source, d)
	}
	return nil
}

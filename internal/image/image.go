// Package image is moat's local image store. Layers, pulled or imported,
// are extracted once into overlayfs-ready trees (layers/sha256/<diffid>)
// that every sandbox shares read-only; compressed blobs are not kept, as
// a layer is hashed and extracted in one pass. A tree appears under its
// name only complete and checked (extracted in tmp/, then renamed), so its
// presence is the cache test. Several processes may share one root.
package image

import (
	"errors"
	"time"
)

// Reasons the store gives for some failures, each wrapped together with an
// errdefs class. The store speaks classes only; the API edge answers these
// reasons with their own wire codes (IMAGE::...).
var (
	// ErrInvalidReference: a reference that does not parse (with
	// errdefs.ErrInvalidArgument).
	ErrInvalidReference = errors.New("invalid image reference")
	// ErrUnknownImage: no image of that name or ID in the store (with
	// errdefs.ErrNotFound).
	ErrUnknownImage = errors.New("image not in the store")
	// ErrRegistryNotAllowed: the registry is outside the allowed ones
	// (with errdefs.ErrPermissionDenied).
	ErrRegistryNotAllowed = errors.New("registry not allowed")
	// ErrPull: a pull failed at the registry or on the way (with the class
	// of the failure).
	ErrPull = errors.New("pull failed")
)

// Config is the runtime-relevant part of an OCI image config.
type Config struct {
	Env        []string `json:"env,omitempty"`
	Entrypoint []string `json:"entrypoint,omitempty"`
	Cmd        []string `json:"cmd,omitempty"`
	WorkingDir string   `json:"workingDir,omitempty"`
	User       string   `json:"user,omitempty"`
}

// Image is a locally stored image.
type Image struct {
	// Name is the normalized reference the image is stored under
	// (e.g. "127.0.0.1:5000/busybox:latest" or
	// "index.docker.io/library/busybox:latest"); see NormalizeName.
	Name string `json:"name"`
	// ID is the image config digest ("sha256:...").
	ID string `json:"id"`
	// Digest is the manifest digest, if pulled from a registry or imported
	// from a docker-save tarball or OCI layout.
	Digest string `json:"digest,omitempty"`
	// Layers are the layer diff IDs ("sha256:..."), bottom first.
	Layers []string `json:"layers"`
	Config Config   `json:"config"`
	// Size is the sum of the uncompressed layer sizes in bytes.
	Size int64 `json:"size"`
	// CreatedAt is when the image was stored locally.
	CreatedAt time.Time `json:"createdAt"`
	// LastUsed is when a Prune last saw a sandbox use the image (zero:
	// never); Prune evicts the least recently used first.
	LastUsed time.Time `json:"lastUsed,omitzero"`
}

// Auth is registry credentials for one pull.
type Auth struct {
	Username string `json:"username,omitempty"`
	Password string `json:"password,omitempty"`
}

// Progress reports pull progress (for CLI progress bars). Reports for one
// layer are sequential; reports for different layers may interleave and
// come from different goroutines.
type Progress struct {
	Layer    string // diff ID or digest being fetched
	Complete int64  // bytes done
	Total    int64  // bytes total (0 if unknown)
	Done     bool   // this layer is finished
	Cached   bool   // the layer was already extracted; nothing was fetched
}

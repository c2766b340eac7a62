// Package image is moat's local image store: a content-addressed layer store
// on disk, filled by pulling from OCI registries (go-containerregistry) or by
// importing a rootfs directory, a rootfs tarball, a `docker save` tarball or
// an OCI image layout, with layers extracted once and shared read-only by
// every sandbox through overlayfs.
//
// # On-disk layout
//
// Under the store root:
//
//	blobs/sha256/<hex>         image configs and manifests (as pulled or built)
//	layers/sha256/<diffid>/    extracted layer trees, overlayfs-ready (whiteouts converted)
//	index.json                 name -> image record, plus per-layer metadata
//	index.lock                 flock(2) serialising index read-modify-write across processes
//	gc.lock                    flock(2): shared by writers of new layers, exclusive for GC
//	tmp/                       staging; cleaned on Open
//
// Compressed layer blobs are not retained: a layer is streamed from the
// registry, decompressed, hashed and extracted in one pass, so the extracted
// tree is the only copy. A layer directory exists under layers/ only once it
// is complete and its content matched its diff ID (it is extracted into tmp/
// and renamed into place), so its presence is the "already extracted" test.
//
// # Names
//
// Image names are registry references normalized by go-containerregistry:
// "busybox" and "busybox:latest" both become "index.docker.io/library/busybox:latest",
// "127.0.0.1:5000/x" becomes "127.0.0.1:5000/x:latest". Import uses the same
// rule, so an imported "busybox:latest" satisfies a later Ensure("busybox")
// without touching the network. Get and Remove also accept an image ID
// ("sha256:<hex>") or an unambiguous prefix of at least 6 hex digits.
//
// # Concurrency and garbage collection
//
// A Store is safe for concurrent use, and several processes (the server and
// the CLI) may share one root: index updates are atomic (write tmp + rename)
// under index.lock. Concurrent pulls of one reference, and concurrent fetches
// of one layer, are collapsed into one download; a waiter that gives up
// (context cancelled) does not cancel the download for the others, and the
// download is cancelled only when every waiter has gone.
//
// Remove deletes a name and then collects layers no longer referenced by any
// image. A layer is never collected while it is in use: the runtime either
// holds a Lease (Acquire ... Release) for as long as a sandbox mounts the
// layers, or supplies Options.InUse, which is consulted for every candidate
// layer (this covers sandboxes re-adopted after a restart, when in-memory
// leases are gone). Collection is skipped, and retried by the next GC,
// Remove or Open, while any pull, import or commit is in progress (gc.lock).
//
// # Privileges
//
// Faithful extraction (ownership, device nodes, trusted.overlay.* xattrs for
// opaque directories, security.* xattrs) needs root. Without root, ownership
// and block/char devices are skipped, opaque directories are marked with
// user.overlay.opaque (mount overlay with "userxattr" in a user namespace),
// and whiteouts still work (kernels >= 5.8 allow unprivileged 0:0 nodes).
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
	// "index.docker.io/library/busybox:latest"); see the package doc.
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

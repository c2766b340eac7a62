// Package image is moat's local image store: a content-addressed layer store
// on disk, filled by pulling from OCI registries (go-containerregistry) or by
// importing a rootfs directory or tarball, with layers extracted once and
// shared read-only by every sandbox through overlayfs.
//
// On-disk layout under Root:
//
//	blobs/sha256/<hex>         compressed layer blobs, manifests, configs (as pulled)
//	layers/sha256/<diffid>/    extracted layer trees, overlayfs-ready (whiteouts converted)
//	images.json / index        name -> image record
//	tmp/                       staging; cleaned on Open
//
// Layers are deduplicated by diff ID; concurrent pulls of the same reference
// or layer are collapsed into one download.
package image

import (
	"time"
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
	// (e.g. "127.0.0.1:5000/busybox:latest" or "local/busybox:latest").
	Name string `json:"name"`
	// ID is the image config digest ("sha256:...").
	ID string `json:"id"`
	// Digest is the manifest digest, if pulled from a registry.
	Digest string `json:"digest,omitempty"`
	// Layers are the layer diff IDs, bottom first.
	Layers []string `json:"layers"`
	Config Config   `json:"config"`
	// Size is the sum of the uncompressed layer sizes in bytes.
	Size      int64     `json:"size"`
	CreatedAt time.Time `json:"createdAt"`
}

// Auth is registry credentials for one pull.
type Auth struct {
	Username string `json:"username,omitempty"`
	Password string `json:"password,omitempty"`
}

// Progress reports pull progress (for CLI progress bars).
type Progress struct {
	Layer    string // diff ID or digest being fetched
	Complete int64  // bytes done
	Total    int64  // bytes total (0 if unknown)
	Done     bool   // this layer is finished
}

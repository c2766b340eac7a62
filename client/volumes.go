package client

import (
	"context"
	"net/http"
	"net/url"
	"time"
)

// Volume is a mount of a create request (OpenSandbox's Volume): exactly
// one of Host or PVC. MountPath is absolute.
type Volume struct {
	// Name is a DNS label, unique in the request.
	Name      string `json:"name"`
	MountPath string `json:"mountPath"`
	ReadOnly  bool   `json:"readOnly,omitempty"`
	// SubPath mounts a directory inside the volume instead of its root.
	SubPath string      `json:"subPath,omitempty"`
	Host    *HostVolume `json:"host,omitempty"`
	PVC     *PVCVolume  `json:"pvc,omitempty"`
}

// HostVolume is a host directory; the server must allow it
// (`moat serve --allow-host-path`).
type HostVolume struct {
	Path string `json:"path"`
}

// PVCVolume is a named volume of the server's runtime (a moat-managed
// volume, a Docker named volume, a Kubernetes PersistentVolumeClaim).
type PVCVolume struct {
	ClaimName string `json:"claimName"`
	// CreateIfNotExists defaults to true on the server; set it to a false
	// value to require an existing volume.
	CreateIfNotExists *bool `json:"createIfNotExists,omitempty"`
	// DeleteOnSandboxTermination deletes the volume with the sandbox, if
	// this create made it and no other sandbox uses it then.
	DeleteOnSandboxTermination bool `json:"deleteOnSandboxTermination,omitempty"`
	// Storage is the capacity of a created volume ("1Gi").
	Storage      string   `json:"storage,omitempty"`
	StorageClass string   `json:"storageClass,omitempty"`
	AccessModes  []string `json:"accessModes,omitempty"`
}

// NamedVolume is a named volume as the volume API reports it.
type NamedVolume struct {
	Name string `json:"name"`
	// CapacityBytes is the enforced capacity (0: none).
	CapacityBytes int64 `json:"capacityBytes,omitempty"`
	// UsedBytes is the host storage it occupies, where known.
	UsedBytes int64     `json:"usedBytes,omitempty"`
	CreatedAt time.Time `json:"createdAt"`
	// Managed: moat created it (and may delete it).
	Managed bool `json:"managed"`
	// Sandboxes are the live sandboxes that mount it.
	Sandboxes    []string          `json:"sandboxes"`
	StorageClass string            `json:"storageClass,omitempty"`
	AccessModes  []string          `json:"accessModes,omitempty"`
	Labels       map[string]string `json:"labels,omitempty"`
}

func volumePath(name string) string { return "/volumes/" + url.PathEscape(name) }

// ListVolumes returns the server's named volumes, sorted by name.
func (c *Client) ListVolumes(ctx context.Context) ([]NamedVolume, error) {
	var out struct {
		Items []NamedVolume `json:"items"`
	}
	if err := c.lc.json(ctx, &call{method: http.MethodGet, path: "/volumes"}, nil, &out); err != nil {
		return nil, err
	}
	return out.Items, nil
}

// GetVolume returns one named volume (404 VOLUME::NOT_FOUND if missing).
func (c *Client) GetVolume(ctx context.Context, name string) (*NamedVolume, error) {
	var v NamedVolume
	if err := c.lc.json(ctx, &call{method: http.MethodGet, path: volumePath(name)}, nil, &v); err != nil {
		return nil, err
	}
	return &v, nil
}

// DeleteVolume deletes a named volume and its data; 409 VOLUME::IN_USE
// while a sandbox mounts it.
func (c *Client) DeleteVolume(ctx context.Context, name string) error {
	return c.lc.json(ctx, &call{method: http.MethodDelete, path: volumePath(name)}, nil, nil)
}

package lifecycle

import (
	"bytes"
	"encoding/json"
	"fmt"

	"github.com/moat-sandbox/moat/internal/errdefs"
)

// Volume error codes the core answers itself (the volumes feature has the
// rest of OpenSandbox's VOLUME::* codes).
const (
	CodeHostPathNotAllowed = "VOLUME::HOST_PATH_NOT_ALLOWED"
	CodeInvalidVolume      = "VOLUME::INVALID_VOLUME"
	CodeInvalidSubPath     = "VOLUME::INVALID_SUB_PATH"
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

// ParseVolumes decodes the raw volumes of a create request.
func ParseVolumes(raw []json.RawMessage) ([]Volume, error) {
	out := make([]Volume, 0, len(raw))
	for i, r := range raw {
		var v Volume
		dec := json.NewDecoder(bytes.NewReader(r))
		if err := dec.Decode(&v); err != nil {
			return nil, errdefs.Invalid(CodeInvalidVolume, fmt.Sprintf("volumes[%d]: %v", i, err))
		}
		out = append(out, v)
	}
	return out, nil
}

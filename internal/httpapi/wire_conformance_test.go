package httpapi

import (
	"testing"
	"time"

	"github.com/moat-sandbox/moat/internal/gen/lifecycleapi"
	"github.com/moat-sandbox/moat/internal/gen/wirecheck"
	"github.com/moat-sandbox/moat/internal/lifecycle"
	"github.com/moat-sandbox/moat/internal/lifecycle/mounts"
	"github.com/moat-sandbox/moat/internal/lifecycle/pool"
	"github.com/moat-sandbox/moat/internal/lifecycle/snapshot"
	"github.com/moat-sandbox/moat/internal/runtime"
)

// The tests below hold the hand-written wire types of this package to the
// models generated from api/openapi/lifecycle.yaml: a field added, renamed
// or retyped on one side only fails here. Each response converter runs on a
// fully populated value and on a minimal one, so both every optional field
// and the omission of unset ones are checked.

var (
	wireT0 = time.Date(2026, 3, 4, 5, 6, 7, 891_000_000, time.UTC)
	wireT1 = wireT0.Add(time.Hour)
)

func fullSandbox() lifecycle.Sandbox {
	return lifecycle.Sandbox{
		ID: "sb1", Image: "busybox", SnapshotID: "snap1", Entrypoint: []string{"sh"},
		Metadata: map[string]string{"app": "x"}, Platform: &lifecycle.Platform{OS: "linux", Arch: "amd64"},
		Status:    lifecycle.Status{State: lifecycle.StateRunning, Reason: "RUNNING", Message: "ok", LastTransitionAt: wireT0},
		CreatedAt: wireT0, ExpiresAt: &wireT1,
	}
}

func minimalSandbox() lifecycle.Sandbox {
	return lifecycle.Sandbox{ID: "sb2", Status: lifecycle.Status{State: lifecycle.StatePending}, CreatedAt: wireT0}
}

func TestWireSandboxResponses(t *testing.T) {
	for name, sb := range map[string]lifecycle.Sandbox{"full": fullSandbox(), "minimal": minimalSandbox()} {
		wirecheck.Response[lifecycleapi.Sandbox](t, name+" Sandbox", toJSON(sb))
		wirecheck.Response[lifecycleapi.CreateSandboxResponse](t, name+" CreateSandboxResponse", createResponse(sb))
	}
	list := listSandboxesResponse{Items: []sandboxJSON{toJSON(fullSandbox()), toJSON(minimalSandbox())}, Pagination: pagination(1, 2, 3)}
	wirecheck.Response[lifecycleapi.ListSandboxesResponse](t, "ListSandboxesResponse", list)
	empty := listSandboxesResponse{Items: []sandboxJSON{}, Pagination: pagination(1, 10, 0)}
	wirecheck.Response[lifecycleapi.ListSandboxesResponse](t, "empty ListSandboxesResponse", empty)
	wirecheck.Response[lifecycleapi.RenewSandboxExpirationResponse](t, "RenewSandboxExpirationResponse", renewResponse{ExpiresAt: ts(wireT1)})
	wirecheck.Response[lifecycleapi.Endpoint](t, "Endpoint", endpointJSON{Endpoint: "10.0.0.2:44772", Headers: map[string]string{"X-EXECD-ACCESS-TOKEN": "t"}})
	wirecheck.Response[lifecycleapi.Endpoint](t, "Endpoint without headers", endpointJSON{Endpoint: "10.0.0.2:8000"})
}

func TestWireSnapshotResponses(t *testing.T) {
	full := snapshot.Snapshot{ID: "sn1", SandboxID: "sb1", Name: "n", CreatedAt: wireT0, Image: "local/x",
		Status: snapshot.SnapshotStatus{State: snapshot.SnapshotReady, Reason: "snapshot_ready", Message: "m", LastTransitionAt: wireT0}}
	minimal := snapshot.Snapshot{ID: "sn2", SandboxID: "sb1", CreatedAt: wireT0, Status: snapshot.SnapshotStatus{State: snapshot.SnapshotCreating}}
	for name, sn := range map[string]snapshot.Snapshot{"full": full, "minimal": minimal} {
		wirecheck.Response[lifecycleapi.Snapshot](t, name+" Snapshot", snapshotToJSON(sn))
	}
	list := lifecycleapi.ListSnapshotsResponse{Items: []lifecycleapi.Snapshot{snapshotToJSON(full), snapshotToJSON(minimal)},
		Pagination: pagination(2, 1, 3)}
	wirecheck.Response[lifecycleapi.ListSnapshotsResponse](t, "ListSnapshotsResponse", list)
}

func TestWirePoolResponses(t *testing.T) {
	capacity := pool.Capacity{BufferMin: 1, BufferMax: 2, PoolMin: 0, PoolMax: 4}
	img := pool.Pool{Name: "p1", CreatedAt: wireT0, Capacity: capacity, Template: pool.PoolTemplate{
		Image: "busybox", Entrypoint: []string{"sh"}, Env: map[string]string{"A": "b"},
		ResourceLimits: map[string]string{"cpu": "1"}, Extensions: map[string]string{"moat.runtime": "crun", "other": "v"},
		Volumes: []lifecycle.Volume{{Name: "d", MountPath: "/d", ReadOnly: true, SubPath: "s", PVC: &lifecycle.PVCVolume{ClaimName: "c", Storage: "1Gi",
			DeleteOnSandboxTermination: true, StorageClass: "std", AccessModes: []string{"ReadWriteMany"}}},
			{Name: "h", MountPath: "/h", Host: &lifecycle.HostVolume{Path: "/srv"}}}}}
	fork := pool.Pool{Name: "p2", CreatedAt: wireT0, Capacity: capacity, Template: pool.PoolTemplate{SnapshotID: "sn1"}}
	st := pool.PoolStatus{Total: 3, Allocated: 1, Available: 2, Revision: 7}
	for name, p := range map[string]pool.Pool{"image": img, "fork": fork} {
		wirecheck.Response[lifecycleapi.Pool](t, name+" Pool", poolOut(p, st))
	}
}

func TestWireVolumeResponses(t *testing.T) {
	full := mounts.VolumeInfo{Volume: runtime.Volume{Name: "v1", SizeBytes: 1 << 30, UsedBytes: 4096, CreatedAt: wireT0, Managed: true,
		Labels: map[string]string{"k": "v"}, StorageClass: "std", AccessModes: []string{"ReadWriteOnce"}}, Sandboxes: []string{"sb1"}}
	minimal := mounts.VolumeInfo{Volume: runtime.Volume{Name: "v2", CreatedAt: wireT0}}
	for name, v := range map[string]mounts.VolumeInfo{"full": full, "minimal": minimal} {
		wirecheck.Response[lifecycleapi.NamedVolume](t, name+" NamedVolume", volumeOut(v))
	}
	wirecheck.Response[lifecycleapi.ListVolumesResponse](t, "ListVolumesResponse",
		lifecycleapi.ListVolumesResponse{Items: []lifecycleapi.NamedVolume{volumeOut(full), volumeOut(minimal)}})
}

func TestWireRequests(t *testing.T) {
	wirecheck.Request[createSandboxRequest, lifecycleapi.CreateSandboxRequest](t, "CreateSandboxRequest")
	wirecheck.Request[batchRequest, lifecycleapi.BatchCreateSandboxRequest](t, "BatchCreateSandboxRequest")
	wirecheck.Request[renewRequest, lifecycleapi.RenewSandboxExpirationRequest](t, "RenewSandboxExpirationRequest")
	wirecheck.Request[poolRequest, lifecycleapi.CreatePoolRequest](t, "CreatePoolRequest")
}

func TestWireStatesAreSpecEnums(t *testing.T) {
	for _, s := range []lifecycle.State{lifecycle.StatePending, lifecycle.StateRunning, lifecycle.StatePausing, lifecycle.StatePaused,
		lifecycle.StateResuming, lifecycle.StateStopping, lifecycle.StateTerminated, lifecycle.StateFailed} {
		if !lifecycleapi.SandboxState(s).Valid() {
			t.Errorf("sandbox state %s is not in the spec's SandboxState enum", s)
		}
	}
	for _, s := range []snapshot.SnapshotState{snapshot.SnapshotCreating, snapshot.SnapshotDeleting, snapshot.SnapshotReady, snapshot.SnapshotFailed} {
		if !lifecycleapi.SnapshotState(s).Valid() {
			t.Errorf("snapshot state %s is not in the spec's SnapshotState enum", s)
		}
	}
}

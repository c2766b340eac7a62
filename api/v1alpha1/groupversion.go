// Package v1alpha1 holds the Kubernetes API types served by `moat
// controller`: OpenSandbox's sandbox.opensandbox.io/v1alpha1 resources,
// with OpenSandbox's schemas, so that manifests and tools written for
// OpenSandbox's controller work unchanged:
//
//   - Pool: warm sandbox pods kept ready from a pod template, sized by
//     capacitySpec{bufferMin,bufferMax,poolMin,poolMax};
//   - BatchSandbox: a claim of N sandboxes, served from a pool (poolRef) or
//     created from a template, with per-index shard patches, an optional
//     task per sandbox (taskTemplate) and an expiry;
//   - SandboxSnapshot: a snapshot request for a sandbox.
//
// The CRD manifests under config/crd and the deepcopy functions in
// zz_generated.deepcopy.go are generated from these types by controller-gen
// (see `make generate-k8s`); never edit them by hand.
//
// +kubebuilder:object:generate=true
// +groupName=sandbox.opensandbox.io
package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// Group is the API group of the sandbox resources (OpenSandbox's).
const Group = "sandbox.opensandbox.io"

// GroupVersion is the group and version of the types in this package.
var GroupVersion = schema.GroupVersion{Group: Group, Version: "v1alpha1"}

// AddToScheme registers Pool, BatchSandbox and SandboxSnapshot (and their
// lists) with s.
func AddToScheme(s *runtime.Scheme) error {
	s.AddKnownTypes(GroupVersion,
		&Pool{}, &PoolList{},
		&BatchSandbox{}, &BatchSandboxList{},
		&SandboxSnapshot{}, &SandboxSnapshotList{},
	)
	metav1.AddToGroupVersion(s, GroupVersion)
	return nil
}

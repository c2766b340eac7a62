// Package v1alpha1 holds the Kubernetes API types of moat's sandbox
// controller (`moat controller`): Pool, a set of warm sandbox pods kept
// ready from a template, and BatchSandbox, a claim of N sandboxes served
// from a pool (or created cold from a template).
//
// The CRD manifests under config/crd and the deepcopy functions in
// zz_generated.deepcopy.go are generated from these types by controller-gen
// (see `make generate-k8s`); never edit them by hand.
//
// +kubebuilder:object:generate=true
// +groupName=sandbox.moat.dev
package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// Group is the API group of moat's custom resources.
const Group = "sandbox.moat.dev"

// GroupVersion is the group and version of the types in this package.
var GroupVersion = schema.GroupVersion{Group: Group, Version: "v1alpha1"}

// AddToScheme registers Pool and BatchSandbox (and their lists) with s.
func AddToScheme(s *runtime.Scheme) error {
	s.AddKnownTypes(GroupVersion,
		&Pool{}, &PoolList{},
		&BatchSandbox{}, &BatchSandboxList{},
	)
	metav1.AddToGroupVersion(s, GroupVersion)
	return nil
}

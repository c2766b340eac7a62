package kubernetes_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/moat-sandbox/moat/internal/egress/policy"
	"github.com/moat-sandbox/moat/internal/errdefs"
	"github.com/moat-sandbox/moat/internal/runtime"
	"github.com/moat-sandbox/moat/internal/runtime/kubernetes"
)

// TestEgressValidate: a policy, and the Credential Vault's proxy, are
// enforced by the egress sidecar on the default class only; under a sandbox runtime (gVisor) it is refused as
// not implemented, never accepted and left unenforced, and a policy that
// does not compile is the caller's error.
func TestEgressValidate(t *testing.T) {
	cfg := kubernetes.Config{Classes: []string{"runsc"}}
	deny := &runtime.Egress{Token: "t", Policy: policy.NetworkPolicy{DefaultAction: policy.Deny}}
	spec := runtime.Spec{ID: "sb-1", Image: "busybox", Egress: deny}
	if err := kubernetes.Validate(cfg, spec); err != nil {
		t.Errorf("default class with a policy: %v", err)
	}
	spec.Class = "runsc"
	if err := kubernetes.Validate(cfg, spec); !errors.Is(err, errdefs.ErrNotImplemented) {
		t.Errorf("runsc with a policy: %v, want ErrNotImplemented", err)
	}
	spec.Egress = &runtime.Egress{Token: "t", Policy: policy.NetworkPolicy{DefaultAction: policy.Deny}, CredentialProxy: true}
	if err := kubernetes.Validate(cfg, spec); !errors.Is(err, errdefs.ErrNotImplemented) || !strings.Contains(err.Error(), "credentialProxy") {
		t.Errorf("runsc with credentialProxy: %v, want ErrNotImplemented naming credentialProxy", err)
	}
	spec.Class = ""
	if err := kubernetes.Validate(cfg, spec); err != nil {
		t.Errorf("default class with credentialProxy: %v", err)
	}
	spec.Class, spec.Egress = "runsc", nil
	if err := kubernetes.Validate(cfg, spec); err != nil {
		t.Errorf("runsc without a policy: %v", err)
	}
	spec.Class, spec.Egress = "", &runtime.Egress{Token: "t", Policy: policy.NetworkPolicy{DefaultAction: "maybe"}}
	if err := kubernetes.Validate(cfg, spec); !errdefs.IsInvalidArgument(err) {
		t.Errorf("a policy that does not compile: %v, want invalid argument", err)
	}
}

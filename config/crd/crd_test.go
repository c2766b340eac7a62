package crd

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"
)

func TestObjects(t *testing.T) {
	objs, err := Objects()
	if err != nil {
		t.Fatal(err)
	}
	names := map[string]bool{}
	for _, o := range objs {
		names[o.Name] = true
	}
	for _, want := range []string{"pools.sandbox.opensandbox.io", "batchsandboxes.sandbox.opensandbox.io", "sandboxsnapshots.sandbox.opensandbox.io"} {
		if !names[want] {
			t.Errorf("missing CRD %s (have %v)", want, names)
		}
	}
}

// TestHelmChartInSync: the chart ships the generated CRDs and RBAC rules
// unchanged (make generate-k8s copies them).
func TestHelmChartInSync(t *testing.T) {
	files, _ := filepath.Glob("bases/*.yaml")
	if len(files) == 0 {
		t.Fatal("no CRDs in bases/")
	}
	for _, f := range files {
		want, _ := os.ReadFile(f)
		got, err := os.ReadFile(filepath.Join("../../deploy/helm/moat/crds", filepath.Base(f)))
		if err != nil || !bytes.Equal(got, want) {
			t.Errorf("deploy/helm/moat/crds/%s differs from config/crd/%s (run make generate-k8s): %v", filepath.Base(f), f, err)
		}
	}
	role, _ := os.ReadFile("../rbac/role.yaml")
	chart, _ := os.ReadFile("../../deploy/helm/moat/templates/clusterrole.yaml")
	i, j := bytes.Index(role, []byte("rules:")), bytes.Index(chart, []byte("rules:"))
	if i < 0 || j < 0 || !bytes.Equal(role[i:], chart[j:]) {
		t.Error("deploy/helm/moat/templates/clusterrole.yaml rules differ from config/rbac/role.yaml (run make generate-k8s)")
	}
}

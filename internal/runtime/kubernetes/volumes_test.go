package kubernetes_test

import (
	"context"
	"errors"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	sbv1 "github.com/moat-sandbox/moat/api/v1alpha1"
	"github.com/moat-sandbox/moat/internal/errdefs"
	"github.com/moat-sandbox/moat/internal/runtime"
	"github.com/moat-sandbox/moat/internal/testutil/k8stest"
)

// TestVolumePodSpec: a named volume is a PVC of the namespace (size,
// class, access modes), the sandbox's pod mounts it with subPath and
// readOnly, a missing claim fails the create at once, and a claim in use
// is not deleted.
func TestVolumePodSpec(t *testing.T) {
	k8stest.Require(t, env)
	startController(t)
	ns := namespace(t)
	rt := newRuntime(t, ns)
	ctx := context.Background()
	c := adminClient(t)
	v, err := rt.CreateVolume(ctx, runtime.VolumeSpec{Name: "work", SizeBytes: 2 << 30, StorageClass: "fast",
		AccessModes: []string{"ReadWriteMany"}, Labels: map[string]string{"moat.dev/created-by-sandbox": "x"}})
	if err != nil {
		t.Fatal(err)
	}
	if !v.Managed || v.SizeBytes != 2<<30 || v.StorageClass != "fast" || len(v.AccessModes) != 1 || v.Labels["moat.dev/created-by-sandbox"] != "x" {
		t.Fatalf("created %+v", v)
	}
	var pvc corev1.PersistentVolumeClaim
	if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: "work"}, &pvc); err != nil {
		t.Fatal(err)
	}
	if q := pvc.Spec.Resources.Requests[corev1.ResourceStorage]; q.Value() != 2<<30 || *pvc.Spec.StorageClassName != "fast" || pvc.Spec.AccessModes[0] != corev1.ReadWriteMany {
		t.Fatalf("pvc spec %+v", pvc.Spec)
	}
	// A PVC made by hand is mounted but never deleted by moat.
	foreign := &corev1.PersistentVolumeClaim{ObjectMeta: pvc.ObjectMeta, Spec: pvc.Spec}
	foreign.ObjectMeta = metaOf(ns, "by-hand")
	if err := c.Create(ctx, foreign); err != nil {
		t.Fatal(err)
	}
	if err := rt.DeleteVolume(ctx, "by-hand"); !errdefsIsPermission(err) {
		t.Fatalf("delete of a foreign PVC: %v", err)
	}

	if _, err := rt.Create(ctx, runtime.Spec{ID: "vol-missing", Image: "busybox:test", Mounts: []runtime.Mount{{Volume: "nope", Destination: "/d"}}}); !errdefs.IsNotFound(err) {
		t.Fatalf("create with a missing claim: %v", err)
	}
	spec := runtime.Spec{ID: "vol-1", Image: "busybox:test", Entrypoint: []string{"sleep", "1000"}, Mounts: []runtime.Mount{
		{Volume: "work", Destination: "/data"}, {Volume: "work", SubPath: "a/b", Destination: "/sub", ReadOnly: true},
		{Volume: "by-hand", Destination: "/hand"}}}
	if _, err := rt.Create(ctx, spec); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rt.Delete(context.Background(), spec.ID) })
	waitRunning(t, rt, spec.ID)
	var b sbv1.BatchSandbox
	if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: spec.ID}, &b); err != nil {
		t.Fatal(err)
	}
	var pod corev1.Pod
	if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: b.AllocatedPods()[0]}, &pod); err != nil {
		t.Fatal(err)
	}
	claims := map[string]corev1.Volume{}
	for _, v := range pod.Spec.Volumes {
		if v.PersistentVolumeClaim != nil {
			claims[v.Name] = v
		}
	}
	mounts := map[string]corev1.VolumeMount{}
	for _, m := range pod.Spec.Containers[0].VolumeMounts {
		mounts[m.MountPath] = m
	}
	sub, data := mounts["/sub"], mounts["/data"]
	if claims[data.Name].PersistentVolumeClaim == nil || claims[data.Name].PersistentVolumeClaim.ClaimName != "work" || data.ReadOnly ||
		sub.SubPath != "a/b" || !sub.ReadOnly || claims[sub.Name].PersistentVolumeClaim.ClaimName != "work" || !claims[sub.Name].PersistentVolumeClaim.ReadOnly ||
		claims[mounts["/hand"].Name].PersistentVolumeClaim == nil {
		t.Fatalf("pod volumes %+v, mounts %+v", pod.Spec.Volumes, pod.Spec.Containers[0].VolumeMounts)
	}
	if err := rt.DeleteVolume(ctx, "work"); !errdefs.IsFailedPrecondition(err) {
		t.Fatalf("delete in use: %v", err)
	}
	if v, err := rt.GetVolume(ctx, "work"); err != nil || len(v.Users) != 1 || v.Users[0] != spec.ID {
		t.Fatalf("users %+v %v", v, err)
	}
	if err := rt.Delete(ctx, spec.ID); err != nil {
		t.Fatal(err)
	}
	if err := rt.DeleteVolume(ctx, "work"); err != nil {
		t.Fatal(err)
	}
	if _, err := rt.GetVolume(ctx, "work"); !errdefs.IsNotFound(err) {
		t.Fatalf("after delete: %v", err)
	}
}

func metaOf(ns, name string) metav1.ObjectMeta { return metav1.ObjectMeta{Namespace: ns, Name: name} }

func errdefsIsPermission(err error) bool { return errors.Is(err, errdefs.ErrPermissionDenied) }

package kubernetes

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	sbv1 "github.com/moat-sandbox/moat/api/v1alpha1"
	"github.com/moat-sandbox/moat/internal/errdefs"
	"github.com/moat-sandbox/moat/internal/runtime"
)

// Named volumes (runtime.Volumes) are PersistentVolumeClaims in the
// sandboxes' namespace, named after the claim, as upstream OpenSandbox maps
// its pvc backend. Those moat creates carry labelScope (a PVC made by hand
// can be mounted but is never deleted by moat); VolumeSpec.Labels travel as
// one annotation. A sandbox's mounts become the pod's persistentVolumeClaim
// volumes and the container's volumeMounts (subPath and readOnly included:
// the kubelet resolves subPath inside the volume). A sandbox with volumes
// is never served from a pool (its pods have none).

const (
	annoVolumeLabels = "moat." + sbv1.Group + "/volume-labels"
	// DefaultVolumeSize is the request of a PVC created without a size
	// (upstream's volume_default_size).
	DefaultVolumeSize = 1 << 30
	volumePrefix      = "moat-vol-"
)

var _ runtime.Volumes = (*Runtime)(nil)

func volumeNotFound(name string) error {
	return fmt.Errorf("volume %q: %w", name, errdefs.ErrNotFound)
}

// CreateVolume implements runtime.Volumes.
func (r *Runtime) CreateVolume(ctx context.Context, spec runtime.VolumeSpec) (runtime.Volume, error) {
	if !runtime.ValidVolumeName(spec.Name) || spec.SizeBytes < 0 {
		return runtime.Volume{}, fmt.Errorf("volume %q (size %d): %w", spec.Name, spec.SizeBytes, errdefs.ErrInvalidArgument)
	}
	size := spec.SizeBytes
	if size == 0 {
		size = DefaultVolumeSize
	}
	modes := []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce}
	if len(spec.AccessModes) > 0 {
		modes = nil
		for _, m := range spec.AccessModes {
			modes = append(modes, corev1.PersistentVolumeAccessMode(m))
		}
	}
	ns := r.volumeNamespace(spec.Name)
	if err := r.prepareNamespace(ctx, volumeTenant(spec.Name), ns); err != nil {
		return runtime.Volume{}, err
	}
	pvc := &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: spec.Name, Labels: map[string]string{labelScope: r.cfg.Scope}},
		Spec: corev1.PersistentVolumeClaimSpec{
			AccessModes: modes,
			Resources:   corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: *resource.NewQuantity(size, resource.BinarySI)}},
		},
	}
	if spec.StorageClass != "" {
		pvc.Spec.StorageClassName = &spec.StorageClass
	}
	if len(spec.Labels) > 0 {
		data, err := json.Marshal(spec.Labels)
		if err != nil {
			return runtime.Volume{}, fmt.Errorf("volume labels: %w", errdefs.ErrInvalidArgument)
		}
		pvc.Annotations = map[string]string{annoVolumeLabels: string(data)}
	}
	if err := r.c.Create(ctx, pvc); err != nil {
		return runtime.Volume{}, classify("create volume "+spec.Name, err)
	}
	return r.volumeInfo(ctx, pvc)
}

func (r *Runtime) volumeInfo(ctx context.Context, pvc *corev1.PersistentVolumeClaim) (runtime.Volume, error) {
	v := runtime.Volume{Name: pvc.Name, CreatedAt: pvc.CreationTimestamp.UTC(), Managed: pvc.Labels[labelScope] == r.cfg.Scope}
	if q, ok := pvc.Status.Capacity[corev1.ResourceStorage]; ok {
		v.SizeBytes = q.Value()
	} else if q, ok := pvc.Spec.Resources.Requests[corev1.ResourceStorage]; ok {
		v.SizeBytes = q.Value()
	}
	if pvc.Spec.StorageClassName != nil {
		v.StorageClass = *pvc.Spec.StorageClassName
	}
	for _, m := range pvc.Spec.AccessModes {
		v.AccessModes = append(v.AccessModes, string(m))
	}
	if s := pvc.Annotations[annoVolumeLabels]; s != "" {
		json.Unmarshal([]byte(s), &v.Labels)
	}
	users, err := r.volumeUsers(ctx, pvc.Namespace, pvc.Name)
	if err != nil {
		return runtime.Volume{}, err
	}
	v.Users = users
	return v, nil
}

// volumeUsers lists the sandboxes of this scope whose pod template mounts
// claim.
func (r *Runtime) volumeUsers(ctx context.Context, ns, claim string) ([]string, error) {
	var list sbv1.BatchSandboxList
	if err := r.c.List(ctx, &list, client.InNamespace(ns), client.MatchingLabels{labelScope: r.cfg.Scope}); err != nil {
		return nil, classify("list sandboxes", err)
	}
	var out []string
	for _, b := range list.Items {
		if b.Spec.Template == nil {
			continue
		}
		for _, v := range b.Spec.Template.Spec.Volumes {
			if v.PersistentVolumeClaim != nil && v.PersistentVolumeClaim.ClaimName == claim {
				out = append(out, b.Name)
				break
			}
		}
	}
	slices.Sort(out)
	return out, nil
}

// GetVolume implements runtime.Volumes.
func (r *Runtime) GetVolume(ctx context.Context, name string) (runtime.Volume, error) {
	if !runtime.ValidVolumeName(name) {
		return runtime.Volume{}, volumeNotFound(name)
	}
	var pvc corev1.PersistentVolumeClaim
	if err := r.c.Get(ctx, types.NamespacedName{Namespace: r.volumeNamespace(name), Name: name}, &pvc); err != nil {
		if apierrors.IsNotFound(err) {
			return runtime.Volume{}, volumeNotFound(name)
		}
		return runtime.Volume{}, classify("volume "+name, err)
	}
	if pvc.DeletionTimestamp != nil {
		return runtime.Volume{}, volumeNotFound(name)
	}
	return r.volumeInfo(ctx, &pvc)
}

// ListVolumes implements runtime.Volumes: the PVCs of this scope.
func (r *Runtime) ListVolumes(ctx context.Context) ([]runtime.Volume, error) {
	var list corev1.PersistentVolumeClaimList
	if err := r.c.List(ctx, &list, client.InNamespace(r.listNamespace()), client.MatchingLabels{labelScope: r.cfg.Scope}); err != nil {
		return nil, classify("list volumes", err)
	}
	out := make([]runtime.Volume, 0, len(list.Items))
	for i := range list.Items {
		if list.Items[i].DeletionTimestamp != nil {
			continue
		}
		v, err := r.volumeInfo(ctx, &list.Items[i])
		if err != nil {
			return nil, err
		}
		out = append(out, v)
	}
	slices.SortFunc(out, func(a, b runtime.Volume) int { return strings.Compare(a.Name, b.Name) })
	return out, nil
}

// DeleteVolume implements runtime.Volumes. A PVC moat did not create is
// ErrPermissionDenied; one a sandbox mounts is ErrFailedPrecondition (the
// API server would only mark it Terminating until the pod goes).
func (r *Runtime) DeleteVolume(ctx context.Context, name string) error {
	v, err := r.GetVolume(ctx, name)
	if err != nil {
		return err
	}
	if err := v.Deletable(); err != nil {
		return err
	}
	pvc := &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Namespace: r.volumeNamespace(name), Name: name}}
	if err := r.c.Delete(ctx, pvc); err != nil && !apierrors.IsNotFound(err) {
		return classify("delete volume "+name, err)
	}
	return nil
}

// addVolumeMounts adds spec's named-volume mounts to the pod template
// (validate has refused host paths), after checking that every claim
// exists: a pod on a missing PVC would stay Pending until CreateTimeout.
func (r *Runtime) addVolumeMounts(ctx context.Context, ns string, t *corev1.PodTemplateSpec, mounts []runtime.Mount) error {
	for i, m := range mounts {
		if r.volumeNamespace(m.Volume) != ns {
			// A pod mounts claims of its own namespace only.
			return runtime.Invalid("volume %q is not in the sandbox's namespace %s", m.Volume, ns)
		}
		if _, err := r.GetVolume(ctx, m.Volume); err != nil {
			return err
		}
		name := volumePrefix + strconv.Itoa(i)
		t.Spec.Volumes = append(t.Spec.Volumes, corev1.Volume{Name: name, VolumeSource: corev1.VolumeSource{
			PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: m.Volume, ReadOnly: m.ReadOnly}}})
		t.Spec.Containers[0].VolumeMounts = append(t.Spec.Containers[0].VolumeMounts,
			corev1.VolumeMount{Name: name, MountPath: m.Destination, SubPath: m.SubPath, ReadOnly: m.ReadOnly})
	}
	return nil
}

package kubernetes

import (
	"errors"
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/moat-sandbox/moat/internal/errdefs"
	"github.com/moat-sandbox/moat/internal/image"
	"github.com/moat-sandbox/moat/internal/volume"
)

func TestStartFailure(t *testing.T) {
	waiting := func(reason, msg string) corev1.ContainerStatus {
		return corev1.ContainerStatus{Name: "sandbox", State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: reason, Message: msg}}}
	}
	for i, tc := range []struct {
		init, main []corev1.ContainerStatus
		class      error // nil: not a failure
		reason     error // an extra reason the error carries
	}{
		0: {main: []corev1.ContainerStatus{waiting("ContainerCreating", "")}},
		1: {init: []corev1.ContainerStatus{waiting("PodInitializing", "")}},
		2: {main: []corev1.ContainerStatus{{Name: "sandbox", State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{}}}}},
		3: {main: []corev1.ContainerStatus{waiting("CreateContainerConfigError",
			`failed to prepare subPath for volumeMount "moat-vol-0" of container "sandbox"`)},
			class: errdefs.ErrInvalidArgument, reason: volume.ErrSubPath},
		4: {main: []corev1.ContainerStatus{waiting("CreateContainerConfigError", `configmap "x" not found`)}, class: errdefs.ErrInvalidArgument},
		5: {main: []corev1.ContainerStatus{waiting("ErrImagePull", `failed to resolve reference "127.0.0.1:5000/nope:404": not found`)},
			class: errdefs.ErrInvalidArgument, reason: image.ErrPull},
		6: {main: []corev1.ContainerStatus{waiting("ImagePullBackOff", `Back-off pulling image "r.test/x": dial tcp: connection refused`)},
			class: errdefs.ErrUnavailable, reason: image.ErrPull},
		7: {main: []corev1.ContainerStatus{waiting("InvalidImageName", `couldn't parse image name "A:B:C"`)}, class: errdefs.ErrInvalidArgument, reason: image.ErrPull},
		// The agent's init container cannot get its image.
		8: {init: []corev1.ContainerStatus{waiting("ImagePullBackOff", "not found")}, main: []corev1.ContainerStatus{waiting("PodInitializing", "")},
			class: errdefs.ErrInvalidArgument, reason: image.ErrPull},
		9:  {main: []corev1.ContainerStatus{waiting("CreateContainerError", "no such file")}, class: errdefs.ErrFailedPrecondition},
		10: {main: []corev1.ContainerStatus{waiting("RunContainerError", "oci runtime error")}, class: errdefs.ErrFailedPrecondition},
		11: {main: []corev1.ContainerStatus{waiting("CrashLoopBackOff", "back-off 10s restarting failed container")}, class: errdefs.ErrFailedPrecondition},
	} {
		p := &corev1.Pod{Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "sandbox", Image: "img"}}}}
		p.Name = "pod-1"
		p.Status.InitContainerStatuses, p.Status.ContainerStatuses = tc.init, tc.main
		err := startFailure(p)
		switch {
		case tc.class == nil && err != nil:
			t.Errorf("%d: startFailure = %v, want nil", i, err)
		case tc.class != nil && !errors.Is(err, tc.class):
			t.Errorf("%d: startFailure = %v, want class %v", i, err, tc.class)
		case tc.reason != nil && !errors.Is(err, tc.reason):
			t.Errorf("%d: startFailure = %v, want reason %v", i, err, tc.reason)
		}
	}
}

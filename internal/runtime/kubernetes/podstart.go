package kubernetes

import (
	"fmt"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"

	"github.com/moat-sandbox/moat/internal/errdefs"
	"github.com/moat-sandbox/moat/internal/image"
	"github.com/moat-sandbox/moat/internal/volume"
)

// Why a pod does not start is only in its container statuses: the kubelet
// keeps such a pod Pending and retries with back-off for ever, so Create
// would wait out CreateTimeout. startFailure reads the waiting reasons the
// kubelet sets when it cannot make or start a container and turns them
// into an error class (the backends' words, translated once at the edge):
//
//   - ErrImagePull, ImagePullBackOff, InvalidImageName, ErrImageNeverPull:
//     image.ErrPull, with ErrInvalidArgument when the reference is bad or
//     the registry has no such image (the caller's error, as the other
//     backends answer it), else ErrUnavailable;
//   - CreateContainerConfigError (the container's configuration cannot be
//     resolved on the node): ErrInvalidArgument, and volume.ErrSubPath when
//     it is a volume's subPath (one leading out of the volume through a
//     symlink: the kubelet refuses it, like volume.BindSubPath does);
//   - CreateContainerError, RunContainerError, CrashLoopBackOff (the
//     runtime cannot make or run the container, or the agent keeps
//     exiting): ErrFailedPrecondition.
//
// Unschedulable pods are not failures here (a node may join); their reason
// is in the BatchSandbox's Ready condition and in the timeout's message.
// Init containers (the agent copy) are looked at too.
func startFailure(p *corev1.Pod) error {
	for _, cs := range slices.Concat(p.Status.InitContainerStatuses, p.Status.ContainerStatuses) {
		w := cs.State.Waiting
		if w == nil {
			continue
		}
		what := fmt.Sprintf("pod %s: container %s: %s: %s", p.Name, cs.Name, w.Reason, w.Message)
		switch w.Reason {
		case "ErrImagePull", "ImagePullBackOff", "InvalidImageName", "ErrImageNeverPull":
			class := errdefs.ErrUnavailable
			if w.Reason == "InvalidImageName" || w.Reason == "ErrImageNeverPull" || strings.Contains(w.Message, "not found") {
				class = errdefs.ErrInvalidArgument
			}
			return errdefs.WithPublic(fmt.Errorf("%s: %w: %w", what, image.ErrPull, class), "",
				fmt.Sprintf("the node cannot pull image %q: %s", imageOf(p, cs.Name), w.Reason))
		case "CreateContainerConfigError":
			if strings.Contains(w.Message, "subPath") {
				return fmt.Errorf("%s: %w: %w", what, volume.ErrSubPath, errdefs.ErrInvalidArgument)
			}
			return errdefs.WithPublic(fmt.Errorf("%s: %w", what, errdefs.ErrInvalidArgument), "",
				fmt.Sprintf("the node cannot configure container %s (%s)", cs.Name, w.Reason))
		case "CreateContainerError", "RunContainerError", "CrashLoopBackOff":
			return fmt.Errorf("%s: %w", what, errdefs.ErrFailedPrecondition)
		}
	}
	return nil
}

// imageOf returns the image of p's container (or init container) name.
func imageOf(p *corev1.Pod, name string) string {
	for _, c := range slices.Concat(p.Spec.InitContainers, p.Spec.Containers) {
		if c.Name == name {
			return c.Image
		}
	}
	return ""
}

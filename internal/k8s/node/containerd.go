package node

import (
	"context"
	"fmt"

	tasksapi "github.com/containerd/containerd/api/services/tasks/v1"
	"github.com/containerd/containerd/api/types/task"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/moat-sandbox/moat/internal/errdefs"
)

// namespaceHeader is the gRPC metadata key naming containerd's namespace.
const namespaceHeader = "containerd-namespace"

// Containerd is the Tasks of a containerd reached over its gRPC socket:
// its task service's Get, Pause and Resume (a shim's Pause freezes runc's
// cgroup, or the gVisor sandbox under runsc's shim). The task API alone
// keeps containerd's client library (and its dependencies) out of moat.
type Containerd struct {
	conn      *grpc.ClientConn
	tasks     tasksapi.TasksClient
	namespace string
}

// DialContainerd connects to containerd's socket; namespace is the
// containerd namespace of the kubelet's containers ("k8s.io").
func DialContainerd(socket, namespace string) (*Containerd, error) {
	conn, err := grpc.NewClient("unix://"+socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, fmt.Errorf("containerd %s: %w: %v", socket, errdefs.ErrUnavailable, err)
	}
	return &Containerd{conn: conn, tasks: tasksapi.NewTasksClient(conn), namespace: namespace}, nil
}

// Close closes the connection.
func (c *Containerd) Close() error { return c.conn.Close() }

func (c *Containerd) ctx(ctx context.Context) context.Context {
	return metadata.AppendToOutgoingContext(ctx, namespaceHeader, c.namespace)
}

// Frozen implements Tasks.
func (c *Containerd) Frozen(ctx context.Context, id string) (bool, error) {
	r, err := c.tasks.Get(c.ctx(ctx), &tasksapi.GetRequest{ContainerID: id})
	if err != nil {
		return false, grpcError("container "+id, err)
	}
	switch st := r.GetProcess().GetStatus(); st {
	case task.Status_PAUSED, task.Status_PAUSING:
		return true, nil
	case task.Status_RUNNING:
		return false, nil
	default:
		return false, fmt.Errorf("container %s is %s: %w", id, st, errdefs.ErrFailedPrecondition)
	}
}

// Pause implements Tasks.
func (c *Containerd) Pause(ctx context.Context, id string) error {
	_, err := c.tasks.Pause(c.ctx(ctx), &tasksapi.PauseTaskRequest{ContainerID: id})
	return grpcError("pause container "+id, err)
}

// Resume implements Tasks.
func (c *Containerd) Resume(ctx context.Context, id string) error {
	_, err := c.tasks.Resume(c.ctx(ctx), &tasksapi.ResumeTaskRequest{ContainerID: id})
	return grpcError("resume container "+id, err)
}

// grpcError classifies a containerd error.
func grpcError(what string, err error) error {
	if err == nil {
		return nil
	}
	switch status.Code(err) {
	case codes.NotFound:
		return fmt.Errorf("%s: %w", what, errdefs.ErrNotFound)
	case codes.FailedPrecondition:
		return fmt.Errorf("%s: %w: %s", what, errdefs.ErrFailedPrecondition, status.Convert(err).Message())
	}
	return fmt.Errorf("%s: %w: %s", what, errdefs.ErrUnavailable, status.Convert(err).Message())
}

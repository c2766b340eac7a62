package docker

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"slices"
	"strings"
	"time"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/moby/moby/api/types/container"
	"github.com/moby/moby/client"

	"github.com/moat-sandbox/moat/internal/errdefs"
	"github.com/moat-sandbox/moat/internal/runtime"
)

// inspect returns the container of sandbox id, ErrNotFound if there is
// none (or it belongs to another scope).
func (r *Runtime) inspect(ctx context.Context, id string) (container.InspectResponse, error) {
	if !runtime.ValidID(id) {
		return container.InspectResponse{}, notFound(id)
	}
	res, err := r.cli.ContainerInspect(ctx, containerName(id), client.ContainerInspectOptions{})
	if err != nil {
		if cerrdefs.IsNotFound(err) {
			return container.InspectResponse{}, notFound(id)
		}
		return container.InspectResponse{}, classify("inspect "+id, err)
	}
	c := res.Container
	if c.Config == nil || c.State == nil || c.Config.Labels[LabelSandbox] != id || c.Config.Labels[LabelScope] != r.cfg.Scope {
		return container.InspectResponse{}, notFound(id)
	}
	return c, nil
}

// status converts an inspected container.
func (r *Runtime) status(c container.InspectResponse) runtime.Status {
	labels := c.Config.Labels
	st := runtime.Status{
		ID:    labels[LabelSandbox],
		Class: labels[LabelClass],
	}
	if t, err := time.Parse(time.RFC3339Nano, labels[LabelCreatedAt]); err == nil {
		st.CreatedAt = t
	} else if t, err := time.Parse(time.RFC3339Nano, c.Created); err == nil {
		st.CreatedAt = t.UTC()
	}
	if s := labels[LabelSpecLabels]; s != "" && s != "null" {
		if err := json.Unmarshal([]byte(s), &st.Labels); err != nil {
			st.Message = "corrupt " + LabelSpecLabels + " label"
		}
	}
	if c.NetworkSettings != nil {
		if ep := c.NetworkSettings.Networks[r.cfg.Network]; ep != nil && ep.IPAddress.IsValid() {
			st.IP = ep.IPAddress.String()
		}
	}
	s := c.State
	switch {
	case s.Paused || s.Status == container.StatePaused:
		st.State = runtime.StatePaused
		st.Pid = s.Pid
	case s.Running || s.Status == container.StateRunning || s.Status == container.StateRestarting:
		st.State = runtime.StateRunning
		st.Pid = s.Pid
	case s.Status == container.StateCreated:
		st.State = runtime.StateCreating
	case s.Status == container.StateExited || s.Status == container.StateDead:
		st.State = runtime.StateStopped
		st.ExitCode = s.ExitCode
		st.IP = ""
		st.ExitReason = runtime.ExitReasonExited
		if s.OOMKilled {
			st.ExitReason = runtime.ExitReasonOOMKilled
		}
		if s.Error != "" {
			st.Message = s.Error
		} else if s.OOMKilled {
			st.Message = "killed: out of memory"
		}
	default:
		st.State = runtime.StateUnknown
		st.Message = "docker state " + string(s.Status)
	}
	return st
}

// Status implements runtime.Runtime.
func (r *Runtime) Status(ctx context.Context, id string) (runtime.Status, error) {
	c, err := r.inspect(ctx, id)
	if err != nil {
		return runtime.Status{}, err
	}
	return r.status(c), nil
}

// List implements runtime.Runtime: the containers of this Config.Scope.
func (r *Runtime) List(ctx context.Context) ([]runtime.Status, error) {
	f := make(client.Filters).Add("label", LabelSandbox).Add("label", LabelScope+"="+r.cfg.Scope)
	res, err := r.cli.ContainerList(ctx, client.ContainerListOptions{All: true, Filters: f})
	if err != nil {
		return nil, classify("list", err)
	}
	out := make([]runtime.Status, 0, len(res.Items))
	for _, s := range res.Items {
		id := s.Labels[LabelSandbox]
		c, err := r.inspect(ctx, id)
		if errdefs.IsNotFound(err) {
			continue // deleted meanwhile
		}
		if err != nil {
			out = append(out, runtime.Status{ID: id, State: runtime.StateUnknown, Message: err.Error()})
			continue
		}
		out = append(out, r.status(c))
	}
	slices.SortFunc(out, func(a, b runtime.Status) int { return strings.Compare(a.ID, b.ID) })
	return out, nil
}

// Endpoint implements runtime.Runtime: the container's address on the
// network, which the host reaches through the bridge.
func (r *Runtime) Endpoint(ctx context.Context, id string, port int) (string, error) {
	if port <= 0 || port > 65535 {
		return "", runtime.Invalid("invalid port %d", port)
	}
	c, err := r.inspect(ctx, id)
	if err != nil {
		return "", err
	}
	st := r.status(c)
	if st.State != runtime.StateRunning && st.State != runtime.StatePaused {
		return "", fmt.Errorf("sandbox %q is %s: %w", id, st.State, errdefs.ErrFailedPrecondition)
	}
	if st.IP == "" {
		return "", fmt.Errorf("sandbox %q has no address on network %q: %w", id, r.cfg.Network, errdefs.ErrFailedPrecondition)
	}
	return net.JoinHostPort(st.IP, fmt.Sprint(port)), nil
}

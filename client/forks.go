package client

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net/http"
	"net/url"
	"time"
)

// Operation states.
const (
	OperationRunning   = "Running"
	OperationSucceeded = "Succeeded"
	OperationFailed    = "Failed"
)

// ForkOverride is what children change from their source; zero fields
// keep the source's.
type ForkOverride struct {
	Env      map[string]string
	Metadata map[string]string
	// Timeout is the child's lifetime (at least a minute); 0: the child
	// expires when its source does.
	Timeout       time.Duration
	NetworkPolicy *NetworkPolicy
}

// ForkRequest forks a running sandbox into Count children (1-100).
type ForkRequest struct {
	Count int
	// ForkOverride applies to every child; Children[i] to child i on top.
	ForkOverride
	Children []ForkOverride
	// IdempotencyKey makes a retry of the fork answer the first fork's
	// operation; empty: Fork makes one, so its own retries are safe.
	IdempotencyKey string
}

// ForkChild is a sandbox a fork made, with its own identity.
type ForkChild struct {
	ID        string `json:"id"`
	Hostname  string `json:"hostname,omitempty"`
	MachineID string `json:"machineId,omitempty"`
}

// Operation is a long-running operation (a fork) and its result.
type Operation struct {
	ID         string      `json:"id"`
	Kind       string      `json:"kind"`
	State      string      `json:"state"`
	SourceID   string      `json:"sourceId"`
	SnapshotID string      `json:"snapshotId,omitempty"`
	Memory     bool        `json:"memory,omitempty"`
	Count      int         `json:"count"`
	Children   []ForkChild `json:"children"`
	Error      *struct {
		Code    string `json:"code"`
		Message string `json:"message"`
	} `json:"error,omitempty"`
	CreatedAt time.Time `json:"createdAt"`
	UpdatedAt time.Time `json:"updatedAt"`
}

type forkOverrideWire struct {
	Env           map[string]string `json:"env,omitempty"`
	Metadata      map[string]string `json:"metadata,omitempty"`
	Timeout       *int64            `json:"timeout,omitempty"`
	NetworkPolicy *NetworkPolicy    `json:"networkPolicy,omitempty"`
}

func (o ForkOverride) wire() forkOverrideWire {
	w := forkOverrideWire{Env: o.Env, Metadata: o.Metadata, NetworkPolicy: o.NetworkPolicy}
	if o.Timeout > 0 {
		s := int64(o.Timeout / time.Second)
		w.Timeout = &s
	}
	return w
}

// NewIdempotencyKey returns a random Idempotency-Key.
func NewIdempotencyKey() string {
	b := make([]byte, 16)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// Fork forks a running sandbox: the server snapshots it and makes the
// children in the background. It returns the Running operation; see
// WaitOperation. The call carries an Idempotency-Key, so it is retried
// like an idempotent call.
func (c *Client) Fork(ctx context.Context, sandboxID string, req ForkRequest) (*Operation, error) {
	in := struct {
		forkOverrideWire
		Count    int                `json:"count"`
		Children []forkOverrideWire `json:"children,omitempty"`
	}{forkOverrideWire: req.ForkOverride.wire(), Count: req.Count}
	for _, ch := range req.Children {
		in.Children = append(in.Children, ch.wire())
	}
	key := req.IdempotencyKey
	if key == "" {
		key = NewIdempotencyKey()
	}
	var op Operation
	cl := &call{method: http.MethodPost, path: sandboxPath(sandboxID, "fork"), idempotent: true,
		header: http.Header{"Idempotency-Key": {key}}}
	if err := c.lc.json(ctx, cl, in, &op); err != nil {
		return nil, err
	}
	return &op, nil
}

// GetOperation returns one operation.
func (c *Client) GetOperation(ctx context.Context, id string) (*Operation, error) {
	var op Operation
	if err := c.lc.json(ctx, &call{method: http.MethodGet, path: "/operations/" + url.PathEscape(id)}, nil, &op); err != nil {
		return nil, err
	}
	return &op, nil
}

// WaitOperation polls operation id every poll (0: 200 ms) until it ends
// or ctx is done. A Failed operation is returned with an error carrying
// its code and message.
func (c *Client) WaitOperation(ctx context.Context, id string, poll time.Duration) (*Operation, error) {
	if poll <= 0 {
		poll = 200 * time.Millisecond
	}
	for {
		op, err := c.GetOperation(ctx, id)
		if err != nil {
			return nil, err
		}
		switch op.State {
		case OperationSucceeded:
			return op, nil
		case OperationFailed:
			if op.Error != nil {
				return op, fmt.Errorf("operation %s failed: %s: %s", id, op.Error.Code, op.Error.Message)
			}
			return op, fmt.Errorf("operation %s failed", id)
		}
		if err := sleep(ctx, poll); err != nil {
			return op, err
		}
	}
}

package client

import (
	"context"
	"net/http"
	"net/url"
	"strconv"
	"time"
)

// Snapshot states.
const (
	SnapshotCreating = "Creating"
	SnapshotReady    = "Ready"
	SnapshotDeleting = "Deleting"
	SnapshotFailed   = "Failed"
)

// SnapshotStatus is the state of a snapshot.
type SnapshotStatus struct {
	State            string    `json:"state"`
	Reason           string    `json:"reason,omitempty"`
	Message          string    `json:"message,omitempty"`
	LastTransitionAt time.Time `json:"lastTransitionAt,omitzero"`
}

// Snapshot is a captured root filesystem; create a sandbox from it with
// CreateRequest.SnapshotID.
type Snapshot struct {
	ID        string         `json:"id"`
	SandboxID string         `json:"sandboxId"`
	Name      string         `json:"name,omitempty"`
	Status    SnapshotStatus `json:"status"`
	CreatedAt time.Time      `json:"createdAt"`
}

// SnapshotList is one page of snapshots.
type SnapshotList struct {
	Items      []Snapshot `json:"items"`
	Pagination Pagination `json:"pagination"`
}

// SnapshotListOptions filters ListSnapshots; zero values mean no filter.
type SnapshotListOptions struct {
	SandboxID string
	States    []string
	Page      int
	PageSize  int
}

// CreateSnapshot snapshots a Running or Paused sandbox (never retried).
func (c *Client) CreateSnapshot(ctx context.Context, sandboxID, name string) (*Snapshot, error) {
	in := struct {
		Name string `json:"name,omitempty"`
	}{name}
	var s Snapshot
	if err := c.lc.json(ctx, &call{method: http.MethodPost, path: sandboxPath(sandboxID, "snapshots")}, in, &s); err != nil {
		return nil, err
	}
	return &s, nil
}

// GetSnapshot returns one snapshot.
func (c *Client) GetSnapshot(ctx context.Context, id string) (*Snapshot, error) {
	var s Snapshot
	if err := c.lc.json(ctx, &call{method: http.MethodGet, path: "/snapshots/" + url.PathEscape(id)}, nil, &s); err != nil {
		return nil, err
	}
	return &s, nil
}

// ListSnapshots returns one page of snapshots, newest first.
func (c *Client) ListSnapshots(ctx context.Context, opts SnapshotListOptions) (*SnapshotList, error) {
	q := url.Values{}
	if opts.SandboxID != "" {
		q.Set("sandboxId", opts.SandboxID)
	}
	for _, s := range opts.States {
		q.Add("state", s)
	}
	if opts.Page > 0 {
		q.Set("page", strconv.Itoa(opts.Page))
	}
	if opts.PageSize > 0 {
		q.Set("pageSize", strconv.Itoa(opts.PageSize))
	}
	var out SnapshotList
	if err := c.lc.json(ctx, &call{method: http.MethodGet, path: "/snapshots", query: q}, nil, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// DeleteSnapshot deletes a snapshot (409 while a sandbox uses it).
func (c *Client) DeleteSnapshot(ctx context.Context, id string) error {
	return c.lc.json(ctx, &call{method: http.MethodDelete, path: "/snapshots/" + url.PathEscape(id)}, nil, nil)
}

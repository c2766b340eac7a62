package client

import (
	"context"
	"net/http"
	"net/url"
	"time"
)

// PoolTemplate is what every sandbox of a pool is created from.
type PoolTemplate struct {
	Image          *ImageSpec        `json:"image"`
	Entrypoint     []string          `json:"entrypoint"`
	Env            map[string]string `json:"env,omitempty"`
	ResourceLimits map[string]string `json:"resourceLimits,omitempty"`
	Extensions     map[string]string `json:"extensions,omitempty"`
	// Volumes are mounted by every sandbox of the pool.
	Volumes []Volume `json:"volumes,omitempty"`
}

// PoolCapacity bounds a pool: BufferMin <= BufferMax <= PoolMax,
// PoolMin <= PoolMax, 1 <= PoolMax.
type PoolCapacity struct {
	BufferMin int `json:"bufferMin"`
	BufferMax int `json:"bufferMax"`
	PoolMin   int `json:"poolMin"`
	PoolMax   int `json:"poolMax"`
}

// PoolSpec is the body of CreatePool and UpdatePool.
type PoolSpec struct {
	// Name is a DNS label.
	Name         string       `json:"name"`
	Template     PoolTemplate `json:"template"`
	CapacitySpec PoolCapacity `json:"capacitySpec"`
}

// PoolStatus counts a pool's sandboxes.
type PoolStatus struct {
	Total     int `json:"total"`
	Allocated int `json:"allocated"`
	Available int `json:"available"`
	// Revision changes whenever the template changes.
	Revision string `json:"revision"`
}

// Pool is a warm pool as the server reports it.
type Pool struct {
	Name string `json:"name"`
	// Tenant owns the pool (pool names are per tenant).
	Tenant       string       `json:"tenant,omitempty"`
	Template     PoolTemplate `json:"template"`
	CapacitySpec PoolCapacity `json:"capacitySpec"`
	Status       PoolStatus   `json:"status"`
	CreatedAt    time.Time    `json:"createdAt"`
}

func poolPath(name string) string { return "/pools/" + url.PathEscape(name) }

// CreatePool creates a warm pool (never retried).
func (c *Client) CreatePool(ctx context.Context, spec PoolSpec) (*Pool, error) {
	var p Pool
	if err := c.lc.json(ctx, &call{method: http.MethodPost, path: "/pools"}, spec, &p); err != nil {
		return nil, err
	}
	return &p, nil
}

// GetPool returns one pool.
func (c *Client) GetPool(ctx context.Context, name string) (*Pool, error) {
	var p Pool
	if err := c.lc.json(ctx, &call{method: http.MethodGet, path: poolPath(name)}, nil, &p); err != nil {
		return nil, err
	}
	return &p, nil
}

// ListPools returns every pool.
func (c *Client) ListPools(ctx context.Context) ([]Pool, error) {
	var out struct {
		Items []Pool `json:"items"`
	}
	if err := c.lc.json(ctx, &call{method: http.MethodGet, path: "/pools"}, nil, &out); err != nil {
		return nil, err
	}
	return out.Items, nil
}

// UpdatePool replaces the template and capacity of the pool spec.Name.
func (c *Client) UpdatePool(ctx context.Context, spec PoolSpec) (*Pool, error) {
	var p Pool
	if err := c.lc.json(ctx, &call{method: http.MethodPut, path: poolPath(spec.Name)}, spec, &p); err != nil {
		return nil, err
	}
	return &p, nil
}

// DeletePool deletes a pool and its idle sandboxes.
func (c *Client) DeletePool(ctx context.Context, name string) error {
	return c.lc.json(ctx, &call{method: http.MethodDelete, path: poolPath(name)}, nil, nil)
}

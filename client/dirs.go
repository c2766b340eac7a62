package client

import (
	"context"
	"net/http"
	"net/url"
)

// RemoveDirs deletes directories and everything under them (rm -rf).
func (s *SandboxHandle) RemoveDirs(ctx context.Context, paths ...string) error {
	return s.agent.json(ctx, &call{method: http.MethodDelete, path: "/directories", query: url.Values{"path": paths}}, nil, nil)
}

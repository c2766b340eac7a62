package pty

import "github.com/moat-sandbox/moat/internal/execd/wire"

// Routes are the terminal routes.
func (s *Service) Routes() []wire.Route {
	return []wire.Route{
		{Pattern: "POST /pty", Handler: s.Create},
		{Pattern: "GET /pty/{id}", Handler: s.Get},
		{Pattern: "DELETE /pty/{id}", Handler: s.Delete},
		{Pattern: "GET /pty/{id}/ws", Handler: s.Attach},
	}
}

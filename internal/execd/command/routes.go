package command

import "github.com/moat-sandbox/moat/internal/execd/wire"

// Routes are the commands and sessions routes.
func (s *Service) Routes() []wire.Route {
	return []wire.Route{
		{Pattern: "POST /command", Handler: s.Run},
		{Pattern: "DELETE /command", Handler: s.Interrupt},
		{Pattern: "GET /command/{a}/{b}", Handler: s.Get}, // status/{id} and {id}/logs
		{Pattern: "POST /session", Handler: s.CreateSession},
		{Pattern: "POST /session/{id}/run", Handler: s.RunSession},
		{Pattern: "DELETE /session/{id}", Handler: s.DeleteSession},
	}
}

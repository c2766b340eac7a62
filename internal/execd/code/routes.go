package code

import "github.com/moat-sandbox/moat/internal/execd/wire"

// Routes are the code interpreter routes.
func (s *Service) Routes() []wire.Route {
	return []wire.Route{
		{Pattern: "POST /code/context", Handler: s.CreateContext},
		{Pattern: "GET /code/contexts", Handler: s.ListContexts},
		{Pattern: "DELETE /code/contexts", Handler: s.DeleteContexts},
		{Pattern: "GET /code/contexts/{id}", Handler: s.GetContext},
		{Pattern: "DELETE /code/contexts/{id}", Handler: s.DeleteContext},
		{Pattern: "POST /code", Handler: s.Run},
		{Pattern: "DELETE /code", Handler: s.Interrupt},
	}
}

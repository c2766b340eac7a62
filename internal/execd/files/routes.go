package files

import "github.com/moat-sandbox/moat/internal/execd/wire"

// Routes are the filesystem routes.
func (s *Service) Routes() []wire.Route {
	return []wire.Route{
		{Pattern: "GET /files/info", Handler: s.Info},
		{Pattern: "DELETE /files", Handler: s.Delete},
		{Pattern: "POST /files/permissions", Handler: s.Permissions},
		{Pattern: "POST /files/mv", Handler: s.Move},
		{Pattern: "GET /files/search", Handler: s.Search},
		{Pattern: "POST /files/replace", Handler: s.Replace},
		{Pattern: "POST /files/upload", Handler: s.Upload},
		{Pattern: "GET /files/download", Handler: s.Download},
		{Pattern: "GET /directories/list", Handler: s.ListDir},
		{Pattern: "POST /directories", Handler: s.Mkdir},
		{Pattern: "DELETE /directories", Handler: s.Rmdir},
	}
}

package execd

import (
	"net/http"

	"github.com/moat-sandbox/moat/internal/errdefs"
	"github.com/moat-sandbox/moat/internal/execd/metrics"
	"github.com/moat-sandbox/moat/internal/execd/wire"
	"github.com/moat-sandbox/moat/internal/web"
)

// table is the agent's route table: each service's routes (protocol §2),
// the moat extensions and the JSON 404 for everything else.
func (s *Server) table() [][]wire.Route {
	return [][]wire.Route{
		{{Pattern: "GET /ping", Handler: func(w http.ResponseWriter, r *http.Request) error { w.WriteHeader(http.StatusOK); return nil }}},
		s.commands.Routes(),
		s.files.Routes(),
		s.code.Routes(),
		s.ptys.Routes(),
		metrics.Routes(),
		s.proxy.Routes(),
		{
			{Pattern: "POST /moat/v1/env", Handler: s.handleSetEnv},
			{Pattern: "POST /moat/v1/token", Handler: s.handleSetToken},
		},
		{{Pattern: "/", Handler: func(w http.ResponseWriter, r *http.Request) error {
			return errdefs.WithPublic(errdefs.ErrNotFound, wire.CodeUnknown, "route not found: "+r.Method+" "+r.URL.Path)
		}}},
	}
}

// routes builds the handler: the route table behind the access token
// check and panic recovery.
func (s *Server) routes() http.Handler {
	return web.Recover(s.log, s.auth(wire.Mux(s.log, s.table()...)))
}

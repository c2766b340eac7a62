package execd

import (
	"net/http"
	"strconv"

	"github.com/moat-sandbox/moat/internal/agentproto"

	"github.com/moat-sandbox/moat/internal/errdefs"
	"github.com/moat-sandbox/moat/internal/execd/metrics"
	"github.com/moat-sandbox/moat/internal/execd/wire"
	"github.com/moat-sandbox/moat/internal/web"
)

// table is the agent's route table: each service's routes (protocol §2),
// the moat extensions and the JSON 404 for everything else.
func (s *Server) table() [][]wire.Route {
	return [][]wire.Route{
		{{Pattern: "GET " + agentproto.PingPath, Handler: ping}},
		s.commands.Routes(),
		s.files.Routes(),
		s.code.Routes(),
		s.ptys.Routes(),
		metrics.Routes(),
		s.proxy.Routes(),
		{
			{Pattern: "POST " + agentproto.EnvPath, Handler: s.handleSetEnv},
			{Pattern: "POST " + agentproto.TokenPath, Handler: s.handleSetToken},
		},
		{{Pattern: "/", Handler: func(w http.ResponseWriter, r *http.Request) error {
			return errdefs.WithPublic(errdefs.ErrNotFound, wire.CodeUnknown, "route not found: "+r.Method+" "+r.URL.Path)
		}}},
	}
}

// ping answers the health check with the agent protocol version.
func ping(w http.ResponseWriter, r *http.Request) error {
	w.Header().Set(agentproto.VersionHeader, strconv.Itoa(agentproto.Version))
	w.WriteHeader(http.StatusOK)
	return nil
}

// routes builds the handler: the route table behind the access token
// check and panic recovery.
func (s *Server) routes() http.Handler {
	return web.Recover(s.log, s.auth(wire.Mux(s.log, s.table()...)))
}

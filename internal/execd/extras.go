package execd

import (
	"net/http"

	"github.com/moat-sandbox/moat/internal/web"
)

// extraRoutes registers sessions, code contexts, metrics, PTY and proxy.
func (s *Server) extraRoutes(h func(string, web.HandlerFunc), mux *http.ServeMux) {
	h("POST /session", s.handleCreateSession)
	h("POST /session/{id}/run", s.handleRunSession)
	h("DELETE /session/{id}", s.handleDeleteSession)

	h("POST /code/context", s.handleCreateContext)
	h("GET /code/contexts", s.handleListContexts)
	h("DELETE /code/contexts", s.handleDeleteContexts)
	h("GET /code/contexts/{id}", s.handleGetContext)
	h("DELETE /code/contexts/{id}", s.handleDeleteContext)
	h("POST /code", s.handleRunCode)
	h("DELETE /code", s.handleInterruptCode)

	h("GET /metrics", s.handleMetrics)
	h("GET /metrics/watch", s.handleMetricsWatch)

	h("POST /pty", s.handleCreatePTY)
	h("GET /pty/{id}", s.handleGetPTY)
	h("DELETE /pty/{id}", s.handleDeletePTY)
	h("GET /pty/{id}/ws", s.handlePTYWebSocket)

	h("/proxy/{port}/{path...}", s.handleProxy)
	h("/proxy/{port}", s.handleProxy)
}

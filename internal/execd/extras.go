package execd

import (
	"net/http"

	"github.com/moat-sandbox/moat/internal/web"
)

type session struct{}

func (s *session) current() *Proc { return nil }

type ptySession struct{}

func (p *ptySession) process() *Proc { return nil }

type codeContext struct{}

func (c *codeContext) process() *Proc { return nil }

func (s *Server) extraRoutes(h func(string, web.HandlerFunc), mux *http.ServeMux) {}

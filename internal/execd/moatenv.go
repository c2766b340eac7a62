package execd

import (
	"net/http"
	"strings"

	"github.com/moat-sandbox/moat/internal/agentproto"

	"github.com/moat-sandbox/moat/internal/errdefs"
	"github.com/moat-sandbox/moat/internal/execd/wire"
	"github.com/moat-sandbox/moat/internal/web"
)

// handleSetEnv is a moat extension: it adds variables to the environment
// of every later command, session, PTY and code context. The lifecycle
// server calls it when a warm pool sandbox is claimed with env.
func (s *Server) handleSetEnv(w http.ResponseWriter, r *http.Request) error {
	var req agentproto.SetEnvRequest
	if err := web.DecodeJSON(r, &req, false); err != nil {
		return errdefs.WithPublic(err, wire.CodeInvalidRequestBody, "invalid JSON body")
	}
	var add []string
	for k, v := range req.Envs {
		if k == "" || strings.ContainsAny(k, "=\x00") || strings.ContainsRune(v, 0) {
			return wire.BadBody("invalid env variable %q", k)
		}
		add = append(add, k+"="+v)
	}
	s.run.AddEnv(add)
	w.WriteHeader(http.StatusOK)
	return nil
}

// handleSetToken is a moat extension: it replaces the access token (the
// request itself is authorized by the current one). The lifecycle server
// calls it right after restoring a sandbox from a memory snapshot, whose
// agent still holds the snapshotted sandbox's token. Requests already
// admitted are not affected.
func (s *Server) handleSetToken(w http.ResponseWriter, r *http.Request) error {
	var req agentproto.SetTokenRequest
	if err := web.DecodeJSON(r, &req, false); err != nil {
		return errdefs.WithPublic(err, wire.CodeInvalidRequestBody, "invalid JSON body")
	}
	if len(req.Token) < 16 || len(req.Token) > 256 || strings.IndexFunc(req.Token, func(c rune) bool { return c <= ' ' || c > '~' }) >= 0 {
		return wire.BadBody("token must be 16 to 256 printable ASCII characters")
	}
	s.token.Store(&req.Token)
	w.WriteHeader(http.StatusOK)
	return nil
}

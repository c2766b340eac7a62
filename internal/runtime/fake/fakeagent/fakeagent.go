// Package fakeagent is a stand-in agent: it answers the agent protocol of
// package agentproto (ping, env, token) with the real token check, and
// records what it was told. The fake runtime serves it in each sandbox
// (so it ships with `moat serve --runtime fake`), and the Kubernetes test
// agents and the stub agent binary serve it too, so that every double
// speaks the protocol the same way.
package fakeagent

import (
	"encoding/json"
	"log/slog"
	"maps"
	"net/http"
	"strconv"
	"strings"
	"sync"

	"github.com/moat-sandbox/moat/internal/agentproto"
	"github.com/moat-sandbox/moat/internal/execd/proxy"
	"github.com/moat-sandbox/moat/internal/execd/wire"
)

// Agent is an http.Handler that answers like a moat agent:
//
//	GET  /ping            200, with agentproto.VersionHeader unless Version is 1
//	POST /moat/v1/env     200; the variables are recorded (Env)
//	POST /moat/v1/token   200; the token is replaced (400 for an empty one)
//	/proxy/{port}/...     the agent's port proxy to 127.0.0.1:{port}
//	anything else         404
//
// Every request must carry the current token (when one is set), or it is
// answered 401. Its methods are safe for concurrent use.
type Agent struct {
	// Version is the protocol version to claim (0: agentproto.Version;
	// 1: an agent from before versioning, which sends no header).
	Version int

	mu    sync.Mutex
	token string
	env   map[string]string

	proxyOnce sync.Once
	proxy     http.Handler
}

// New returns an agent that requires token ("" disables auth).
func New(token string) *Agent { return &Agent{token: token} }

// Token returns the current access token.
func (a *Agent) Token() string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.token
}

// Env returns the variables set through POST /moat/v1/env.
func (a *Agent) Env() map[string]string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return maps.Clone(a.env)
}

// ServeHTTP implements http.Handler.
func (a *Agent) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	a.mu.Lock()
	if a.token != "" && r.Header.Get(agentproto.TokenHeader) != a.token {
		a.mu.Unlock()
		w.WriteHeader(http.StatusUnauthorized)
		return
	}
	if strings.HasPrefix(r.URL.Path, "/proxy/") {
		a.mu.Unlock()
		a.proxyOnce.Do(func() {
			log := slog.New(slog.DiscardHandler)
			a.proxy = wire.Mux(log, (&proxy.Handler{Log: log, TokenHeader: agentproto.TokenHeader}).Routes())
		})
		a.proxy.ServeHTTP(w, r)
		return
	}
	defer a.mu.Unlock()
	switch {
	case r.URL.Path == agentproto.PingPath && r.Method == http.MethodGet:
		v := a.Version
		if v == 0 {
			v = agentproto.Version
		}
		if v > 1 {
			w.Header().Set(agentproto.VersionHeader, strconv.Itoa(v))
		}
	case r.URL.Path == agentproto.EnvPath && r.Method == http.MethodPost:
		var body agentproto.SetEnvRequest
		if err := json.NewDecoder(r.Body).Decode(&body); err != nil {
			w.WriteHeader(http.StatusBadRequest)
			return
		}
		if a.env == nil {
			a.env = map[string]string{}
		}
		maps.Copy(a.env, body.Envs)
	case r.URL.Path == agentproto.TokenPath && r.Method == http.MethodPost:
		var body agentproto.SetTokenRequest
		if err := json.NewDecoder(r.Body).Decode(&body); err != nil || body.Token == "" {
			w.WriteHeader(http.StatusBadRequest)
			return
		}
		a.token = body.Token
	default:
		http.NotFound(w, r)
		return
	}
	w.WriteHeader(http.StatusOK)
}

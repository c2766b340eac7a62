// Package agentproto is the protocol between the moat server and the
// agent inside every sandbox: the port, the access token header, the
// in-sandbox paths and command line, the agent's config file, the moat
// extension routes (/moat/v1/*) and the protocol version. Client is the
// server's side of it; the agent (internal/execd) serves it; the test
// doubles serve package fakeagent for it. Everything that speaks to an
// agent uses this package, so the protocol lives in one place.
//
// The OpenSandbox execd API (commands, files, ...) is the agent's public
// surface and is specified in api/openapi/execd.yaml; this package holds
// only what the server itself needs to drive an agent.
//
// Versions. An agent reports its protocol version in the VersionHeader of
// its /ping response. Agents from before versioning send no header: they
// are version 1. A server drives every version from 1 to Version, so a
// sandbox whose agent came from an older moat keeps working after the
// server is upgraded; a feature newer than 1 is gated on the version the
// agent reported (Info.Supports).
//
// The package imports only the standard library and errdefs: the agent
// links it.
package agentproto

import (
	"strconv"
)

// Port is the TCP port the agent listens on inside every sandbox.
const Port = 44772

// TokenHeader carries the agent access token on every request.
const TokenHeader = "X-EXECD-ACCESS-TOKEN"

// The E2B face of the agent (docs/E2B.md): envd's Connect services and
// HTTP routes on EnvdPort, the code interpreter on CodeInterpreterPort.
// envd checks EnvdTokenHeader against the same access token as
// TokenHeader; the control plane hands that token out as
// envdAccessToken, and reports EnvdVersion, which gates SDK features.
const (
	EnvdPort            = 49983
	CodeInterpreterPort = 49999
	EnvdTokenHeader     = "X-Access-Token"
	EnvdVersion         = "0.6.4"
)

// VersionHeader is set by the agent on its /ping response to its
// protocol version (a decimal integer).
const VersionHeader = "X-Moat-Agent-Protocol"

// Version is the protocol version this moat speaks.
//
//	1: GET /ping, POST /moat/v1/env, POST /moat/v1/token (no VersionHeader)
//	2: /ping carries VersionHeader; the agent is the lean moat-agent
//	   artifact (BinPath), started without the "execd" verb
const Version = 2

// MinVersion is the oldest agent protocol this server drives.
const MinVersion = 1

// Routes of the protocol (method and path).
const (
	// PingPath answers 200 once the agent serves (OpenSandbox execd's
	// health check).
	PingPath = "/ping"
	// EnvPath adds variables to the environment of every later command,
	// session, PTY and code context (body SetEnvRequest).
	EnvPath = "/moat/v1/env"
	// TokenPath replaces the access token; the request is authorized by
	// the current one (body SetTokenRequest).
	TokenPath = "/moat/v1/token"
)

// SetEnvRequest is the body of POST EnvPath.
type SetEnvRequest struct {
	Envs map[string]string `json:"envs"`
}

// SetTokenRequest is the body of POST TokenPath.
type SetTokenRequest struct {
	Token string `json:"token"`
}

// TrustCAEnv carries a Credential Vault sandbox's CA certificate (PEM,
// public) in the agent's environment; the agent installs it in the
// sandbox's trust store before starting the entrypoint and, like every
// MOAT_* variable, does not pass it on to children.
const TrustCAEnv = "MOAT_TRUST_CA_PEM"

// Paths inside every sandbox of the native and Docker runtimes: the
// agent binary is bind-mounted read-only at BinPath and its config file
// at ConfigPath.
const (
	Dir        = "/.moat"
	BinPath    = Dir + "/moat-agent"
	ConfigPath = Dir + "/agent.json"
)

// Config is the agent's config file (ConfigPath), written by the runtime
// with mode 0600. It carries the token so that it never appears on argv.
type Config struct {
	Token string `json:"token"`
	Port  int    `json:"port"`
}

// Args is the command line of the agent as PID 1 of a sandbox: the agent
// with its config file, then the user entrypoint it starts as its child.
func Args(entrypoint []string) []string {
	return append([]string{BinPath, "--config", ConfigPath, "--"}, entrypoint...)
}

// Info is what an agent's /ping tells about it.
type Info struct {
	// Version is the agent's protocol version (1 for agents that do not
	// report one).
	Version int
}

// Supports reports whether the agent speaks at least version v.
func (i Info) Supports(v int) bool { return i.Version >= v }

// ParseVersion reads VersionHeader: "" is version 1 (agents from before
// versioning); anything else must be a positive integer.
func ParseVersion(h string) (int, bool) {
	if h == "" {
		return 1, true
	}
	v, err := strconv.Atoi(h)
	if err != nil || v < 1 {
		return 0, false
	}
	return v, true
}

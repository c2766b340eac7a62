// Package sidecar is moat's egress enforcement inside a Kubernetes pod:
// `moat controller egress-sidecar` runs in a container of its own (the
// only one of the pod with CAP_NET_ADMIN) and applies package egress's
// enforcer to the pod's network namespace, which every container of the
// pod shares: the nftables ruleset, the DNS proxy on 127.0.0.1:53 (the
// pod's only resolver) and the egress API on port 18080, guarded by the
// sandbox's egress token. The sandbox container holds neither
// CAP_NET_ADMIN nor CAP_NET_RAW, does not share the sidecar's process
// namespace and does not mount its state, so it cannot reach, stop or
// reconfigure the enforcer except through the API and its token.
//
// This file holds the contract between the controller, which adds the
// sidecar to a pod, and the sidecar itself (run_linux.go).
package sidecar

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"log/slog"
	"net/netip"
)

// Port is the egress API's port, OpenSandbox's egress sidecar port.
const Port = 18080

// The sidecar's environment (from the pod's egress Secret).
const (
	EnvToken  = "MOAT_EGRESS_TOKEN"        // the egress API token
	EnvPolicy = "MOAT_EGRESS_POLICY"       // the policy to start under (JSON)
	EnvDNS    = "MOAT_EGRESS_DNS_UPSTREAM" // "host:port,..." DNS upstreams
)

// StateDir is where the sidecar keeps the policy in force, so that a
// restarted sidecar resumes it (an emptyDir only the sidecar mounts).
const StateDir = "/var/lib/moat-egress"

// DNS is the address of the pod's resolver, the sidecar's DNS proxy.
const DNS = "127.0.0.1"

// Mark is the socket mark of the sidecar's own upstream DNS queries,
// which the ruleset lets through ("moae").
const Mark = 0x6d6f6165

// ProxyMark is the socket mark of the credential proxy's upstream
// connections ("moap"): the pod intercept table does not redirect them,
// and the ruleset filters them like the sandbox's own.
const ProxyMark = 0x6d6f6170

// ProxyPort is the credential proxy's port on the pod's loopback.
const ProxyPort = 18443

// The sidecar proves itself before the server sends it the token: the
// sandbox shares the pod's network namespace and could bind the API port
// while the sidecar restarts. On each new connection the server asks
// ProofPath with a fresh nonce, without the token, and sends requests on
// that connection only if ProofHeader is Proof(token, nonce).
const (
	ProofPath   = "/moat/v1/proof"
	ProofHeader = "Moat-Egress-Proof"
)

// Proof is what a sidecar holding token answers to nonce.
func Proof(token, nonce string) string {
	m := hmac.New(sha256.New, []byte(token))
	m.Write([]byte("moat-egress-proof\n" + nonce))
	return hex.EncodeToString(m.Sum(nil))
}

// Options configure Run.
type Options struct {
	// Token guards the egress API. Required.
	Token string
	// Policy is the policy to start under (JSON), unless StateDir holds a
	// newer one from an earlier run of the sidecar in this pod.
	Policy []byte
	// Upstreams are the DNS resolvers allowed names are forwarded to.
	// Required.
	Upstreams []string
	// NetNS is the namespace to filter (default /proc/self/ns/net: the
	// pod's).
	NetNS string
	// DNS is the proxy's address (default 127.0.0.1:53).
	DNS netip.AddrPort
	// Listen is the egress API's address (default ":18080").
	Listen string
	// StateDir keeps the policy in force (default StateDir).
	StateDir string
	// Logger defaults to slog.Default().
	Logger *slog.Logger
	// VaultKey, if set (vault.KeySize bytes, EnvVaultKey), enables the
	// Credential Vault: the credential proxy on 127.0.0.1:ProxyPort and
	// PUT VaultPath.
	VaultKey []byte
	// Ready, if set, is called once the policy is in force and the
	// listeners are bound.
	Ready func()
}

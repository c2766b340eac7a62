package server

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strings"

	"github.com/moat-sandbox/moat/internal/ingress"
)

// EnvSecureAccessKeys is read for Config.IngressSecureAccessKeys when the
// flag is not given (secrets on argv are visible to other users).
const EnvSecureAccessKeys = "MOAT_INGRESS_SECURE_ACCESS_KEYS"

// validateIngress checks the ingress options (part of Validate).
func (c *Config) validateIngress() []error {
	var errs []error
	if c.IngressSecureAccessKeys == "" {
		c.IngressSecureAccessKeys = os.Getenv(EnvSecureAccessKeys)
	}
	if c.IngressListen == "" {
		if c.IngressRouteMode != "" || c.IngressAddress != "" {
			errs = append(errs, errors.New("ingress-route-mode and ingress-address need --ingress-listen"))
		}
		return append(errs, c.validateRouteKeys()...)
	}
	if _, _, err := net.SplitHostPort(c.IngressListen); err != nil {
		errs = append(errs, fmt.Errorf("ingress-listen %q: want host:port or :port", c.IngressListen))
	}
	if c.IngressRouteMode != "" {
		if err := ingress.ValidateMode(c.IngressRouteMode); err != nil {
			errs = append(errs, err)
		}
		if c.IngressRouteMode == ingress.RouteWildcard {
			if c.IngressDomain == "" {
				errs = append(errs, errors.New("ingress-route-mode wildcard needs --ingress-domain"))
			} else if c.IngressAddress != "" && hostOf(strings.TrimPrefix(c.IngressAddress, "*.")) != strings.ToLower(c.IngressDomain) {
				errs = append(errs, fmt.Errorf("ingress-address %q must be the ingress domain %q (with an optional port) in wildcard mode", c.IngressAddress, c.IngressDomain))
			}
		}
	}
	if c.IngressAddress != "" && (strings.Contains(c.IngressAddress, "/") || strings.Contains(c.IngressAddress, " ")) {
		errs = append(errs, fmt.Errorf("ingress-address %q: want host[:port]", c.IngressAddress))
	}
	return append(errs, c.validateRouteKeys()...)
}

func (c *Config) validateRouteKeys() []error {
	if c.IngressSecureAccessKeys != "" {
		if _, err := ingress.NewSigner(c.IngressSecureAccessKeys, c.IngressActiveKey); err != nil {
			return []error{err}
		}
	} else if c.IngressActiveKey != "" {
		return []error{errors.New("ingress-active-key needs --ingress-secure-access-keys")}
	}
	return nil
}

func hostOf(hostport string) string {
	if h, _, err := net.SplitHostPort(hostport); err == nil {
		return strings.ToLower(h)
	}
	return strings.ToLower(hostport)
}

// ingressSetup builds the route signer over keys (the configured ones or
// the server's own, see routeKeysOf) and the endpoint shapes of the
// lifecycle API: all for every endpoint (nil without a route mode:
// endpoints stay the sandboxes' own addresses), signed for signed ones
// (?expires=; the gateway's, or the API listener's MountPrefix without
// one). cfg must have been validated.
func ingressSetup(cfg Config, keys string) (_ *ingress.Signer, all, signed *ingress.Endpoints, _ error) {
	active := cfg.IngressActiveKey
	if cfg.IngressSecureAccessKeys == "" {
		active = ""
	}
	signer, err := ingress.NewSigner(keys, active)
	if err != nil {
		return nil, nil, nil, err
	}
	if cfg.IngressListen == "" {
		// Signed endpoints on the API listener: the gateway mounted at
		// MountPrefix, in uri mode, at the server's public address.
		return signer, nil, &ingress.Endpoints{Mode: ingress.RouteURI, Address: cfg.PublicAddress, Prefix: MountPrefix, Signer: signer}, nil
	}
	lhost, lport, err := net.SplitHostPort(cfg.IngressListen)
	if err != nil {
		return nil, nil, nil, err
	}
	mode := cfg.IngressRouteMode
	if mode == "" {
		// Endpoints stay the sandboxes' own addresses; signed ones are
		// the gateway's uri routes.
		mode = ingress.RouteURI
	}
	e := &ingress.Endpoints{Mode: mode, Address: cfg.IngressAddress, Port: lport, Signer: signer}
	if e.Address == "" {
		switch {
		case cfg.IngressRouteMode == ingress.RouteWildcard:
			e.Address = net.JoinHostPort(cfg.IngressDomain, lport)
		case cfg.PublicAddress != "":
			e.Address = net.JoinHostPort(hostOf(cfg.PublicAddress), lport)
		case lhost != "" && !isUnspecified(lhost):
			e.Address = cfg.IngressListen
		}
		// else: the host each API request was sent to, with lport.
	}
	if cfg.IngressRouteMode == "" {
		return signer, nil, e, nil
	}
	return signer, e, e, nil
}

// MountPrefix is where moat serve mounts a signed-only gateway on its API
// listener when it has no --ingress-listen of its own.
const MountPrefix = "/ingress"

func isUnspecified(h string) bool {
	a, err := netip.ParseAddr(h)
	return err == nil && a.IsUnspecified()
}

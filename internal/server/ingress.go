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
	if c.IngressListen == "" {
		if c.IngressRouteMode != "" || c.IngressSecureAccessKeys != "" || c.IngressAddress != "" {
			errs = append(errs, errors.New("ingress-route-mode, ingress-address and ingress-secure-access-keys need --ingress-listen"))
		}
		return errs
	}
	if c.IngressSecureAccessKeys == "" {
		c.IngressSecureAccessKeys = os.Getenv(EnvSecureAccessKeys)
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
	if c.IngressSecureAccessKeys != "" {
		if _, err := ingress.NewSigner(c.IngressSecureAccessKeys, c.IngressActiveKey); err != nil {
			errs = append(errs, err)
		}
	} else if c.IngressActiveKey != "" {
		errs = append(errs, errors.New("ingress-active-key needs --ingress-secure-access-keys"))
	}
	return errs
}

func hostOf(hostport string) string {
	if h, _, err := net.SplitHostPort(hostport); err == nil {
		return strings.ToLower(h)
	}
	return strings.ToLower(hostport)
}

// ingressSetup builds the route signer (nil without keys) and the endpoint
// shapes of the lifecycle API (nil without a route mode: endpoints stay
// the sandboxes' own addresses). cfg must have been validated.
func ingressSetup(cfg Config) (*ingress.Signer, *ingress.Endpoints, error) {
	if cfg.IngressListen == "" {
		return nil, nil, nil
	}
	var signer *ingress.Signer
	if cfg.IngressSecureAccessKeys != "" {
		var err error
		if signer, err = ingress.NewSigner(cfg.IngressSecureAccessKeys, cfg.IngressActiveKey); err != nil {
			return nil, nil, err
		}
	}
	if cfg.IngressRouteMode == "" {
		return signer, nil, nil
	}
	lhost, lport, err := net.SplitHostPort(cfg.IngressListen)
	if err != nil {
		return nil, nil, err
	}
	e := &ingress.Endpoints{Mode: cfg.IngressRouteMode, Address: cfg.IngressAddress, Port: lport, Signer: signer}
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
	return signer, e, nil
}

func isUnspecified(h string) bool {
	a, err := netip.ParseAddr(h)
	return err == nil && a.IsUnspecified()
}

package image

import (
	"fmt"
	"net"
	"net/netip"
	"strings"

	"github.com/moat-sandbox/moat/internal/errdefs"
)

// WithAllowedRegistries restricts Pull to registries matching one of
// patterns (empty: any registry). A pattern is a registry host with an
// optional port ("registry.example.com", "10.0.0.5:5000"), a wildcard
// host ("*.example.com", any port), or "loopback" (localhost, 127.0.0.0/8
// and ::1 on any port). A refused pull is ErrPermissionDenied and sends
// nothing to the network, not even a DNS query.
func WithAllowedRegistries(patterns []string) Option {
	return func(o *options) { o.registries = append([]string(nil), patterns...) }
}

// ValidRegistryPattern reports whether p is a well-formed pattern for
// WithAllowedRegistries.
func ValidRegistryPattern(p string) error {
	if p == "loopback" {
		return nil
	}
	h := strings.TrimPrefix(p, "*.")
	if h == "" || strings.ContainsAny(h, "/@ *") {
		return fmt.Errorf("registry pattern %q: want host[:port], *.domain or loopback: %w", p, errdefs.ErrInvalidArgument)
	}
	return nil
}

func (o *options) registryAllowed(registry string) error {
	if len(o.registries) == 0 {
		return nil
	}
	host := registry
	if h, _, err := net.SplitHostPort(registry); err == nil {
		host = h
	}
	host = strings.Trim(host, "[]")
	for _, p := range o.registries {
		switch {
		case p == "loopback":
			if host == "localhost" {
				return nil
			}
			if a, err := netip.ParseAddr(host); err == nil && a.IsLoopback() {
				return nil
			}
		case strings.HasPrefix(p, "*."):
			if strings.HasSuffix(host, p[1:]) {
				return nil
			}
		case p == registry || p == host:
			return nil
		}
	}
	return errdefs.WithPublic(fmt.Errorf("registry %s is not in this server's allowed registries: %w: %w", registry, ErrRegistryNotAllowed, errdefs.ErrPermissionDenied),
		"", fmt.Sprintf("pulls from registry %s are not allowed by this server's configuration", registry))
}

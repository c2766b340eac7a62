package vault

import (
	"net/http"
	"net/netip"
	"net/url"
	"path"
	"slices"
	"strings"

	"github.com/moat-sandbox/moat/internal/egress/policy"
)

// minScrub is the shortest value Secrets lists for scrubbing.
const minScrub = 6

// Rules is the compiled form of a State that the egress proxy applies to
// each request. It is immutable and safe for concurrent use; a PATCH
// publishes a new *Rules, so a change takes effect at the next request,
// even on a kept-alive connection. The nil *Rules matches nothing.
type Rules struct {
	revision int64
	exact    map[string][]*rule // by host
	wildcard map[string][]*rule // by suffix after "*."
	secrets  []string           // values to scrub from responses, longest first
}

type rule struct {
	name    string
	schemes []string
	ports   []int
	methods []string
	paths   []string
	inject  Injection
}

// Injection is what a matching binding adds to a request.
type Injection struct {
	// Binding is the binding's name (for logs; it is not secret).
	Binding string
	headers []injected
	query   []injected
	trusted []netip.Prefix // the binding's match.trustedCidrs
}

// Trusts reports whether the binding names addr as a trusted destination
// (match.trustedCidrs), which may get the credential although moat's DNS
// did not resolve it for the host.
func (i *Injection) Trusts(addr netip.Addr) bool {
	addr = addr.Unmap()
	for _, p := range i.trusted {
		if p.Contains(addr) {
			return true
		}
	}
	return false
}

type injected struct {
	name  string
	value Secret
}

// Compile builds the Rules of s (nil s: no rules).
func (s *State) Compile() *Rules {
	if s == nil {
		return nil
	}
	r := &Rules{revision: s.Revision, exact: map[string][]*rule{}, wildcard: map[string][]*rule{}}
	seen := map[string]bool{}
	addSecret := func(v string) {
		// Values shorter than minScrub are not scrubbed: masking every
		// "a" or "42" of a response would corrupt it, and such values
		// are not secrets worth the damage.
		if len(v) >= minScrub && !seen[v] {
			seen[v] = true
			r.secrets = append(r.secrets, v)
		}
	}
	for _, b := range s.Bindings {
		ru := &rule{name: b.Name, schemes: b.Match.Schemes, ports: b.Match.Ports, methods: b.Match.Methods,
			paths: b.Match.Paths, inject: Injection{Binding: b.Name}}
		for _, c := range b.Match.TrustedCIDRs {
			if p, err := netip.ParsePrefix(c); err == nil {
				ru.inject.trusted = append(ru.inject.trusted, p)
			}
		}
		val := func(name string) Secret { return s.Credentials[name].Value }
		switch b.Auth.Type {
		case AuthBearer:
			v := val(b.Auth.Credential)
			ru.inject.headers = []injected{{"Authorization", NewSecret("Bearer " + v.Reveal())}}
			addSecret(v.Reveal())
		case AuthBasic:
			v := val(b.Auth.Credential)
			ru.inject.headers = []injected{{"Authorization", NewSecret("Basic " + v.Reveal())}}
			addSecret(v.Reveal())
		case AuthAPIKey:
			v := val(b.Auth.Credential)
			if b.Auth.In == "query" {
				ru.inject.query = []injected{{b.Auth.Name, v}}
				addSecret(url.QueryEscape(v.Reveal()))
			} else {
				ru.inject.headers = []injected{{b.Auth.Name, v}}
			}
			addSecret(v.Reveal())
		case AuthCustomHeaders:
			for _, h := range b.Auth.Headers {
				v := val(h.Credential)
				ru.inject.headers = append(ru.inject.headers, injected{h.Name, v})
				addSecret(v.Reveal())
			}
		}
		for _, h := range b.Match.Hosts {
			if suffix, ok := strings.CutPrefix(h, "*."); ok {
				r.wildcard[suffix] = append(r.wildcard[suffix], ru)
			} else {
				r.exact[h] = append(r.exact[h], ru)
			}
		}
	}
	slices.SortFunc(r.secrets, func(a, b string) int { return len(b) - len(a) })
	return r
}

// Revision is the vault revision the rules were compiled from.
func (r *Rules) Revision() int64 {
	if r == nil {
		return 0
	}
	return r.revision
}

// candidates are the rules bound to host: exact ones first, then
// wildcards from the most to the least specific suffix.
func (r *Rules) candidates(host string) []*rule {
	if r == nil {
		return nil
	}
	host = policy.NormalizeName(host)
	out := slices.Clone(r.exact[host])
	for i := 0; i < len(host); i++ {
		if host[i] == '.' {
			out = append(out, r.wildcard[host[i+1:]]...)
		}
	}
	return out
}

// Intercepts reports whether some binding is bound to host for scheme and
// port: the proxy terminates TLS (or parses HTTP) only for such
// connections and tunnels every other one untouched.
func (r *Rules) Intercepts(scheme, host string, port int) bool {
	for _, ru := range r.candidates(host) {
		if slices.Contains(ru.schemes, scheme) && slices.Contains(ru.ports, port) {
			return true
		}
	}
	return false
}

// Match returns the injection for a request, or nil. host is the
// request's host without port; rawPath its path as sent (escaped).
//
// A path that is not canonical (dot segments, "//", escaped slashes)
// matches only the catch-all pattern "/*": a server that normalizes
// "/public/../admin" must not receive a credential bound to "/public/*".
func (r *Rules) Match(scheme, host string, port int, method, rawPath string) *Injection {
	p, canonical := canonicalPath(rawPath)
	for _, ru := range r.candidates(host) {
		if !slices.Contains(ru.schemes, scheme) || !slices.Contains(ru.ports, port) || !slices.Contains(ru.methods, method) {
			continue
		}
		for _, pat := range ru.paths {
			if pat == "/*" || (canonical && globMatch(pat, p)) {
				inj := ru.inject
				return &inj
			}
		}
	}
	return nil
}

// canonicalPath decodes rawPath and reports whether it is canonical.
func canonicalPath(rawPath string) (string, bool) {
	if rawPath == "" {
		return "/", true
	}
	p, err := url.PathUnescape(rawPath)
	if err != nil || !strings.HasPrefix(p, "/") || strings.Contains(strings.ToLower(rawPath), "%2f") || strings.Contains(rawPath, "%5C") || strings.Contains(rawPath, "%5c") || strings.Contains(p, "\\") {
		return p, false
	}
	clean := path.Clean(p)
	if strings.HasSuffix(p, "/") && clean != "/" {
		clean += "/"
	}
	return p, clean == p
}

// globMatch matches s against pattern, where "*" matches any run of
// characters (including "/") and everything else is literal.
func globMatch(pattern, s string) bool {
	parts := strings.Split(pattern, "*")
	if len(parts) == 1 {
		return pattern == s
	}
	if !strings.HasPrefix(s, parts[0]) {
		return false
	}
	s = s[len(parts[0]):]
	last := parts[len(parts)-1]
	for _, mid := range parts[1 : len(parts)-1] {
		i := strings.Index(s, mid)
		if i < 0 {
			return false
		}
		s = s[i+len(mid):]
	}
	return strings.HasSuffix(s, last)
}

// Apply sets the injection's headers (replacing whatever the client sent
// under those names) and query parameters on a request.
func (inj *Injection) Apply(h http.Header, u *url.URL) {
	for _, kv := range inj.headers {
		h.Del(kv.name)
		h.Set(kv.name, kv.value.Reveal())
	}
	if len(inj.query) > 0 {
		q := u.Query()
		for _, kv := range inj.query {
			q.Set(kv.name, kv.value.Reveal())
		}
		u.RawQuery = q.Encode()
	}
}

// Secrets returns every credential value (and its rendered forms) the
// rules inject, longest first, so a proxy can scrub them from responses
// before they reach the sandbox. Values under 6 bytes are left out.
func (r *Rules) Secrets() []string {
	if r == nil {
		return nil
	}
	return slices.Clone(r.secrets)
}

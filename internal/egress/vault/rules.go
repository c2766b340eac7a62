package vault

import (
	"encoding/json"
	"errors"
	"mime"
	"net/http"
	"net/netip"
	"net/url"
	"path"
	"slices"
	"strings"
	"unicode/utf8"

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
	subs    []substitution
	trusted []netip.Prefix // the binding's match.trustedCidrs
}

// substitution is a compiled Substitution.
type substitution struct {
	placeholder string
	value       Secret
	in          []string
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
		for _, sub := range b.Auth.Substitutions {
			v := val(sub.Credential)
			ru.inject.subs = append(ru.inject.subs, substitution{placeholder: sub.Placeholder, value: v, in: sub.In})
			for _, form := range encodings(v.Reveal()) {
				addSecret(form)
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

// ErrSubstitutedPath refuses a request whose path a substitution made
// ambiguous (a value that decodes to "/", "\\" or a dot segment), which
// could move the credential to a path the binding does not name.
var ErrSubstitutedPath = errors.New("the request path is ambiguous after placeholder substitution")

// Apply replaces the binding's placeholders in the path, query and
// headers (never in framing or proxy headers), then sets the injection's
// headers (replacing whatever the client sent under those names) and
// query parameters. It returns ErrSubstitutedPath, and leaves u alone,
// when a substituted path is not canonical.
func (inj *Injection) Apply(h http.Header, u *url.URL) error {
	if len(inj.subs) > 0 {
		if err := inj.substituteURL(u); err != nil {
			return err
		}
		if reps := inj.replacements(InHeader, ""); len(reps) > 0 {
			for k, vs := range h {
				if reservedHeaders[strings.ToLower(k)] {
					continue
				}
				for i, v := range vs {
					vs[i], _ = replaceAll(v, reps)
				}
			}
		}
	}
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
	return nil
}

func (inj *Injection) substituteURL(u *url.URL) error {
	if reps := inj.replacements(InPath, ""); len(reps) > 0 {
		raw, changed := replaceAll(u.EscapedPath(), reps)
		if changed {
			p, canonical := canonicalPath(raw)
			if !canonical {
				return ErrSubstitutedPath
			}
			u.Path, u.RawPath = p, raw
		}
	}
	if reps := inj.replacements(InQuery, ""); len(reps) > 0 {
		u.RawQuery, _ = replaceAll(u.RawQuery, reps)
	}
	return nil
}

// SubstitutesBody reports whether the injection replaces placeholders in
// request bodies, so that the proxy reads the body (up to
// MaxSubstitutionBody) and calls SubstituteBody.
func (inj *Injection) SubstitutesBody() bool {
	for _, s := range inj.subs {
		if slices.Contains(s.in, InBody) {
			return true
		}
	}
	return false
}

// SubstituteBody replaces the body placeholders in body, a whole request
// body with the given Content-Type and Content-Encoding, and reports
// whether it changed. As upstream, compressed, multipart and non-UTF-8
// bodies are left alone.
func (inj *Injection) SubstituteBody(contentType, contentEncoding string, body []byte) ([]byte, bool) {
	if ce := strings.ToLower(strings.TrimSpace(contentEncoding)); ce != "" && ce != "identity" {
		return body, false
	}
	mt, _, _ := mime.ParseMediaType(contentType)
	if strings.HasPrefix(mt, "multipart/") || !utf8.Valid(body) {
		return body, false
	}
	reps := inj.replacements(InBody, mt)
	if len(reps) == 0 {
		return body, false
	}
	out, changed := replaceAll(string(body), reps)
	if !changed {
		return body, false
	}
	return []byte(out), true
}

type replacement struct{ placeholder, value string }

// replacements are the placeholder → encoded value pairs for a surface;
// mediaType matters for the body only.
func (inj *Injection) replacements(surface, mediaType string) []replacement {
	var out []replacement
	for _, s := range inj.subs {
		if !slices.Contains(s.in, surface) {
			continue
		}
		v := encodeFor(s.value.Reveal(), surface, mediaType)
		out = append(out, replacement{s.placeholder, v})
		// A client may have percent-encoded the placeholder in the URL
		// (and Go's URL parser re-encodes a path it finds invalid).
		switch surface {
		case InPath:
			out = appendVariant(out, url.PathEscape(s.placeholder), v)
		case InQuery:
			out = appendVariant(out, url.QueryEscape(s.placeholder), v)
			out = appendVariant(out, strings.ReplaceAll(url.QueryEscape(s.placeholder), "+", "%20"), v)
		}
	}
	return out
}

func appendVariant(reps []replacement, placeholder, value string) []replacement {
	for _, r := range reps {
		if r.placeholder == placeholder {
			return reps
		}
	}
	return append(reps, replacement{placeholder, value})
}

// encodeFor renders a value for where it is substituted.
func encodeFor(v, surface, mediaType string) string {
	switch surface {
	case InPath:
		return url.PathEscape(v)
	case InQuery:
		return strings.ReplaceAll(url.QueryEscape(v), "+", "%20")
	case InBody:
		switch {
		case mediaType == "application/json" || strings.HasSuffix(mediaType, "+json"):
			return jsonEscape(v)
		case mediaType == "application/x-www-form-urlencoded":
			return url.QueryEscape(v)
		}
	}
	return v
}

// encodings are the forms a substituted value can take on the wire, all
// scrubbed from responses.
func encodings(v string) []string {
	return []string{v, url.PathEscape(v), url.QueryEscape(v), strings.ReplaceAll(url.QueryEscape(v), "+", "%20"), jsonEscape(v)}
}

// jsonEscape is v as the inside of a JSON string.
func jsonEscape(v string) string {
	b, _ := json.Marshal(v)
	return string(b[1 : len(b)-1])
}

// replaceAll replaces every placeholder of reps in s in one left-to-right
// pass: at each position the longest placeholder wins, and inserted values
// are never scanned again (a value that contains a placeholder stays as
// it is).
func replaceAll(s string, reps []replacement) (string, bool) {
	next := make([]int, len(reps)) // next occurrence of each placeholder at or after i, -1 none
	for k, r := range reps {
		next[k] = strings.Index(s, r.placeholder)
	}
	var b strings.Builder
	i, changed := 0, false
	for {
		best := -1
		for k, r := range reps {
			if next[k] >= 0 && next[k] < i {
				if j := strings.Index(s[i:], r.placeholder); j >= 0 {
					next[k] = i + j
				} else {
					next[k] = -1
				}
			}
			if next[k] < 0 {
				continue
			}
			if best < 0 || next[k] < next[best] || (next[k] == next[best] && len(r.placeholder) > len(reps[best].placeholder)) {
				best = k
			}
		}
		if best < 0 {
			break
		}
		if !changed {
			b.Grow(len(s))
			changed = true
		}
		b.WriteString(s[i:next[best]])
		b.WriteString(reps[best].value)
		i = next[best] + len(reps[best].placeholder)
	}
	if !changed {
		return s, false
	}
	b.WriteString(s[i:])
	return b.String(), true
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

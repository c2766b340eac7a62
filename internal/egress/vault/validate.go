package vault

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"slices"
	"strings"
	"unicode/utf8"

	"github.com/moat-sandbox/moat/internal/egress/policy"
)

// decodeStrict decodes one JSON value, refusing unknown fields and
// trailing data. Messages name fields and offsets, never input text.
func decodeStrict(body []byte, v any) error {
	if len(bytes.TrimSpace(body)) == 0 {
		return invalid("request body is required")
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return invalid("invalid JSON body: %s", jsonProblem(err))
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return invalid("invalid JSON body: trailing data")
	}
	return nil
}

func jsonProblem(err error) string {
	var syn *json.SyntaxError
	var typ *json.UnmarshalTypeError
	switch {
	case errors.As(err, &syn):
		return fmt.Sprintf("syntax error at byte %d", syn.Offset)
	case errors.As(err, &typ):
		if typ.Field != "" {
			return fmt.Sprintf("field %s: expected %s", typ.Field, typ.Type)
		}
		return fmt.Sprintf("expected %s", typ.Type)
	case errors.Is(err, io.ErrUnexpectedEOF):
		return "unexpected end of input"
	case strings.HasPrefix(err.Error(), "json: unknown field "):
		return "unknown field " + strings.TrimPrefix(err.Error(), "json: unknown field ")
	case strings.Contains(err.Error(), "credential value must be a JSON string"):
		return "a credential value must be a JSON string"
	default:
		return "malformed JSON"
	}
}

// reservedHeaders may not be set by a binding: they frame the request or
// belong to proxies, and overriding them would break or smuggle requests.
var reservedHeaders = map[string]bool{
	"host": true, "content-length": true, "content-type": true, "transfer-encoding": true,
	"connection": true, "upgrade": true, "te": true, "trailer": true, "keep-alive": true,
	"proxy-authorization": true, "proxy-authenticate": true, "proxy-connection": true,
	"forwarded": true, "x-forwarded-for": true, "x-forwarded-host": true, "x-forwarded-proto": true,
}

// checkName validates a credential or binding name: 1-128 bytes of
// printable UTF-8 without "/" (names appear in URL paths).
func checkName(kind, name string) (string, error) {
	n := strings.TrimSpace(name)
	switch {
	case n == "":
		return "", invalid("%s name must not be empty", kind)
	case len(n) > MaxNameBytes:
		return "", invalid("%s name longer than %d bytes", kind, MaxNameBytes)
	case !utf8.ValidString(n) || strings.ContainsFunc(n, func(r rune) bool { return r < 0x20 || r == 0x7f || r == '/' }):
		return "", invalid("%s name %q: only printable characters, no \"/\"", kind, n)
	}
	return n, nil
}

// checkValue validates a credential value: non-empty, at most
// MaxValueBytes, and valid in an HTTP header (no CR, LF, NUL or other
// control characters but tab), so that injecting it cannot split a request.
func checkValue(name string, v Secret) error {
	s := v.Reveal()
	switch {
	case s == "":
		return invalid("credential %q: value must not be empty", name)
	case len(s) > MaxValueBytes:
		return invalid("credential %q: value larger than %d bytes", name, MaxValueBytes)
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; (c < 0x20 && c != '\t') || c == 0x7f {
			return invalid("credential %q: value contains a control character (byte %d)", name, i)
		}
	}
	return nil
}

// normalizeCredential validates c and returns its stored form.
func normalizeCredential(c Credential, rev int64) (StoredCredential, error) {
	name, err := checkName("credential", c.Name)
	if err != nil {
		return StoredCredential{}, err
	}
	st := strings.TrimSpace(c.Source.Type)
	if st == "" {
		st = "inline"
	}
	if st != "inline" {
		return StoredCredential{}, invalid("credential %q: unsupported source type %q (only \"inline\")", name, st)
	}
	if err := checkValue(name, c.Source.Value); err != nil {
		return StoredCredential{}, err
	}
	return StoredCredential{Name: name, SourceType: st, Value: c.Source.Value, Revision: rev}, nil
}

// normalizeBinding validates b and returns it with defaults filled in.
func normalizeBinding(b Binding) (Binding, error) {
	name, err := checkName("binding", b.Name)
	if err != nil {
		return Binding{}, err
	}
	b.Name = name
	if b.Match, err = normalizeMatch(b.Match); err != nil {
		return Binding{}, invalid("binding %q: %s", name, err)
	}
	if b.Auth, err = normalizeAuth(b.Auth); err != nil {
		return Binding{}, invalid("binding %q: %s", name, err)
	}
	return b, nil
}

// schemePort is the port a scheme uses when a match names no ports.
var schemePort = map[string]int{"https": 443, "http": 80}

// InterceptPorts are the TCP ports the proxy intercepts; a binding may
// name no other.
var InterceptPorts = []int{80, 443}

func normalizeMatch(m Match) (Match, error) {
	out := Match{}
	if len(m.Hosts) == 0 {
		return Match{}, fmt.Errorf("match.hosts must not be empty")
	}
	for _, l := range [][]string{m.Schemes, m.Hosts, m.Methods, m.Paths} {
		if len(l) > MaxPatterns {
			return Match{}, fmt.Errorf("at most %d entries per match list", MaxPatterns)
		}
	}
	schemes := m.Schemes
	if len(schemes) == 0 {
		schemes = []string{"https"}
	}
	for _, s := range schemes {
		s = strings.ToLower(strings.TrimSpace(s))
		if _, ok := schemePort[s]; !ok {
			return Match{}, fmt.Errorf("match.schemes: unsupported scheme %q (https or http)", s)
		}
		out.Schemes = appendUnique(out.Schemes, s)
	}
	if len(m.Ports) == 0 {
		for _, s := range out.Schemes {
			out.Ports = appendUnique(out.Ports, schemePort[s])
		}
	}
	for _, p := range m.Ports {
		if !slices.Contains(InterceptPorts, p) {
			return Match{}, fmt.Errorf("match.ports: %d is not an intercepted port (80 or 443)", p)
		}
		out.Ports = appendUnique(out.Ports, p)
	}
	slices.Sort(out.Ports)
	for _, h := range m.Hosts {
		n, err := normalizeHost(h)
		if err != nil {
			return Match{}, err
		}
		out.Hosts = appendUnique(out.Hosts, n)
	}
	methods := m.Methods
	if len(methods) == 0 {
		methods = []string{"GET", "POST", "PUT", "PATCH", "DELETE"}
	}
	for _, meth := range methods {
		meth = strings.ToUpper(strings.TrimSpace(meth))
		if meth == "" || !isToken(meth) {
			return Match{}, fmt.Errorf("match.methods: invalid method %q", meth)
		}
		out.Methods = appendUnique(out.Methods, meth)
	}
	var err error
	if out.Paths, err = normalizePaths(m.Paths); err != nil {
		return Match{}, err
	}
	if len(m.TrustedCIDRs) > MaxPatterns {
		return Match{}, fmt.Errorf("at most %d entries per match list", MaxPatterns)
	}
	for _, c := range m.TrustedCIDRs {
		pfx, err := netip.ParsePrefix(strings.TrimSpace(c))
		if err != nil {
			return Match{}, fmt.Errorf("match.trustedCidrs: %q is not a CIDR prefix (e.g. 10.0.0.0/24)", c)
		}
		if pfx.Bits() == 0 {
			return Match{}, fmt.Errorf("match.trustedCidrs: %q trusts every address; name the destinations", c)
		}
		out.TrustedCIDRs = appendUnique(out.TrustedCIDRs, pfx.Masked().String())
	}
	return out, nil
}

// normalizePaths checks a match's path patterns (default every path):
// each starts with / and has no query, fragment, space or control
// character, as a request's path never does.
func normalizePaths(paths []string) ([]string, error) {
	if len(paths) == 0 {
		paths = []string{"/*"}
	}
	var out []string
	for _, p := range paths {
		p = strings.TrimSpace(p)
		switch {
		case !strings.HasPrefix(p, "/"):
			return nil, fmt.Errorf("match.paths: pattern %q must start with /", p)
		case len(p) > maxPathPattern:
			return nil, fmt.Errorf("match.paths: pattern longer than %d bytes", maxPathPattern)
		case strings.ContainsAny(p, "?#") || strings.ContainsFunc(p, func(r rune) bool { return r <= 0x20 || r == 0x7f }):
			return nil, fmt.Errorf("match.paths: pattern %q may not contain spaces, control characters, ? or #", p)
		}
		out = appendUnique(out, p)
	}
	return out, nil
}

// normalizeHost accepts a DNS name or "*.suffix"; IP addresses are
// refused (credentials go to names, whose TLS certificates are checked).
func normalizeHost(h string) (string, error) {
	n, kind, err := policy.NormalizeTarget(h)
	if err != nil {
		return "", fmt.Errorf("match.hosts: %q is not a valid host pattern (a DNS name or *.suffix)", strings.TrimSpace(h))
	}
	switch kind {
	case policy.KindDomain, policy.KindWildcard:
		return n, nil
	default:
		return "", fmt.Errorf("match.hosts: %q: credentials bind to DNS names, not IP addresses", strings.TrimSpace(h))
	}
}

func normalizeAuth(a Auth) (Auth, error) {
	out := Auth{Type: strings.TrimSpace(a.Type)}
	ref := func(what, c string) (string, error) {
		c = strings.TrimSpace(c)
		if c == "" {
			return "", fmt.Errorf("%s auth needs a credential name", what)
		}
		return c, nil
	}
	var err error
	switch out.Type {
	case AuthBearer, AuthBasic:
		if a.Name != "" || a.In != "" || len(a.Headers) > 0 {
			return Auth{}, fmt.Errorf("%s auth takes only a credential", out.Type)
		}
		out.Credential, err = ref(out.Type, a.Credential)
	case AuthAPIKey:
		out.In = strings.ToLower(strings.TrimSpace(a.In))
		if out.In == "" {
			out.In = "header"
		}
		if len(a.Headers) > 0 {
			return Auth{}, fmt.Errorf("apiKey auth takes a name and a credential, not headers")
		}
		switch out.In {
		case "header":
			out.Name, err = checkHeaderName(a.Name)
			out.In = "" // the upstream default; shown only for query keys
		case "query":
			out.Name, err = checkParamName(a.Name)
		default:
			return Auth{}, fmt.Errorf("apiKey auth: in must be \"header\" or \"query\", not %q", out.In)
		}
		if err != nil {
			return Auth{}, err
		}
		out.Credential, err = ref(out.Type, a.Credential)
	case AuthCustomHeaders:
		if a.Credential != "" || a.Name != "" || a.In != "" {
			return Auth{}, fmt.Errorf("customHeaders auth takes only headers")
		}
		if len(a.Headers) == 0 || len(a.Headers) > MaxHeaders {
			return Auth{}, fmt.Errorf("customHeaders auth needs 1 to %d headers", MaxHeaders)
		}
		seen := map[string]bool{}
		for _, h := range a.Headers {
			name, err := checkHeaderName(h.Name)
			if err != nil {
				return Auth{}, err
			}
			if seen[strings.ToLower(name)] {
				return Auth{}, fmt.Errorf("customHeaders auth: header %q appears twice", name)
			}
			seen[strings.ToLower(name)] = true
			c, err := ref("customHeaders", h.Credential)
			if err != nil {
				return Auth{}, err
			}
			out.Headers = append(out.Headers, HeaderRef{Name: name, Credential: c})
		}
	case AuthPassthrough:
		if a.Credential != "" || a.Name != "" || a.In != "" || len(a.Headers) > 0 {
			return Auth{}, fmt.Errorf("passthrough auth takes only substitutions")
		}
	case "":
		return Auth{}, fmt.Errorf("auth.type is required (%s)", authTypes)
	default:
		return Auth{}, fmt.Errorf("unsupported auth type %q (%s)", out.Type, authTypes)
	}
	if err != nil {
		return Auth{}, err
	}
	out.Substitutions, err = normalizeSubstitutions(a.Substitutions)
	return out, err
}

const authTypes = "bearer, basic, apiKey, customHeaders or passthrough"

// substitutionSurfaces are the places a placeholder may be replaced.
var substitutionSurfaces = []string{InPath, InQuery, InHeader, InBody}

// normalizeSubstitutions checks a binding's substitutions: each names a
// credential, a placeholder of 1 to MaxPlaceholderBytes printable bytes
// (no space: a placeholder is one token of a request line or header),
// and at least one surface; two substitutions may not share a placeholder.
func normalizeSubstitutions(subs []Substitution) ([]Substitution, error) {
	if len(subs) == 0 {
		return nil, nil
	}
	if len(subs) > MaxSubstitutions {
		return nil, fmt.Errorf("at most %d substitutions per binding", MaxSubstitutions)
	}
	out := make([]Substitution, 0, len(subs))
	seen := map[string]bool{}
	for i, sub := range subs {
		c := strings.TrimSpace(sub.Credential)
		if c == "" {
			return nil, fmt.Errorf("substitutions[%d] needs a credential name", i)
		}
		ph := strings.TrimSpace(sub.Placeholder)
		switch {
		case ph == "":
			return nil, fmt.Errorf("substitutions[%d] needs a placeholder", i)
		case len(ph) > MaxPlaceholderBytes:
			return nil, fmt.Errorf("substitutions[%d]: placeholder longer than %d bytes", i, MaxPlaceholderBytes)
		case !utf8.ValidString(ph) || strings.ContainsFunc(ph, func(r rune) bool { return r <= 0x20 || r == 0x7f }):
			return nil, fmt.Errorf("substitutions[%d]: a placeholder is printable text without spaces or control characters", i)
		case seen[ph]:
			return nil, fmt.Errorf("substitutions[%d]: placeholder %q appears twice", i, ph)
		}
		seen[ph] = true
		if len(sub.In) == 0 {
			return nil, fmt.Errorf("substitutions[%d] needs \"in\": one or more of path, query, header, body", i)
		}
		var in []string
		for _, surface := range sub.In {
			surface = strings.ToLower(strings.TrimSpace(surface))
			if !slices.Contains(substitutionSurfaces, surface) {
				return nil, fmt.Errorf("substitutions[%d]: unsupported surface %q (path, query, header or body)", i, surface)
			}
			in = appendUnique(in, surface)
		}
		out = append(out, Substitution{Credential: c, Placeholder: ph, In: in})
	}
	return out, nil
}

func checkHeaderName(n string) (string, error) {
	n = strings.TrimSpace(n)
	if n == "" || len(n) > MaxNameBytes || !isToken(n) {
		return "", fmt.Errorf("invalid header name %q", n)
	}
	if reservedHeaders[strings.ToLower(n)] {
		return "", fmt.Errorf("header %q is reserved and cannot carry a credential", n)
	}
	return http.CanonicalHeaderKey(n), nil
}

func checkParamName(n string) (string, error) {
	n = strings.TrimSpace(n)
	if n == "" || len(n) > MaxNameBytes || strings.ContainsFunc(n, func(r rune) bool { return r <= 0x20 || r >= 0x7f || strings.ContainsRune("&=#?+%", r) }) {
		return "", fmt.Errorf("invalid query parameter name %q", n)
	}
	return n, nil
}

// isToken reports an RFC 9110 token (header names, methods).
func isToken(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0) {
			return false
		}
	}
	return s != ""
}

func appendUnique[T comparable](s []T, v T) []T {
	if slices.Contains(s, v) {
		return s
	}
	return append(s, v)
}

// refs are the credential names a binding's auth uses.
func (a Auth) refs() []string {
	var out []string
	switch a.Type {
	case AuthCustomHeaders:
		for _, h := range a.Headers {
			out = append(out, h.Credential)
		}
	case AuthPassthrough:
	default:
		out = append(out, a.Credential)
	}
	for _, s := range a.Substitutions {
		out = append(out, s.Credential)
	}
	return out
}

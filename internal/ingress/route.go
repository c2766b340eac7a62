package ingress

import (
	"net"
	"net/http"
	"net/url"
	"strings"

	"github.com/moat-sandbox/moat/internal/errdefs"
)

// Routing header and modes.
const (
	// HeaderIngressTo carries "<id>-<port>" in header mode (upstream name).
	HeaderIngressTo = "OpenSandbox-Ingress-To"
	// HeaderSecureAccess carries a sandbox's secure-access token (OSEP-0011).
	HeaderSecureAccess = "OpenSandbox-Secure-Access"
	// QueryAccessToken is the query-parameter form of HeaderSecureAccess,
	// for browsers and WebSocket clients that cannot set headers.
	QueryAccessToken = "access_token"
	// HeaderE2BSandboxID and HeaderE2BSandboxPort are E2B's routing
	// headers, which its SDKs send on every sandbox call.
	HeaderE2BSandboxID   = "E2b-Sandbox-Id"
	HeaderE2BSandboxPort = "E2b-Sandbox-Port"
)

// Route modes, reported in logs.
const (
	modeHeader = "header"
	modeE2B    = "e2b header"
	modeHost   = "host"
	modePath   = "path"
)

// candidate is one reading of a route: a sandbox id and a port.
type candidate struct {
	id   string
	port int
}

// route is a parsed sandbox address. A host label can be read two ways
// ("<port>-<id>" and "<id>-<port>"); the candidates are tried in order and a
// later one only when the earlier sandbox does not exist.
type route struct {
	mode  string
	cands []candidate
	// rawPath and path are the upstream path (escaped and decoded) in path
	// mode; empty means "the request's own path".
	rawPath, path string
	// signed is set for a signed route (OSEP-0011); cands then has exactly
	// one entry, the one the signature covers.
	signed *signedToken
	// e2b marks a route by E2B's headers: its errors are E2B's edge
	// bodies (502 for a sandbox that is gone, as the SDKs expect).
	e2b bool
}

// parseRoute finds the sandbox a request is addressed to. The first form
// present wins, in this order:
//
//  1. header: OpenSandbox-Ingress-To: <id>-<port>
//  2. host:   <port>-<id>.<domain> or <id>-<port>.<domain> (only if domain != "")
//  3. path:   /<id>/<port>/<rest>
//
// Each form has a signed variant (see sign.go): <id>-<port>-<exp>-<sig> in
// the header and host label, /<id>/<port>/<exp>/<sig>/<rest> in the path.
// A value that has the signed shape is read as signed only.
//
// A form that is present but malformed is an error; it does not fall
// through to the next one, so a typo never reaches a different sandbox.
func parseRoute(r *http.Request, domain string) (route, error) {
	if vs := r.Header.Values(HeaderIngressTo); len(vs) > 0 {
		if len(vs) > 1 {
			return route{}, errdefs.Invalid(codeInvalidRoute, "more than one "+HeaderIngressTo+" header")
		}
		v := strings.TrimSpace(vs[0])
		if c, tok, ok := parseSignedToken(v); ok {
			return route{mode: modeHeader, cands: []candidate{c}, signed: &tok}, nil
		}
		c, ok := parseIDPort(v)
		if !ok {
			return route{}, errdefs.Invalid(codeInvalidRoute, HeaderIngressTo+" must be <sandbox-id>-<port> with port 1-65535")
		}
		return route{mode: modeHeader, cands: []candidate{c}}, nil
	}
	if rt, ok, err := parseE2BHeaders(r); ok {
		return rt, err
	}
	if label, ok := hostLabel(r.Host, domain); ok {
		var cands []candidate
		if !strings.Contains(label, ".") { // one label only: a.b.<domain> is malformed
			if c, tok, ok := parseSignedToken(label); ok {
				return route{mode: modeHost, cands: []candidate{c}, signed: &tok}, nil
			}
			cands = parseHostLabel(label)
		}
		if len(cands) == 0 {
			return route{}, errdefs.Invalid(codeInvalidRoute, "host must be <port>-<sandbox-id>."+domain+" or <sandbox-id>-<port>."+domain+" with port 1-65535")
		}
		return route{mode: modeHost, cands: cands}, nil
	}
	return parsePath(r.URL)
}

// parseE2BHeaders applies E2B's header rule: on a localhost, IP-literal
// or sandbox.* host, E2b-Sandbox-Id and E2b-Sandbox-Port (both required)
// name the sandbox port; on other hosts they are not the route.
func parseE2BHeaders(r *http.Request) (route, bool, error) {
	id, port := r.Header.Get(HeaderE2BSandboxID), r.Header.Get(HeaderE2BSandboxPort)
	if id == "" && port == "" {
		return route{}, false, nil
	}
	host := r.Host
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	host = strings.TrimSuffix(strings.ToLower(host), ".")
	if host != "localhost" && net.ParseIP(strings.Trim(host, "[]")) == nil && !strings.HasPrefix(host, "sandbox.") {
		return route{}, false, nil
	}
	rt := route{mode: modeE2B, e2b: true}
	n, ok := parsePort(port)
	if id == "" || !ok {
		return rt, true, errdefs.Invalid(codeInvalidRoute, "both "+HeaderE2BSandboxID+" and "+HeaderE2BSandboxPort+" (1-65535) are required")
	}
	for _, c := range id {
		if (c < 'a' || c > 'z') && (c < '0' || c > '9') {
			return rt, true, errdefs.Invalid(codeInvalidRoute, HeaderE2BSandboxID+" must be [a-z0-9]+")
		}
	}
	rt.cands = []candidate{{id, n}}
	return rt, true, nil
}

// errNoRoute is returned by parsePath for a path without a sandbox id.
func errNoRoute() error {
	return errdefs.Invalid(codeInvalidRoute, "no sandbox in the request: use "+HeaderIngressTo+
		": <sandbox-id>-<port>, host <port>-<sandbox-id>.<domain>, or path /<sandbox-id>/<port>/")
}

// parsePath reads /<id>/<port>/<rest>. The upstream path is "/<rest>", with
// the client's escaping kept (so %2F inside a segment stays %2F).
func parsePath(u *url.URL) (route, error) {
	p := strings.TrimPrefix(u.EscapedPath(), "/")
	if p == "" {
		return route{}, errNoRoute()
	}
	rawID, rest, _ := strings.Cut(p, "/")
	rawPort, rest, hasRest := strings.Cut(rest, "/")
	id, err := url.PathUnescape(rawID)
	if err != nil || !validID(id) {
		return route{}, errdefs.Invalid(codeInvalidRoute, "path must be /<sandbox-id>/<port>/...: bad sandbox id")
	}
	port, ok := parsePort(rawPort)
	if !ok {
		return route{}, errdefs.Invalid(codeInvalidRoute, "path must be /<sandbox-id>/<port>/... with port 1-65535")
	}
	rt := route{mode: modePath, cands: []candidate{{id, port}}, rawPath: "/", path: "/"}
	if hasRest {
		// Signed: /<id>/<port>/<expires_b36>/<signature>[/<rest>].
		exp, after, _ := strings.Cut(rest, "/")
		sig, after2, hasRest2 := strings.Cut(after, "/")
		if _, ok := parseExpiresB36(exp); ok && validSignature(sig) {
			rt.signed = &signedToken{expiresB36: exp, signature: sig}
			rest, hasRest = after2, hasRest2
		}
	}
	if hasRest {
		dec, err := url.PathUnescape(rest)
		if err != nil {
			return route{}, errdefs.Invalid(codeInvalidRoute, "path has a bad escape")
		}
		rt.rawPath, rt.path = "/"+rest, "/"+dec
	}
	return rt, nil
}

// hostLabel returns what precedes ".<domain>" in host, or ok=false when
// host is not a subdomain of domain. Matching ignores case, a port, and a
// trailing dot; the label is returned lower-cased, as browsers send it.
func hostLabel(host, domain string) (string, bool) {
	if domain == "" || host == "" {
		return "", false
	}
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	host = strings.TrimSuffix(strings.ToLower(host), ".")
	label, ok := strings.CutSuffix(host, "."+domain)
	if !ok || label == "" {
		return "", false
	}
	return label, true
}

// parseHostLabel reads a host label in either form. Ids may contain '-',
// so both splits are considered:
//
//   - "<port>-<id>": split at the first '-', the prefix must be a port;
//   - "<id>-<port>" (upstream's wildcard form): split at the last '-', the
//     suffix must be a port.
//
// When both parse (e.g. "8080-web-3000"), "<port>-<id>" comes first and the
// other reading is tried only if that sandbox does not exist. moat's ids
// have no '-' and upstream's are UUIDs, whose first and last groups (8 and
// 12 hex digits) never parse as a port, so for them at most one reading
// exists.
func parseHostLabel(label string) []candidate {
	var out []candidate
	if p, id, ok := strings.Cut(label, "-"); ok {
		if port, ok := parsePort(p); ok && validID(id) {
			out = append(out, candidate{id, port})
		}
	}
	if c, ok := parseIDPort(label); ok && (len(out) == 0 || out[0] != c) {
		out = append(out, c)
	}
	return out
}

// parseIDPort reads "<id>-<port>", splitting at the last '-'.
func parseIDPort(s string) (candidate, bool) {
	i := strings.LastIndexByte(s, '-')
	if i < 0 {
		return candidate{}, false
	}
	port, ok := parsePort(s[i+1:])
	if !ok || !validID(s[:i]) {
		return candidate{}, false
	}
	return candidate{s[:i], port}, true
}

// parsePort accepts 1-65535 written as plain decimal digits (no sign, no
// spaces, at most 5 digits).
func parsePort(s string) (int, bool) {
	if s == "" || len(s) > 5 {
		return 0, false
	}
	n := 0
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c < '0' || c > '9' {
			return 0, false
		}
		n = n*10 + int(c-'0')
	}
	if n < 1 || n > 65535 {
		return 0, false
	}
	return n, true
}

// validID accepts ids of letters, digits, '-', '_' and '.', up to 128
// bytes, not starting or ending with '-'. It is a sanity filter (the
// resolver decides what exists), keeping path tricks and control bytes
// away from the resolver and the logs.
func validID(id string) bool {
	if id == "" || len(id) > 128 || id[0] == '-' || id[len(id)-1] == '-' || id == "." || id == ".." {
		return false
	}
	for i := 0; i < len(id); i++ {
		c := id[i]
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9', c == '-', c == '_', c == '.':
		default:
			return false
		}
	}
	return true
}

// stripQueryParam removes every key=value pair named key from a raw query,
// keeping the other pairs byte for byte and in order (url.Values.Encode
// would reorder and re-escape them). It reports the values removed.
func stripQueryParam(raw, key string) (rest string, values []string) {
	if raw == "" || !strings.Contains(raw, key) {
		return raw, nil
	}
	var kept []string
	for pair := range strings.SplitSeq(raw, "&") {
		k, v, _ := strings.Cut(pair, "=")
		if uk, err := url.QueryUnescape(k); err == nil && uk == key {
			uv, err := url.QueryUnescape(v)
			if err != nil {
				uv = v
			}
			values = append(values, uv)
			continue
		}
		kept = append(kept, pair)
	}
	return strings.Join(kept, "&"), values
}

package ingress

import (
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/moat-sandbox/moat/internal/errdefs"
)

// Signed routes (OSEP-0011) let whoever holds an endpoint URL reach one
// sandbox port until a deadline, without the secure-access token. A route
// token is
//
//	<sandbox-id>-<port>-<expires_b36>-<signature>
//
// where expires_b36 is the deadline in Unix seconds in lowercase base 36
// (no leading zeros) and signature is 9 characters: the first 8 lowercase
// hex digits of SHA-256(BE32(len(secret)) || secret || BE32(len(c)) || c)
// followed by the one-character key id of the secret, with the canonical
// string c = "v1\nshort\n<sandbox-id>\n<port>\n<expires_b36>\n". Tokens are
// split from the right, so ids may contain '-'. The same token appears in
// the three route forms: host label "<token>.<domain>", header
// "OpenSandbox-Ingress-To: <token>", and path
// "/<id>/<port>/<expires_b36>/<signature>/<rest>".

// maxExpiresB36 is the longest base-36 uint64.
const maxExpiresB36 = 13

// Signer signs and verifies route tokens with a set of secrets keyed by a
// one-character id ([0-9a-z]); new tokens use the active key, and tokens of
// every configured key verify, so keys can be rotated. It is immutable and
// safe for concurrent use.
type Signer struct {
	keys   map[byte][]byte
	active byte
	now    func() time.Time
}

// NewSigner parses spec, "a=BASE64,b=BASE64" (upstream's
// --secure-access-keys), and returns a signer whose active key is active,
// or the first key listed when active is "".
func NewSigner(spec, active string) (*Signer, error) {
	s := &Signer{keys: map[byte][]byte{}, now: time.Now}
	first := byte(0)
	for seg := range strings.SplitSeq(spec, ",") {
		seg = strings.TrimSpace(seg)
		if seg == "" {
			continue
		}
		id, val, ok := strings.Cut(seg, "=")
		id, val = strings.TrimSpace(id), strings.TrimSpace(val)
		if !ok || len(id) != 1 || !isB36Digit(id[0]) || val == "" {
			return nil, fmt.Errorf("secure-access key %q: want <id>=<base64 secret> with a one-character id [0-9a-z]: %w",
				redactKey(seg), errdefs.ErrInvalidArgument)
		}
		secret, err := base64.StdEncoding.DecodeString(val)
		if err != nil || len(secret) == 0 {
			return nil, fmt.Errorf("secure-access key %q: the secret is not non-empty standard base64: %w", id, errdefs.ErrInvalidArgument)
		}
		if _, dup := s.keys[id[0]]; dup {
			return nil, fmt.Errorf("secure-access key %q listed twice: %w", id, errdefs.ErrInvalidArgument)
		}
		s.keys[id[0]] = secret
		if first == 0 {
			first = id[0]
		}
	}
	if len(s.keys) == 0 {
		return nil, fmt.Errorf("secure-access keys: none given: %w", errdefs.ErrInvalidArgument)
	}
	s.active = first
	if active != "" {
		if len(active) != 1 || s.keys[active[0]] == nil {
			return nil, fmt.Errorf("secure-access active key %q is not among the keys: %w", active, errdefs.ErrInvalidArgument)
		}
		s.active = active[0]
	}
	return s, nil
}

// redactKey keeps the key id of a malformed key segment for the error
// message, never the secret.
func redactKey(seg string) string {
	id, _, _ := strings.Cut(seg, "=")
	if len(id) > 8 {
		id = id[:8] + "..."
	}
	return id + "=..."
}

// Sign returns the expires_b36 and signature segments of a route token for
// port of sandbox id, valid until expires (Unix seconds).
func (s *Signer) Sign(id string, port int, expires uint64) (expiresB36, signature string) {
	expiresB36 = strconv.FormatUint(expires, 36)
	return expiresB36, hex8(s.keys[s.active], id, port, expiresB36) + string(s.active)
}

// Verify checks a route token's signature segments against id and port
// and that its deadline has not passed. Errors are ErrUnauthenticated with
// a public message.
func (s *Signer) Verify(id string, port int, expiresB36, signature string) error {
	fail := func(why string) error {
		return errdefs.WithPublic(fmt.Errorf("signed route %s-%d: %s: %w", id, port, why, errdefs.ErrUnauthenticated),
			codeUnauthorized, "invalid or expired signed route")
	}
	exp, ok := parseExpiresB36(expiresB36)
	if !ok || !validSignature(signature) {
		return fail("malformed")
	}
	secret := s.keys[signature[8]]
	if secret == nil {
		return fail("unknown key id")
	}
	want := hex8(secret, id, port, expiresB36)
	if subtle.ConstantTimeCompare([]byte(want), []byte(signature[:8])) != 1 {
		return fail("signature mismatch")
	}
	if now := s.now().Unix(); now < 0 || uint64(now) > exp {
		return fail("expired")
	}
	return nil
}

// hex8 is the first 8 hex digits of the OSEP-0011 digest.
func hex8(secret []byte, id string, port int, expiresB36 string) string {
	canonical := "v1\nshort\n" + id + "\n" + strconv.Itoa(port) + "\n" + expiresB36 + "\n"
	buf := make([]byte, 0, 8+len(secret)+len(canonical))
	buf = binary.BigEndian.AppendUint32(buf, uint32(len(secret)))
	buf = append(buf, secret...)
	buf = binary.BigEndian.AppendUint32(buf, uint32(len(canonical)))
	buf = append(buf, canonical...)
	sum := sha256.Sum256(buf)
	return hex.EncodeToString(sum[:4])
}

func isB36Digit(c byte) bool { return c >= '0' && c <= '9' || c >= 'a' && c <= 'z' }

// parseExpiresB36 reads a canonical expires_b36: lowercase base 36, no
// leading zeros, at most 13 digits, within uint64.
func parseExpiresB36(s string) (uint64, bool) {
	if s == "" || len(s) > maxExpiresB36 || len(s) > 1 && s[0] == '0' {
		return 0, false
	}
	for i := 0; i < len(s); i++ {
		if !isB36Digit(s[i]) {
			return 0, false
		}
	}
	v, err := strconv.ParseUint(s, 36, 64)
	return v, err == nil
}

// validSignature checks the 9-character form: 8 lowercase hex digits and a
// key id.
func validSignature(s string) bool {
	if len(s) != 9 || !isB36Digit(s[8]) {
		return false
	}
	for i := 0; i < 8; i++ {
		if c := s[i]; !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return false
		}
	}
	return true
}

// signedToken is the signature part of a parsed route.
type signedToken struct {
	expiresB36, signature string
}

// parseSignedToken reads "<id>-<port>-<expires_b36>-<signature>" (split
// from the right); ok is false when s does not have that shape.
func parseSignedToken(s string) (candidate, signedToken, bool) {
	i := strings.LastIndexByte(s, '-')
	if i < 0 || !validSignature(s[i+1:]) {
		return candidate{}, signedToken{}, false
	}
	sig, rest := s[i+1:], s[:i]
	j := strings.LastIndexByte(rest, '-')
	if j < 0 {
		return candidate{}, signedToken{}, false
	}
	if _, ok := parseExpiresB36(rest[j+1:]); !ok {
		return candidate{}, signedToken{}, false
	}
	c, ok := parseIDPort(rest[:j])
	if !ok {
		return candidate{}, signedToken{}, false
	}
	return c, signedToken{expiresB36: rest[j+1:], signature: sig}, true
}

// Route modes of endpoint addresses (upstream's ingress.gateway.route.mode).
const (
	RouteWildcard = "wildcard" // <id>-<port>.<base>
	RouteURI      = "uri"      // <address>/<id>/<port>
	RouteHeader   = "header"   // <address> + OpenSandbox-Ingress-To: <id>-<port>
)

// Endpoints formats the addresses the lifecycle API hands out for sandbox
// ports behind the gateway, in upstream's shapes:
//
//	mode      unsigned                      signed (OSEP-0011)
//	wildcard  <id>-<port>.<base>            <id>-<port>-<exp>-<sig>.<base>
//	uri       <address>/<id>/<port>         <address>/<id>/<port>/<exp>/<sig>
//	header    <address> + OpenSandbox-Ingress-To: <id>-<port>[-<exp>-<sig>]
//
// where base is Address without a leading "*.".
type Endpoints struct {
	// Mode is RouteWildcard, RouteURI or RouteHeader.
	Mode string
	// Address is the gateway as clients reach it, host[:port]; for
	// wildcard it is the base domain (optionally "*."-prefixed, with the
	// gateway port if not the scheme default). Empty means the host the
	// API request was sent to, with Port.
	Address string
	// Port is the gateway port used with the request host when Address is
	// empty.
	Port string
	// Signer signs routes; nil means signed endpoints are unsupported.
	Signer *Signer
	// Prefix is the path the gateway is mounted under on Address (uri
	// mode), e.g. "/ingress"; empty for a gateway of its own.
	Prefix string
}

// ValidateMode reports an unknown route mode.
func ValidateMode(mode string) error {
	switch mode {
	case RouteWildcard, RouteURI, RouteHeader:
		return nil
	}
	return fmt.Errorf("ingress route mode %q: want wildcard, uri or header: %w", mode, errdefs.ErrInvalidArgument)
}

// Endpoint returns the endpoint (without scheme) and the headers to send
// for port of sandbox id; reqHost is the Host of the API request, used
// when Address is empty. With signed, the route carries a token valid
// until expires; e.Signer must be set.
func (e Endpoints) Endpoint(reqHost, id string, port int, signed bool, expires uint64) (string, map[string]string) {
	switch {
	case e.Address != "":
	case e.Port == "": // the gateway is on the API listener
		e.Address = reqHost
	default:
		h := reqHost
		if hh, _, err := net.SplitHostPort(reqHost); err == nil {
			h = hh
		}
		e.Address = net.JoinHostPort(h, e.Port)
	}
	token := id + "-" + strconv.Itoa(port)
	var exp, sig string
	if signed {
		exp, sig = e.Signer.Sign(id, port, expires)
	}
	switch e.Mode {
	case RouteWildcard:
		base := strings.TrimPrefix(e.Address, "*.")
		if signed {
			return token + "-" + exp + "-" + sig + "." + base, nil
		}
		return token + "." + base, nil
	case RouteHeader:
		if signed {
			token += "-" + exp + "-" + sig
		}
		return e.Address, map[string]string{HeaderIngressTo: token}
	default: // RouteURI
		ep := e.Address + e.Prefix + "/" + id + "/" + strconv.Itoa(port)
		if signed {
			ep += "/" + exp + "/" + sig
		}
		return ep, nil
	}
}

// Package policy is the egress rule model shared by the DNS proxy and the
// nftables enforcer: an OpenSandbox-compatible NetworkPolicy, its validation,
// the PATCH/DELETE edits of the egress API, and a compiled Matcher.
//
// Semantics (OpenSandbox components/egress pkg/policy):
//   - a target is parsed as an IP first, then a CIDR, otherwise a domain;
//     domains are lowercased and lose a trailing dot;
//   - "*.example.com" matches every subdomain of example.com but not
//     example.com itself;
//   - the first matching rule by index wins, else DefaultAction applies.
//
// The package is pure: no I/O, no global state.
package policy

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"strings"

	"github.com/moat-sandbox/moat/internal/errdefs"
)

// Action is the verdict of a rule or of the default.
type Action string

// Actions. An empty action in input means Deny (OpenSandbox default).
const (
	Allow Action = "allow"
	Deny  Action = "deny"
)

// MaxRules caps the number of egress rules in one policy (OpenSandbox
// OPENSANDBOX_EGRESS_MAX_RULES default). Every rule can become nftables set
// elements and a map entry, so the cap bounds kernel and proxy memory.
const MaxRules = 4096

// ErrCode is the public error code of validation errors. Policies arrive
// through the lifecycle API, whose parameter errors use this code.
const ErrCode = "SANDBOX::INVALID_PARAMETER"

// NetworkPolicy is the egress policy of one sandbox. The JSON shape is the
// OpenSandbox networkPolicy / egress sidecar /policy body.
type NetworkPolicy struct {
	// DefaultAction applies when no rule matches. Empty means Deny.
	DefaultAction Action `json:"defaultAction"`
	// Egress rules, evaluated in order; the first match wins.
	Egress []Rule `json:"egress"`
}

// Rule is one egress rule.
type Rule struct {
	// Action is Allow or Deny; empty means Deny.
	Action Action `json:"action"`
	// Target is an IP ("10.0.0.1", "::1"), a CIDR ("10.0.0.0/8"), a domain
	// ("example.com") or a wildcard domain ("*.example.com").
	Target string `json:"target"`
}

// Kind is what a rule target denotes.
type Kind int

// Target kinds.
const (
	KindDomain Kind = iota + 1
	KindWildcard
	KindIP
	KindCIDR
)

// String returns the kind's name.
func (k Kind) String() string {
	switch k {
	case KindDomain:
		return "domain"
	case KindWildcard:
		return "wildcard"
	case KindIP:
		return "ip"
	case KindCIDR:
		return "cidr"
	default:
		return fmt.Sprintf("Kind(%d)", int(k))
	}
}

// Mode values reported by the egress API (PolicyStatusResponse.mode).
const (
	ModeAllowAll  = "allow_all"
	ModeDenyAll   = "deny_all"
	ModeEnforcing = "enforcing"
)

// DenyAll returns the policy that denies all egress: what an empty,
// "{}" or "null" policy body means (OpenSandbox sidecar behaviour).
func DenyAll() NetworkPolicy {
	return NetworkPolicy{DefaultAction: Deny, Egress: []Rule{}}
}

// AllowAll returns the policy that allows all egress.
func AllowAll() NetworkPolicy {
	return NetworkPolicy{DefaultAction: Allow, Egress: []Rule{}}
}

// Mode reports allow_all, deny_all or enforcing for a normalized policy.
func (p NetworkPolicy) Mode() string {
	switch {
	case len(p.Egress) > 0:
		return ModeEnforcing
	case p.DefaultAction == Allow:
		return ModeAllowAll
	default:
		return ModeDenyAll
	}
}

// Clone returns a deep copy of p.
func (p NetworkPolicy) Clone() NetworkPolicy {
	return NetworkPolicy{DefaultAction: p.DefaultAction, Egress: append([]Rule{}, p.Egress...)}
}

// Parse decodes and normalizes a policy body. An empty body, "{}" or "null"
// is DenyAll. The result is normalized (see Normalize).
func Parse(data []byte) (NetworkPolicy, error) {
	trimmed := strings.TrimSpace(string(data))
	if trimmed == "" || trimmed == "null" || trimmed == "{}" {
		return DenyAll(), nil
	}
	var p NetworkPolicy
	if err := json.Unmarshal([]byte(trimmed), &p); err != nil {
		return NetworkPolicy{}, errdefs.Invalid(ErrCode, "malformed policy JSON: "+jsonProblem(err))
	}
	return Normalize(p)
}

// ParseRules decodes a PATCH body: a JSON array of at least one rule.
func ParseRules(data []byte) ([]Rule, error) {
	var rules []Rule
	if err := json.Unmarshal(data, &rules); err != nil {
		return nil, errdefs.Invalid(ErrCode, "malformed rule list JSON: "+jsonProblem(err))
	}
	if len(rules) == 0 {
		return nil, errdefs.Invalid(ErrCode, "rule list must contain at least one rule")
	}
	out := make([]Rule, len(rules))
	for i, r := range rules {
		n, _, err := normalizeRule(r)
		if err != nil {
			return nil, at(fmt.Sprintf("[%d]", i), err)
		}
		out[i] = n
	}
	return out, nil
}

// ParseTargets decodes a DELETE body: a JSON array of at least one target.
func ParseTargets(data []byte) ([]string, error) {
	var targets []string
	if err := json.Unmarshal(data, &targets); err != nil {
		return nil, errdefs.Invalid(ErrCode, "malformed target list JSON: "+jsonProblem(err))
	}
	if len(targets) == 0 {
		return nil, errdefs.Invalid(ErrCode, "target list must contain at least one target")
	}
	return targets, nil
}

// jsonProblem describes a JSON decoding error in client terms (offsets
// and field names, not Go type names).
func jsonProblem(err error) string {
	var syn *json.SyntaxError
	var typ *json.UnmarshalTypeError
	switch {
	case errors.As(err, &syn):
		return fmt.Sprintf("syntax error at offset %d", syn.Offset)
	case errors.As(err, &typ):
		if typ.Field == "" {
			return fmt.Sprintf("unexpected JSON %s", typ.Value)
		}
		return fmt.Sprintf("field %q: unexpected JSON %s", typ.Field, typ.Value)
	default:
		return "invalid JSON"
	}
}

// Normalize validates p and returns its canonical form: actions lowercased
// with empty meaning Deny, targets canonical (domains lowercased without a
// trailing dot, IPs and CIDRs in netip string form), Egress never nil.
// Errors are errdefs.Invalid with a message naming the offending rule.
func Normalize(p NetworkPolicy) (NetworkPolicy, error) {
	def, err := normalizeAction(p.DefaultAction)
	if err != nil {
		return NetworkPolicy{}, errdefs.Invalid(ErrCode, "defaultAction: "+err.Error())
	}
	if len(p.Egress) > MaxRules {
		return NetworkPolicy{}, errdefs.Invalid(ErrCode,
			fmt.Sprintf("too many egress rules: %d (max %d)", len(p.Egress), MaxRules))
	}
	out := NetworkPolicy{DefaultAction: def, Egress: make([]Rule, len(p.Egress))}
	for i, r := range p.Egress {
		n, _, err := normalizeRule(r)
		if err != nil {
			return NetworkPolicy{}, at(fmt.Sprintf("egress[%d]", i), err)
		}
		out.Egress[i] = n
	}
	return out, nil
}

// at prefixes the public message of a validation error with the position
// of the offending element, keeping it a single errdefs.Invalid.
func at(where string, err error) error {
	if p, ok := errdefs.PublicOf(err); ok {
		return errdefs.Invalid(p.Code, where+": "+p.Message)
	}
	return fmt.Errorf("%s: %w", where, err)
}

func normalizeAction(a Action) (Action, error) {
	switch Action(strings.ToLower(strings.TrimSpace(string(a)))) {
	case "", Deny:
		return Deny, nil
	case Allow:
		return Allow, nil
	default:
		return "", fmt.Errorf("unsupported action %q (want %q or %q)", string(a), Allow, Deny)
	}
}

// normalizeRule returns the canonical rule and its target kind. Errors are
// errdefs.Invalid; callers prefix them with the rule's position.
func normalizeRule(r Rule) (Rule, Kind, error) {
	act, err := normalizeAction(r.Action)
	if err != nil {
		return Rule{}, 0, errdefs.Invalid(ErrCode, "action: "+err.Error())
	}
	target, kind, err := NormalizeTarget(r.Target)
	if err != nil {
		return Rule{}, 0, err
	}
	return Rule{Action: act, Target: target}, kind, nil
}

// NormalizeTarget returns the canonical form of a rule target and its kind.
func NormalizeTarget(target string) (string, Kind, error) {
	t := strings.TrimSpace(target)
	if t == "" {
		return "", 0, errdefs.Invalid(ErrCode, "target: must not be empty")
	}
	if ip, err := netip.ParseAddr(t); err == nil {
		if ip.Zone() != "" {
			return "", 0, errdefs.Invalid(ErrCode, fmt.Sprintf("target %q: IPv6 zones are not supported", t))
		}
		return ip.String(), KindIP, nil
	}
	if pfx, err := netip.ParsePrefix(t); err == nil {
		return pfx.String(), KindCIDR, nil
	}
	if strings.Contains(t, "/") {
		return "", 0, errdefs.Invalid(ErrCode, fmt.Sprintf("target %q: invalid CIDR", t))
	}
	d := NormalizeName(t)
	if rest, ok := strings.CutPrefix(d, "*."); ok {
		if strings.Contains(rest, "*") {
			return "", 0, errdefs.Invalid(ErrCode, fmt.Sprintf(
				"target %q: a wildcard must be a single leading \"*.\" label", t))
		}
		if err := checkDomain(rest); err != nil {
			return "", 0, errdefs.Invalid(ErrCode, fmt.Sprintf("target %q: %v", t, err))
		}
		return d, KindWildcard, nil
	}
	if d == "*" {
		return "", 0, errdefs.Invalid(ErrCode, fmt.Sprintf(
			"target %q: a bare wildcard is not a target; use defaultAction", t))
	}
	if strings.Contains(d, "*") {
		return "", 0, errdefs.Invalid(ErrCode, fmt.Sprintf(
			"target %q: a wildcard must be a single leading \"*.\" label", t))
	}
	if err := checkDomain(d); err != nil {
		return "", 0, errdefs.Invalid(ErrCode, fmt.Sprintf("target %q: %v", t, err))
	}
	return d, KindDomain, nil
}

// NormalizeName lowercases a DNS name and removes one trailing dot.
func NormalizeName(name string) string {
	return strings.TrimSuffix(strings.ToLower(name), ".")
}

// checkDomain accepts LDH names (plus '_', used by service labels) with
// labels of 1-63 bytes and at most 253 bytes in total.
func checkDomain(d string) error {
	if d == "" {
		return fmt.Errorf("empty domain")
	}
	if len(d) > 253 {
		return fmt.Errorf("domain longer than 253 characters")
	}
	for label := range strings.SplitSeq(d, ".") {
		if label == "" {
			return fmt.Errorf("empty label")
		}
		if len(label) > 63 {
			return fmt.Errorf("label longer than 63 characters")
		}
		for i := 0; i < len(label); i++ {
			c := label[i]
			if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
				return fmt.Errorf("invalid character %q", c)
			}
		}
	}
	return nil
}

// Patch implements PATCH /policy: rules are merged in ahead of p's rules,
// and for a target that occurs more than once the first occurrence wins
// (so a patched target replaces the existing rule for it). The result is
// validated, including the rule cap.
func Patch(p NetworkPolicy, rules []Rule) (NetworkPolicy, error) {
	if len(rules) == 0 {
		return NetworkPolicy{}, errdefs.Invalid(ErrCode, "rule list must contain at least one rule")
	}
	merged := make([]Rule, 0, len(rules)+len(p.Egress))
	seen := make(map[string]bool, len(rules)+len(p.Egress))
	for i, r := range append(append([]Rule{}, rules...), p.Egress...) {
		n, _, err := normalizeRule(r)
		if err != nil {
			return NetworkPolicy{}, at(fmt.Sprintf("rule %d", i), err)
		}
		if seen[n.Target] {
			continue
		}
		seen[n.Target] = true
		merged = append(merged, n)
	}
	return Normalize(NetworkPolicy{DefaultAction: p.DefaultAction, Egress: merged})
}

// RemoveTargets implements DELETE /policy: every rule whose target equals
// one of targets (after normalization) is removed; unknown targets are
// ignored.
func RemoveTargets(p NetworkPolicy, targets []string) (NetworkPolicy, error) {
	if len(targets) == 0 {
		return NetworkPolicy{}, errdefs.Invalid(ErrCode, "target list must contain at least one target")
	}
	drop := make(map[string]bool, len(targets))
	for i, t := range targets {
		n, _, err := NormalizeTarget(t)
		if err != nil {
			return NetworkPolicy{}, at(fmt.Sprintf("target %d", i), err)
		}
		drop[n] = true
	}
	out := NetworkPolicy{DefaultAction: p.DefaultAction, Egress: make([]Rule, 0, len(p.Egress))}
	for _, r := range p.Egress {
		n, _, err := NormalizeTarget(r.Target)
		if err == nil && drop[n] {
			continue
		}
		out.Egress = append(out.Egress, r)
	}
	return Normalize(out)
}

// Package vault is the Credential Vault of one sandbox (OSEP-0012), pure
// logic: write-only credentials, bindings that say which outbound requests
// get which credential injected, revisions, sanitized views, the Rules the
// egress proxy (mitm) applies, and sealing for storage (see Sealer). Values
// live in Secret, which never prints or marshals: Secret.Reveal is called
// only to put a value on the wire (Rules) and to seal.
package vault

import (
	"encoding/json"
	"fmt"
	"io"
	"log/slog"

	"github.com/moat-sandbox/moat/internal/errdefs"
)

// Limits of one vault. They bound memory and the work per request; the
// API body itself is capped at 1 MiB.
const (
	// MaxCredentials is the number of credentials a vault may hold.
	MaxCredentials = 64
	// MaxBindings is the number of bindings a vault may hold.
	MaxBindings = 64
	// MaxValueBytes is the largest credential value (8 KiB).
	MaxValueBytes = 8 << 10
	// MaxNameBytes bounds credential, binding, header and parameter names.
	MaxNameBytes = 128
	// MaxPatterns bounds the hosts, paths and methods of one binding.
	MaxPatterns = 32
	// MaxHeaders bounds the entries of one customHeaders auth.
	MaxHeaders = 16
	// MaxSubstitutions bounds the substitutions of one binding.
	MaxSubstitutions = 16
	// MaxPlaceholderBytes bounds one substitution placeholder.
	MaxPlaceholderBytes = 256
	// MaxSubstitutionBody is the largest request body that body
	// substitutions rewrite; a larger body passes through unchanged (as
	// upstream, which streams bodies above 1 MiB).
	MaxSubstitutionBody = 1 << 20
	// maxPathPattern bounds one path pattern.
	maxPathPattern = 1024
)

// Public error codes of the Credential Vault API.
const (
	CodeInvalid    = "CREDENTIAL_VAULT::INVALID_REQUEST"
	CodeNotFound   = "CREDENTIAL_VAULT::NOT_FOUND"
	CodeExists     = "CREDENTIAL_VAULT::ALREADY_EXISTS"
	CodeConflict   = "CREDENTIAL_VAULT::REVISION_CONFLICT"
	CodeNotEnabled = "CREDENTIAL_VAULT::NOT_ENABLED"
)

// Errors returned by State operations and the services built on them.
var (
	// ErrNotFound: the sandbox has no vault (or the named item does not exist).
	ErrNotFound = errdefs.WithPublic(errdefs.ErrNotFound, CodeNotFound, "credential vault not found")
	// ErrExists: POST /credential-vault on a sandbox that has one.
	ErrExists = errdefs.WithPublic(errdefs.ErrAlreadyExists, CodeExists, "credential vault already exists")
	// ErrNotEnabled: the sandbox was created without credentialProxy.
	ErrNotEnabled = errdefs.WithPublic(errdefs.ErrFailedPrecondition, CodeNotEnabled,
		"the sandbox was created without credentialProxy: {enabled: true}; the Credential Vault needs it")
)

func invalid(format string, args ...any) error {
	return errdefs.Invalid(CodeInvalid, fmt.Sprintf(format, args...))
}

func notFound(kind, name string) error {
	return errdefs.WithPublic(errdefs.ErrNotFound, CodeNotFound, fmt.Sprintf("%s %q not found", kind, name))
}

// redacted is what a Secret shows instead of its value.
const redacted = "[REDACTED]"

// Secret is a credential value. Its zero value is empty. It formats,
// logs and marshals as "[REDACTED]" in every verb and encoder; Reveal is
// the only accessor.
type Secret struct{ v string }

// NewSecret wraps v.
func NewSecret(v string) Secret { return Secret{v: v} }

// Reveal returns the value. Call it only to put the value on the wire to
// the upstream server or into sealed storage.
func (s Secret) Reveal() string { return s.v }

// Empty reports whether the value is empty.
func (s Secret) Empty() bool { return s.v == "" }

// String implements fmt.Stringer.
func (Secret) String() string { return redacted }

// GoString implements fmt.GoStringer (%#v).
func (Secret) GoString() string { return redacted }

// Format implements fmt.Formatter, so %x, %q and the rest are redacted too.
func (Secret) Format(f fmt.State, _ rune) { _, _ = io.WriteString(f, redacted) }

// LogValue implements slog.LogValuer.
func (Secret) LogValue() slog.Value { return slog.StringValue(redacted) }

// MarshalJSON implements json.Marshaler: never the value.
func (Secret) MarshalJSON() ([]byte, error) { return []byte(`"` + redacted + `"`), nil }

// UnmarshalJSON reads a JSON string. Its errors never quote the input.
func (s *Secret) UnmarshalJSON(b []byte) error {
	var v string
	if err := json.Unmarshal(b, &v); err != nil {
		return fmt.Errorf("a credential value must be a JSON string")
	}
	s.v = v
	return nil
}

// Credential is one named credential of a create or PATCH body.
type Credential struct {
	Name   string `json:"name"`
	Source Source `json:"source"`
}

// Source is where a credential's value comes from; the only type is
// "inline" (the value is in the request, write-only).
type Source struct {
	Type  string `json:"type"`
	Value Secret `json:"value"`
}

// Binding says which requests get which credential.
type Binding struct {
	Name  string `json:"name"`
	Match Match  `json:"match"`
	Auth  Auth   `json:"auth"`
}

// Match selects requests. Hosts is required; the rest default to
// schemes [https], the scheme's port (443 or 80), methods
// [GET,POST,PUT,PATCH,DELETE] and paths ["/*"]. A host is a DNS name or
// "*.suffix" (subdomains only, not the apex); a path pattern starts with
// "/" and "*" matches any run of characters, "/" included.
//
// TrustedCIDRs (moat) opts the binding out of the resolved-address rule
// for those destinations: a credential normally goes only to an address
// moat's DNS resolved for the host, so that a sandbox cannot send a bound
// Host header to an address of its choosing; a request to an address in
// one of these prefixes (reached with curl --resolve or /etc/hosts, say)
// gets it too.
type Match struct {
	Schemes      []string `json:"schemes,omitempty"`
	Ports        []int    `json:"ports,omitempty"`
	Hosts        []string `json:"hosts"`
	Methods      []string `json:"methods,omitempty"`
	Paths        []string `json:"paths,omitempty"`
	TrustedCIDRs []string `json:"trustedCidrs,omitempty"`
}

// Auth types.
const (
	AuthBearer        = "bearer"
	AuthBasic         = "basic"
	AuthAPIKey        = "apiKey"
	AuthCustomHeaders = "customHeaders"
	// AuthPassthrough injects nothing by itself: the binding's
	// substitutions (if any) are all it does.
	AuthPassthrough = "passthrough"
)

// Substitution surfaces: where a placeholder is looked for.
const (
	InPath   = "path"
	InQuery  = "query"
	InHeader = "header"
	InBody   = "body"
)

// Auth is how a binding injects its credential(s). Credential and the
// header entries name credentials of the vault, never values.
type Auth struct {
	Type string `json:"type"`
	// Credential names the credential (bearer, basic, apiKey).
	Credential string `json:"credential,omitempty"`
	// Name is the header (or, with In "query", the query parameter) of
	// an apiKey auth.
	Name string `json:"name,omitempty"`
	// In is where an apiKey goes: "header" (default) or "query" (a moat
	// extension; upstream sends API keys in headers only).
	In string `json:"in,omitempty"`
	// Headers are the entries of a customHeaders auth.
	Headers []HeaderRef `json:"headers,omitempty"`
	// Substitutions replace placeholders the sandbox put in a matching
	// request with credential values (any auth type; the only effect of
	// passthrough).
	Substitutions []Substitution `json:"substitutions,omitempty"`
}

// Substitution replaces every occurrence of Placeholder in the request
// surfaces In (path, query, header, body) with the value of Credential,
// encoded for the surface: percent-encoded in the path and query, JSON
// string-escaped in a JSON body, form-encoded in a form body, as is in
// headers and other bodies.
type Substitution struct {
	Credential  string   `json:"credential"`
	Placeholder string   `json:"placeholder"`
	In          []string `json:"in"`
}

// HeaderRef is one customHeaders entry: a header set to a credential.
type HeaderRef struct {
	Name       string `json:"name"`
	Credential string `json:"credential"`
}

// CreateRequest is the body of POST /credential-vault.
type CreateRequest struct {
	Credentials []Credential `json:"credentials"`
	Bindings    []Binding    `json:"bindings"`
}

// PatchRequest is the body of PATCH /credential-vault. Within each set,
// deletes apply first, then replaces, then adds; one name may appear in
// one operation only.
type PatchRequest struct {
	ExpectedRevision *int64         `json:"expectedRevision,omitempty"`
	Credentials      *CredentialOps `json:"credentials,omitempty"`
	Bindings         *BindingOps    `json:"bindings,omitempty"`
}

// CredentialOps edits credentials.
type CredentialOps struct {
	Add     []Credential `json:"add,omitempty"`
	Replace []Credential `json:"replace,omitempty"`
	Delete  []string     `json:"delete,omitempty"`
}

// BindingOps edits bindings.
type BindingOps struct {
	Add     []Binding `json:"add,omitempty"`
	Replace []Binding `json:"replace,omitempty"`
	Delete  []string  `json:"delete,omitempty"`
}

// View is the sanitized state (CredentialVaultState on the wire).
type View struct {
	Revision    int64            `json:"revision"`
	Credentials []CredentialMeta `json:"credentials"`
	Bindings    []BindingMeta    `json:"bindings"`
}

// CredentialMeta is what the API shows of a credential.
type CredentialMeta struct {
	Name       string `json:"name"`
	SourceType string `json:"sourceType"`
	Revision   int64  `json:"revision"`
}

// BindingMeta is what the API shows of a binding: its match and the auth
// type (plus the apiKey header or parameter name), not which credential
// it uses.
type BindingMeta struct {
	Name     string   `json:"name"`
	Revision int64    `json:"revision"`
	Match    Match    `json:"match"`
	Auth     AuthMeta `json:"auth"`
}

// AuthMeta is the sanitized auth of a binding.
type AuthMeta struct {
	Type string `json:"type"`
	Name string `json:"name,omitempty"`
	In   string `json:"in,omitempty"`
}

// CredentialList is the body of GET /credential-vault/credentials.
type CredentialList struct {
	Revision    int64            `json:"revision"`
	Credentials []CredentialMeta `json:"credentials"`
}

// BindingList is the body of GET /credential-vault/bindings.
type BindingList struct {
	Revision int64         `json:"revision"`
	Bindings []BindingMeta `json:"bindings"`
}

// DecodeCreate parses a POST body strictly (unknown fields are errors, as
// upstream). Both lists must be present; null is the empty list, as
// upstream's server takes it (the Go SDK sends null for an empty vault).
// Errors never quote credential values.
func DecodeCreate(body []byte) (CreateRequest, error) {
	var req CreateRequest
	if err := decodeStrict(body, &req); err != nil {
		return CreateRequest{}, err
	}
	// A json.RawMessage field is set even by a JSON null, so it tells an
	// absent list from a null one.
	var present struct {
		Credentials json.RawMessage `json:"credentials"`
		Bindings    json.RawMessage `json:"bindings"`
	}
	if err := json.Unmarshal(body, &present); err != nil || present.Credentials == nil || present.Bindings == nil {
		return CreateRequest{}, invalid("credentials and bindings are required (use [] or null for none)")
	}
	if req.Credentials == nil {
		req.Credentials = []Credential{}
	}
	if req.Bindings == nil {
		req.Bindings = []Binding{}
	}
	return req, nil
}

// DecodePatch parses a PATCH body strictly.
func DecodePatch(body []byte) (PatchRequest, error) {
	var req PatchRequest
	if err := decodeStrict(body, &req); err != nil {
		return PatchRequest{}, err
	}
	return req, nil
}

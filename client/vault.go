package client

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
)

// CredentialProxy is CreateRequest.CredentialProxy.
type CredentialProxy struct {
	Enabled bool `json:"enabled"`
}

// Credential is a named credential. Its value is write-only: the server
// never returns it.
type Credential struct {
	Name   string           `json:"name"`
	Source CredentialSource `json:"source"`
}

// CredentialSource holds the value; Type is "inline" (the default).
type CredentialSource struct {
	Type  string `json:"type,omitempty"`
	Value string `json:"value"`
}

// InlineCredential returns a credential with an inline value.
func InlineCredential(name, value string) Credential {
	return Credential{Name: name, Source: CredentialSource{Type: "inline", Value: value}}
}

// CredentialBinding says which requests get which credential.
type CredentialBinding struct {
	Name  string          `json:"name"`
	Match CredentialMatch `json:"match"`
	Auth  CredentialAuth  `json:"auth"`
}

// CredentialMatch selects requests: Hosts (DNS names or "*.suffix") is
// required; Schemes default to https, Ports to the schemes' ports,
// Methods to GET/POST/PUT/PATCH/DELETE and Paths to "/*".
type CredentialMatch struct {
	Schemes []string `json:"schemes,omitempty"`
	Ports   []int    `json:"ports,omitempty"`
	Hosts   []string `json:"hosts"`
	Methods []string `json:"methods,omitempty"`
	Paths   []string `json:"paths,omitempty"`
}

// CredentialAuth is how a binding injects: Type "bearer" or "basic" with
// Credential; "apiKey" with Name and Credential (In "query" sends it as a
// query parameter, a moat extension); "customHeaders" with Headers;
// "passthrough", which injects nothing itself. Any type may add
// Substitutions. Credential fields name credentials of the vault.
type CredentialAuth struct {
	Type          string         `json:"type"`
	Credential    string         `json:"credential,omitempty"`
	Name          string         `json:"name,omitempty"`
	In            string         `json:"in,omitempty"`
	Headers       []CustomHeader `json:"headers,omitempty"`
	Substitutions []Substitution `json:"substitutions,omitempty"`
}

// Substitution replaces Placeholder, wherever the sandbox puts it in the
// request surfaces In ("path", "query", "header", "body"), with the value
// of Credential on the way out.
type Substitution struct {
	Credential  string   `json:"credential"`
	Placeholder string   `json:"placeholder"`
	In          []string `json:"in"`
}

// CustomHeader is one customHeaders entry.
type CustomHeader struct {
	Name       string `json:"name"`
	Credential string `json:"credential"`
}

// CredentialVaultCreate is the body of CreateCredentialVault.
type CredentialVaultCreate struct {
	Credentials []Credential        `json:"credentials"`
	Bindings    []CredentialBinding `json:"bindings"`
}

// CredentialVaultPatch edits a vault atomically: within each set deletes
// apply first, then replaces, then adds. ExpectedRevision, if set, makes
// the call fail with a conflict when the vault has moved on.
type CredentialVaultPatch struct {
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
	Add     []CredentialBinding `json:"add,omitempty"`
	Replace []CredentialBinding `json:"replace,omitempty"`
	Delete  []string            `json:"delete,omitempty"`
}

// CredentialVaultState is the sanitized vault.
type CredentialVaultState struct {
	Revision    int64                `json:"revision"`
	Credentials []CredentialMetadata `json:"credentials"`
	Bindings    []BindingMetadata    `json:"bindings"`
}

// CredentialMetadata is what the server shows of a credential.
type CredentialMetadata struct {
	Name       string `json:"name"`
	SourceType string `json:"sourceType"`
	Revision   int64  `json:"revision"`
}

// BindingMetadata is what the server shows of a binding (not which
// credential it uses).
type BindingMetadata struct {
	Name     string          `json:"name"`
	Revision int64           `json:"revision"`
	Match    CredentialMatch `json:"match"`
	Auth     struct {
		Type string `json:"type"`
		Name string `json:"name,omitempty"`
		In   string `json:"in,omitempty"`
	} `json:"auth"`
}

type credentialList struct {
	Revision    int64                `json:"revision"`
	Credentials []CredentialMetadata `json:"credentials"`
}

type bindingList struct {
	Revision int64             `json:"revision"`
	Bindings []BindingMetadata `json:"bindings"`
}

func (s *SandboxHandle) vault(ctx context.Context, c *call, in, out any) error {
	t, err := s.egressTransport(ctx)
	if err != nil {
		return err
	}
	return t.json(ctx, c, in, out)
}

// CreateCredentialVault creates the sandbox's vault (revision 1). The
// sandbox must have been created with CredentialProxy enabled.
func (s *SandboxHandle) CreateCredentialVault(ctx context.Context, req CredentialVaultCreate) (*CredentialVaultState, error) {
	if req.Credentials == nil {
		req.Credentials = []Credential{}
	}
	if req.Bindings == nil {
		req.Bindings = []CredentialBinding{}
	}
	var st CredentialVaultState
	if err := s.vault(ctx, &call{method: http.MethodPost, path: "/credential-vault"}, req, &st); err != nil {
		return nil, err
	}
	return &st, nil
}

// GetCredentialVault returns the sanitized vault.
func (s *SandboxHandle) GetCredentialVault(ctx context.Context) (*CredentialVaultState, error) {
	var st CredentialVaultState
	if err := s.vault(ctx, &call{method: http.MethodGet, path: "/credential-vault"}, nil, &st); err != nil {
		return nil, err
	}
	return &st, nil
}

// PatchCredentialVault applies a patch and returns the new state.
func (s *SandboxHandle) PatchCredentialVault(ctx context.Context, p CredentialVaultPatch) (*CredentialVaultState, error) {
	var st CredentialVaultState
	// Retried only with a revision guard: the guard makes a replay fail
	// instead of applying twice.
	c := &call{method: http.MethodPatch, path: "/credential-vault", idempotent: p.ExpectedRevision != nil}
	if err := s.vault(ctx, c, p, &st); err != nil {
		return nil, err
	}
	return &st, nil
}

// DeleteCredentialVault deletes the vault; nothing is injected any more.
func (s *SandboxHandle) DeleteCredentialVault(ctx context.Context) error {
	return s.vault(ctx, &call{method: http.MethodDelete, path: "/credential-vault", want: []int{http.StatusNoContent}}, nil, nil)
}

// ListCredentials returns the credentials' metadata and the vault revision.
func (s *SandboxHandle) ListCredentials(ctx context.Context) ([]CredentialMetadata, int64, error) {
	var l credentialList
	if err := s.vault(ctx, &call{method: http.MethodGet, path: "/credential-vault/credentials"}, nil, &l); err != nil {
		return nil, 0, err
	}
	return l.Credentials, l.Revision, nil
}

// GetCredential returns one credential's metadata.
func (s *SandboxHandle) GetCredential(ctx context.Context, name string) (*CredentialMetadata, error) {
	if name == "" {
		return nil, fmt.Errorf("client: GetCredential needs a name: %w", ErrInvalid)
	}
	var m CredentialMetadata
	if err := s.vault(ctx, &call{method: http.MethodGet, path: "/credential-vault/credentials/" + url.PathEscape(name)}, nil, &m); err != nil {
		return nil, err
	}
	return &m, nil
}

// ListBindings returns the bindings' metadata and the vault revision.
func (s *SandboxHandle) ListBindings(ctx context.Context) ([]BindingMetadata, int64, error) {
	var l bindingList
	if err := s.vault(ctx, &call{method: http.MethodGet, path: "/credential-vault/bindings"}, nil, &l); err != nil {
		return nil, 0, err
	}
	return l.Bindings, l.Revision, nil
}

// GetBinding returns one binding's metadata.
func (s *SandboxHandle) GetBinding(ctx context.Context, name string) (*BindingMetadata, error) {
	if name == "" {
		return nil, fmt.Errorf("client: GetBinding needs a name: %w", ErrInvalid)
	}
	var m BindingMetadata
	if err := s.vault(ctx, &call{method: http.MethodGet, path: "/credential-vault/bindings/" + url.PathEscape(name)}, nil, &m); err != nil {
		return nil, err
	}
	return &m, nil
}

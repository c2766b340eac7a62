package vault

import (
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/moat-sandbox/moat/internal/errdefs"
)

// StoredCredential is a credential of a vault, value included.
type StoredCredential struct {
	Name       string
	SourceType string
	Value      Secret
	// Revision is the vault revision that added or last replaced it.
	Revision int64
}

// StoredBinding is a normalized binding of a vault.
type StoredBinding struct {
	Binding
	// Revision is the vault revision that added or last replaced it.
	Revision int64
}

// State is one sandbox's vault. A State is immutable once built: Apply
// returns a new one, so a published *State (and the Rules compiled from
// it) can be read without locks.
type State struct {
	Revision    int64
	Credentials map[string]StoredCredential
	Bindings    map[string]StoredBinding
}

// HostCheck reports whether the sandbox's network policy explicitly
// allows host (a DNS name or "*.suffix"); nil accepts every host.
// Credentials are only bound to hosts the policy names: the proxy relies
// on the sandbox's own DNS resolutions of a bound host (see mitm).
type HostCheck func(host string) bool

// New validates a create request and returns revision 1.
func New(req CreateRequest, allowed HostCheck) (*State, error) {
	s := &State{Revision: 1, Credentials: map[string]StoredCredential{}, Bindings: map[string]StoredBinding{}}
	for _, c := range req.Credentials {
		sc, err := normalizeCredential(c, 1)
		if err != nil {
			return nil, err
		}
		if _, dup := s.Credentials[sc.Name]; dup {
			return nil, invalid("credential %q appears twice", sc.Name)
		}
		s.Credentials[sc.Name] = sc
	}
	for _, b := range req.Bindings {
		nb, err := normalizeBinding(b)
		if err != nil {
			return nil, err
		}
		if _, dup := s.Bindings[nb.Name]; dup {
			return nil, invalid("binding %q appears twice", nb.Name)
		}
		s.Bindings[nb.Name] = StoredBinding{Binding: nb, Revision: 1}
	}
	if err := s.check(allowed); err != nil {
		return nil, err
	}
	return s, nil
}

// Apply validates a PATCH against s and returns the next revision. A
// stale ExpectedRevision is an errdefs.ErrConflict; s is never changed.
func (s *State) Apply(req PatchRequest, allowed HostCheck) (*State, error) {
	if req.ExpectedRevision != nil && *req.ExpectedRevision != s.Revision {
		return nil, errdefs.WithPublic(errdefs.ErrConflict, CodeConflict,
			fmt.Sprintf("expectedRevision %d does not match the current revision %d", *req.ExpectedRevision, s.Revision))
	}
	next := &State{Revision: s.Revision + 1, Credentials: maps.Clone(s.Credentials), Bindings: maps.Clone(s.Bindings)}
	if ops := req.Credentials; ops != nil {
		if err := next.applyCredentials(ops); err != nil {
			return nil, err
		}
	}
	if ops := req.Bindings; ops != nil {
		if err := next.applyBindings(ops); err != nil {
			return nil, err
		}
	}
	if err := next.check(allowed); err != nil {
		return nil, err
	}
	return next, nil
}

// applyCredentials applies ops to s, the next state Apply builds.
func (s *State) applyCredentials(ops *CredentialOps) error {
	mentioned := map[string]bool{}
	mention := func(name string) error {
		if mentioned[name] {
			return invalid("credential %q appears in more than one operation", name)
		}
		mentioned[name] = true
		return nil
	}
	for _, raw := range ops.Delete {
		name, err := checkName("credential", raw)
		if err != nil {
			return err
		}
		if err := mention(name); err != nil {
			return err
		}
		if _, ok := s.Credentials[name]; !ok {
			return invalid("credentials.delete: credential %q does not exist", name)
		}
		delete(s.Credentials, name)
	}
	for _, c := range ops.Replace {
		sc, err := normalizeCredential(c, s.Revision)
		if err != nil {
			return err
		}
		if err := mention(sc.Name); err != nil {
			return err
		}
		if _, ok := s.Credentials[sc.Name]; !ok {
			return invalid("credentials.replace: credential %q does not exist", sc.Name)
		}
		s.Credentials[sc.Name] = sc
	}
	for _, c := range ops.Add {
		sc, err := normalizeCredential(c, s.Revision)
		if err != nil {
			return err
		}
		if err := mention(sc.Name); err != nil {
			return err
		}
		if _, ok := s.Credentials[sc.Name]; ok {
			return invalid("credentials.add: credential %q already exists (use replace)", sc.Name)
		}
		s.Credentials[sc.Name] = sc
	}
	return nil
}

// applyBindings applies ops to s, the next state Apply builds.
func (s *State) applyBindings(ops *BindingOps) error {
	mentioned := map[string]bool{}
	mention := func(name string) error {
		if mentioned[name] {
			return invalid("binding %q appears in more than one operation", name)
		}
		mentioned[name] = true
		return nil
	}
	for _, raw := range ops.Delete {
		name, err := checkName("binding", raw)
		if err != nil {
			return err
		}
		if err := mention(name); err != nil {
			return err
		}
		if _, ok := s.Bindings[name]; !ok {
			return invalid("bindings.delete: binding %q does not exist", name)
		}
		delete(s.Bindings, name)
	}
	for _, b := range ops.Replace {
		nb, err := normalizeBinding(b)
		if err != nil {
			return err
		}
		if err := mention(nb.Name); err != nil {
			return err
		}
		if _, ok := s.Bindings[nb.Name]; !ok {
			return invalid("bindings.replace: binding %q does not exist", nb.Name)
		}
		s.Bindings[nb.Name] = StoredBinding{Binding: nb, Revision: s.Revision}
	}
	for _, b := range ops.Add {
		nb, err := normalizeBinding(b)
		if err != nil {
			return err
		}
		if err := mention(nb.Name); err != nil {
			return err
		}
		if _, ok := s.Bindings[nb.Name]; ok {
			return invalid("bindings.add: binding %q already exists (use replace)", nb.Name)
		}
		s.Bindings[nb.Name] = StoredBinding{Binding: nb, Revision: s.Revision}
	}
	return nil
}

// check validates the whole state: limits, references, policy coverage
// and that no two bindings can match the same request.
func (s *State) check(allowed HostCheck) error {
	if len(s.Credentials) > MaxCredentials {
		return invalid("a vault holds at most %d credentials", MaxCredentials)
	}
	if len(s.Bindings) > MaxBindings {
		return invalid("a vault holds at most %d bindings", MaxBindings)
	}
	names := slices.Sorted(maps.Keys(s.Bindings))
	for _, n := range names {
		b := s.Bindings[n]
		for _, ref := range b.Auth.refs() {
			if _, ok := s.Credentials[ref]; !ok {
				return invalid("binding %q uses credential %q, which does not exist", n, ref)
			}
		}
		if allowed != nil {
			for _, h := range b.Match.Hosts {
				if !allowed(h) {
					return invalid("binding %q: host %q is not allowed by an explicit allow rule of the sandbox's networkPolicy", n, h)
				}
			}
		}
	}
	for i, a := range names {
		for _, b := range names[i+1:] {
			if ambiguous(s.Bindings[a].Match, s.Bindings[b].Match) {
				return invalid("bindings %q and %q can match the same request", a, b)
			}
		}
	}
	return nil
}

// ambiguous reports whether two matches can select the same request at
// the same precedence (exact hosts beat wildcards, see Rules).
func ambiguous(a, b Match) bool {
	if !overlaps(a.Schemes, b.Schemes) || !overlaps(a.Ports, b.Ports) || !overlaps(a.Methods, b.Methods) {
		return false
	}
	pathsOverlap := false
	for _, x := range a.Paths {
		for _, y := range b.Paths {
			if patternsOverlap(x, y) {
				pathsOverlap = true
			}
		}
	}
	if !pathsOverlap {
		return false
	}
	for _, x := range a.Hosts {
		for _, y := range b.Hosts {
			xw, yw := strings.HasPrefix(x, "*."), strings.HasPrefix(y, "*.")
			switch {
			case xw != yw:
				continue
			case !xw && x == y:
				return true
			case xw && (x == y || strings.HasSuffix(x, y[1:]) || strings.HasSuffix(y, x[1:])):
				return true
			}
		}
	}
	return false
}

func overlaps[T comparable](a, b []T) bool {
	for _, x := range a {
		if slices.Contains(b, x) {
			return true
		}
	}
	return false
}

// patternsOverlap is a conservative test: two path patterns overlap when
// their literal prefixes (up to the first "*") are prefixes of each other
// and at least one has a "*" there, or they are equal.
func patternsOverlap(a, b string) bool {
	if a == b {
		return true
	}
	pa, wa := literalPrefix(a)
	pb, wb := literalPrefix(b)
	switch {
	case wa && wb:
		return strings.HasPrefix(pa, pb) || strings.HasPrefix(pb, pa)
	case wa:
		return strings.HasPrefix(b, pa)
	case wb:
		return strings.HasPrefix(a, pb)
	}
	return false
}

func literalPrefix(p string) (string, bool) {
	if i := strings.IndexByte(p, '*'); i >= 0 {
		return p[:i], true
	}
	return p, false
}

// View returns the sanitized state.
func (s *State) View() View {
	return View{Revision: s.Revision, Credentials: s.credentialMetas(), Bindings: s.bindingMetas()}
}

// CredentialList is the sanitized credential list.
func (s *State) CredentialList() CredentialList {
	return CredentialList{Revision: s.Revision, Credentials: s.credentialMetas()}
}

// BindingList is the sanitized binding list.
func (s *State) BindingList() BindingList {
	return BindingList{Revision: s.Revision, Bindings: s.bindingMetas()}
}

// Credential returns the sanitized metadata of one credential.
func (s *State) Credential(name string) (CredentialMeta, error) {
	c, ok := s.Credentials[name]
	if !ok {
		return CredentialMeta{}, notFound("credential", name)
	}
	return credentialMeta(c), nil
}

// Binding returns the sanitized metadata of one binding.
func (s *State) Binding(name string) (BindingMeta, error) {
	b, ok := s.Bindings[name]
	if !ok {
		return BindingMeta{}, notFound("binding", name)
	}
	return bindingMeta(b), nil
}

func (s *State) credentialMetas() []CredentialMeta {
	out := make([]CredentialMeta, 0, len(s.Credentials))
	for _, n := range slices.Sorted(maps.Keys(s.Credentials)) {
		out = append(out, credentialMeta(s.Credentials[n]))
	}
	return out
}

func (s *State) bindingMetas() []BindingMeta {
	out := make([]BindingMeta, 0, len(s.Bindings))
	for _, n := range slices.Sorted(maps.Keys(s.Bindings)) {
		out = append(out, bindingMeta(s.Bindings[n]))
	}
	return out
}

func credentialMeta(c StoredCredential) CredentialMeta {
	return CredentialMeta{Name: c.Name, SourceType: c.SourceType, Revision: c.Revision}
}

func bindingMeta(b StoredBinding) BindingMeta {
	m := BindingMeta{Name: b.Name, Revision: b.Revision, Match: cloneMatch(b.Match), Auth: AuthMeta{Type: b.Auth.Type}}
	if b.Auth.Type == AuthAPIKey {
		m.Auth.Name, m.Auth.In = b.Auth.Name, b.Auth.In
	}
	return m
}

func cloneMatch(m Match) Match {
	return Match{Schemes: slices.Clone(m.Schemes), Ports: slices.Clone(m.Ports), Hosts: slices.Clone(m.Hosts),
		Methods: slices.Clone(m.Methods), Paths: slices.Clone(m.Paths)}
}

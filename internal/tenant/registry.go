package tenant

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/moat-sandbox/moat/internal/egress/policy"
	"github.com/moat-sandbox/moat/internal/errdefs"
	"github.com/moat-sandbox/moat/internal/store"
)

// Store buckets of the registry. Records are JSON; a key record never
// holds the key itself, only its digest.
const (
	KeyBucket    = "keys"
	TenantBucket = "tenants"
	// MetaBucket holds the registry's schema record (SchemaKey).
	MetaBucket = "registry"
	SchemaKey  = "schema"
)

// SchemaVersion is the version of the registry's records. Version 2
// fenced admins to their tenant: Open migrates a store of version 1 (no
// schema record) once, turning every admin key of tenant default into a
// platform key, so that they keep acting across tenants as they did; admin
// keys of other tenants become admins of their tenant only.
const SchemaVersion = 2

// schema is the record under MetaBucket/SchemaKey.
type schema struct {
	Version int `json:"version"`
	// Promoted lists the key ids the version 2 migration made platform.
	Promoted []string `json:"promoted,omitempty"`
}

// Key format: "moat_" + 16 hex id + "_" + 64 hex secret (256 random bits).
// The id is not secret: it names the key in listings and audit records,
// and lets the server find the record without a search.
const (
	keyPrefix  = "moat_"
	keyIDLen   = 16
	secretLen  = 64
	keyLen     = len(keyPrefix) + keyIDLen + 1 + secretLen
	maxNameLen = 128
)

// SecretLen is the length of the server secret keys are hashed with.
const SecretLen = 32

// Key is the record of an API key. The key itself is shown once, when it
// is created, and never stored: Digest is HMAC-SHA256 of the key under the
// server secret.
type Key struct {
	ID     string `json:"id"`
	Name   string `json:"name,omitempty"`
	Tenant string `json:"tenant"`
	Role   Role   `json:"role"`
	// Digest is hex HMAC-SHA256(server secret, key). It never leaves the
	// server (the API types omit it).
	Digest    string     `json:"digest"`
	CreatedAt time.Time  `json:"createdAt"`
	CreatedBy string     `json:"createdBy,omitempty"`
	ExpiresAt *time.Time `json:"expiresAt,omitempty"`
	RevokedAt *time.Time `json:"revokedAt,omitempty"`
}

// Active reports whether the key authenticates at now.
func (k Key) Active(now time.Time) bool {
	return k.RevokedAt == nil && (k.ExpiresAt == nil || now.Before(*k.ExpiresAt))
}

// Tenant is the record of a tenant.
type Tenant struct {
	Name  string `json:"name"`
	Quota Quota  `json:"quota"`
	// Egress is the tenant's egress guardrail (nil: none): every sandbox
	// of the tenant is enforced with it intersected with its own policy
	// (policy.Effective).
	Egress    *policy.NetworkPolicy `json:"egress,omitempty"`
	CreatedAt time.Time             `json:"createdAt"`
}

// Options configure a Registry.
type Options struct {
	// RootKey is the server's own key (MOAT_API_KEY or <root>/api-key):
	// an admin of the Default tenant, with key id RootKeyID. Empty: none.
	RootKey string
	// Secret is the server secret key digests are computed with
	// (SecretLen random bytes, kept outside the state store so that a
	// copy of the store alone does not let anyone check guesses). Empty:
	// a random one for this process (keys do not survive a restart).
	Secret []byte
	// Now is the clock; default time.Now.
	Now func() time.Time
	// FileTenants are the tenants of a tenants file (LoadTenantsFile):
	// each is created (without quota) if missing, and its keys
	// authenticate as its principals. They are held in memory only, as
	// digests, and neither listed nor revoked through the API: the file
	// is their source.
	FileTenants []FileTenant
}

// Registry holds the tenants and API keys. It keeps them in memory and
// writes through to the store (nil: memory only). It is safe for
// concurrent use.
type Registry struct {
	db      store.Store
	secret  []byte
	rootKey string
	now     func() time.Time

	mu      sync.RWMutex
	keys    map[string]Key
	tenants map[string]Tenant
	// fileKeys maps the digests of tenants-file keys to their principals;
	// fileIDs maps their key ids to the same (SetFileTenants replaces
	// both under mu).
	fileKeys map[string]fileKey
	fileIDs  map[string]fileKey
}

// Open loads the registry from db (nil: an empty, memory-only registry).
func Open(db store.Store, opt Options) (*Registry, error) {
	r := &Registry{db: db, secret: opt.Secret, rootKey: opt.RootKey, now: opt.Now,
		keys: map[string]Key{}, tenants: map[string]Tenant{}}
	if r.now == nil {
		r.now = time.Now
	}
	if len(r.secret) == 0 {
		r.secret = make([]byte, SecretLen)
		rand.Read(r.secret)
	} else if len(r.secret) < 16 {
		return nil, fmt.Errorf("key secret too short (%d bytes, want %d): %w", len(r.secret), SecretLen, errdefs.ErrInvalidArgument)
	}
	r.fileKeys, r.fileIDs = r.fileKeysOf(opt.FileTenants)
	if db == nil {
		r.addFileTenants(opt.FileTenants)
		return r, nil
	}
	keys, err := store.List[Key](db, KeyBucket)
	if err != nil {
		return nil, fmt.Errorf("load keys: %w", err)
	}
	if keys, err = migrate(db, keys); err != nil {
		return nil, err
	}
	for _, k := range keys {
		r.keys[k.ID] = k
	}
	tenants, err := store.List[Tenant](db, TenantBucket)
	if err != nil {
		return nil, fmt.Errorf("load tenants: %w", err)
	}
	for _, t := range tenants {
		r.tenants[t.Name] = t
	}
	if err := r.addFileTenants(opt.FileTenants); err != nil {
		return nil, err
	}
	if w, ok := db.(store.Watcher); ok {
		r.follow(w)
	}
	return r, nil
}

// migrate brings keys of an older schema to SchemaVersion and records it
// (see SchemaVersion); it returns the keys as they are now.
func migrate(db store.Store, keys []Key) ([]Key, error) {
	var sc schema
	if err := db.Get(MetaBucket, SchemaKey, &sc); err != nil && !errdefs.IsNotFound(err) {
		return nil, fmt.Errorf("load registry schema: %w", err)
	}
	if sc.Version >= SchemaVersion {
		return keys, nil
	}
	sc = schema{Version: SchemaVersion}
	for i, k := range keys {
		if k.Role == RoleAdmin && Normalize(k.Tenant) == Default {
			k.Role = RolePlatform
			if err := db.Put(KeyBucket, k.ID, k); err != nil {
				return nil, fmt.Errorf("migrate key %s: %w", k.ID, err)
			}
			keys[i] = k
			sc.Promoted = append(sc.Promoted, k.ID)
		}
	}
	if err := db.Put(MetaBucket, SchemaKey, sc); err != nil {
		return nil, fmt.Errorf("record registry schema: %w", err)
	}
	return keys, nil
}

// follow keeps the registry current with the keys and tenants other
// processes sharing the store write (the replicas of a stateless server):
// a key made or revoked through one replica counts on every replica.
func (r *Registry) follow(w store.Watcher) {
	ctx := context.Background() // the registry lives as long as the process
	w.Watch(ctx, KeyBucket, func(id string, raw []byte) {
		var k Key
		if raw != nil && json.Unmarshal(raw, &k) != nil {
			return
		}
		r.mu.Lock()
		defer r.mu.Unlock()
		if raw == nil {
			delete(r.keys, id)
		} else {
			r.keys[id] = k
		}
	})
	w.Watch(ctx, TenantBucket, func(name string, raw []byte) {
		var t Tenant
		if raw != nil && json.Unmarshal(raw, &t) != nil {
			return
		}
		r.mu.Lock()
		defer r.mu.Unlock()
		if raw == nil {
			delete(r.tenants, name)
		} else {
			r.tenants[name] = t
		}
	})
}

// HasRootKey reports whether the server's own key is configured.
func (r *Registry) HasRootKey() bool { return r.rootKey != "" }

func (r *Registry) digest(key string) string {
	m := hmac.New(sha256.New, r.secret)
	m.Write([]byte(key))
	return hex.EncodeToString(m.Sum(nil))
}

// invalidKey is the answer to a key that is not known. The message is the
// same whatever was wrong with it.
func invalidKey() error {
	return errdefs.WithPublic(fmt.Errorf("api key: %w", errdefs.ErrUnauthenticated), "INVALID_API_KEY", "invalid API key")
}

// LooksLikeKey reports whether s has the shape of a registry key (it may
// still be unknown). Callers that see tokens of other kinds in the same
// header (the server proxy's X-EXECD-ACCESS-TOKEN) use it to tell them apart.
func LooksLikeKey(s string) bool {
	_, ok := parseKey(s)
	return ok
}

// E2BKeyPrefix starts the E2B form of a key: "e2b_" + hex, the shape
// E2B's SDKs expect (older ones refuse other keys before sending).
const E2BKeyPrefix = "e2b_"

// E2BKey returns the E2B form of a registry key: "e2b_" + its id and
// secret, 80 hex characters. Both forms are the same key. A key that is
// not a registry key (the server's own key) is returned as "e2b_" + key.
func E2BKey(key string) string {
	if fromE2BKey(key) != "" {
		return key
	}
	if _, ok := parseKey(key); ok {
		return E2BKeyPrefix + key[len(keyPrefix):len(keyPrefix)+keyIDLen] + key[len(keyPrefix)+keyIDLen+1:]
	}
	return E2BKeyPrefix + key
}

// fromE2BKey returns the registry form of an E2B-form key ("" if key is
// not one).
func fromE2BKey(key string) string {
	hexPart, ok := strings.CutPrefix(key, E2BKeyPrefix)
	if !ok || len(hexPart) != keyIDLen+secretLen || !isHex(hexPart) {
		return ""
	}
	return keyPrefix + hexPart[:keyIDLen] + "_" + hexPart[keyIDLen:]
}

func parseKey(s string) (id string, ok bool) {
	if k := fromE2BKey(s); k != "" {
		s = k
	}
	if len(s) != keyLen || !strings.HasPrefix(s, keyPrefix) || s[len(keyPrefix)+keyIDLen] != '_' {
		return "", false
	}
	id = s[len(keyPrefix) : len(keyPrefix)+keyIDLen]
	if !isHex(id) || !isHex(s[len(keyPrefix)+keyIDLen+1:]) {
		return "", false
	}
	return id, true
}

func isHex(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
			return false
		}
	}
	return true
}

// IsRootKey reports, in constant time, whether key is the server's own key.
func (r *Registry) IsRootKey(key string) bool {
	return r.rootKey != "" && len(key) == len(r.rootKey) && subtle.ConstantTimeCompare([]byte(key), []byte(r.rootKey)) == 1
}

// Authenticate returns the principal of an API key. Unknown, revoked and
// expired keys are ErrUnauthenticated (code INVALID_API_KEY); only a caller
// who holds the real key learns that it was revoked or has expired.
func (r *Registry) Authenticate(key string) (Principal, error) {
	if k := fromE2BKey(key); k != "" {
		key = k
	} else if rest, ok := strings.CutPrefix(key, E2BKeyPrefix); ok && r.IsRootKey(rest) {
		key = rest
	}
	if r.IsRootKey(key) {
		return rootPrincipal(), nil
	}
	id, ok := parseKey(key)
	if !ok {
		// A map lookup by the keyed digest: its timing says nothing of
		// the keys without the server secret.
		d := r.digest(key)
		r.mu.RLock()
		fk, ok := r.fileKeys[d]
		r.mu.RUnlock()
		if ok {
			return fk.principal(), nil
		}
		return Principal{}, invalidKey()
	}
	got := r.digest(key)
	r.mu.RLock()
	k, found := r.keys[id]
	r.mu.RUnlock()
	want := k.Digest
	if !found {
		want = strings.Repeat("0", len(got)) // compare anyway: same timing for unknown ids
	}
	if subtle.ConstantTimeCompare([]byte(got), []byte(want)) != 1 || !found {
		return Principal{}, invalidKey()
	}
	if err := r.usable(k); err != nil {
		return Principal{}, err
	}
	return k.principal(), nil
}

// fileKeysOf indexes the keys of a tenants file by digest and by id.
func (r *Registry) fileKeysOf(fts []FileTenant) (byDigest, byID map[string]fileKey) {
	byDigest, byID = map[string]fileKey{}, map[string]fileKey{}
	for _, ft := range fts {
		for _, k := range ft.APIKeys {
			d := r.digest(k)
			fk := fileKey{id: fileKeyID(d), tenant: ft.Name, role: ft.Role}
			byDigest[d], byID[fk.id] = fk, fk
		}
	}
	return byDigest, byID
}

// SetFileTenants replaces the tenants file's keys with those of fts (a
// reread file): keys no longer listed stop authenticating at once, and
// tenants new to it are created.
func (r *Registry) SetFileTenants(fts []FileTenant) error {
	byDigest, byID := r.fileKeysOf(fts)
	r.mu.Lock()
	defer r.mu.Unlock()
	r.fileKeys, r.fileIDs = byDigest, byID
	return r.addFileTenants(fts)
}

// addFileTenants creates the tenants of the tenants file that do not
// exist (an existing one keeps its quota and guardrail). The caller holds
// mu, or is Open.
func (r *Registry) addFileTenants(fts []FileTenant) error {
	for _, ft := range fts {
		if _, ok := r.tenants[ft.Name]; ok {
			continue
		}
		t := Tenant{Name: ft.Name, CreatedAt: r.now().UTC()}
		if err := r.put(TenantBucket, t.Name, t); err != nil {
			return fmt.Errorf("tenant %s of the tenants file: %w", t.Name, err)
		}
		r.tenants[t.Name] = t
	}
	return nil
}

// filePrincipal is the principal of a tenants-file key.
func (k fileKey) principal() Principal {
	return Principal{KeyID: k.id, Tenant: k.tenant, Role: k.role}
}

// rootPrincipal is the principal of the server's own key.
func rootPrincipal() Principal {
	return Principal{KeyID: RootKeyID, Tenant: Default, Role: RolePlatform, AllTenants: true}
}

// principal is the key's principal: only the platform role sees every
// tenant; an admin is fenced to its tenant like every other role.
func (k Key) principal() Principal {
	return Principal{KeyID: k.ID, Tenant: Normalize(k.Tenant), Role: k.Role, AllTenants: k.Role == RolePlatform}
}

func (r *Registry) usable(k Key) error {
	switch {
	case k.RevokedAt != nil:
		return errdefs.WithPublic(fmt.Errorf("api key %s revoked: %w", k.ID, errdefs.ErrUnauthenticated), "INVALID_API_KEY", "API key "+k.ID+" has been revoked")
	case k.ExpiresAt != nil && !r.now().Before(*k.ExpiresAt):
		return errdefs.WithPublic(fmt.Errorf("api key %s expired: %w", k.ID, errdefs.ErrUnauthenticated), "INVALID_API_KEY", "API key "+k.ID+" has expired")
	}
	return nil
}

// PrincipalOf returns the current principal of key id, for credential
// sources that authenticate a key once and then remember its id (the web
// console's sessions): a key revoked or expired since, or whose role
// changed, takes effect on the next request.
func (r *Registry) PrincipalOf(keyID string) (Principal, error) {
	if keyID == RootKeyID && r.rootKey != "" {
		return rootPrincipal(), nil
	}
	r.mu.RLock()
	fk, isFile := r.fileIDs[keyID]
	k, ok := r.keys[keyID]
	r.mu.RUnlock()
	if isFile {
		return fk.principal(), nil
	}
	if !ok {
		return Principal{}, invalidKey()
	}
	if err := r.usable(k); err != nil {
		return Principal{}, err
	}
	return k.principal(), nil
}

// NewKey is the request for a new key.
type NewKey struct {
	// Tenant owns the key; it is created (without quota) if missing.
	Tenant string
	Role   Role
	// Name describes the key (optional, at most 128 characters).
	Name string
	// ExpiresAt, if set, ends the key's validity.
	ExpiresAt *time.Time
	// CreatedBy is the key id of the creator (recorded).
	CreatedBy string
}

// CreateKey makes a key and returns its record and the key itself, which
// is not kept and cannot be shown again.
func (r *Registry) CreateKey(ctx context.Context, req NewKey) (Key, string, error) {
	if err := ValidName(req.Tenant); err != nil {
		return Key{}, "", err
	}
	if _, err := ParseRole(string(req.Role)); err != nil {
		return Key{}, "", err
	}
	if len(req.Name) > maxNameLen || !utf8.ValidString(req.Name) || strings.ContainsFunc(req.Name, isControl) {
		return Key{}, "", errdefs.Invalid("KEY::INVALID_NAME", fmt.Sprintf("key name must be at most %d printable characters", maxNameLen))
	}
	now := r.now().UTC()
	if req.ExpiresAt != nil && !req.ExpiresAt.After(now) {
		return Key{}, "", errdefs.Invalid("KEY::INVALID_EXPIRATION", "expiresAt must be in the future")
	}
	var idb [keyIDLen / 2]byte
	var sec [secretLen / 2]byte
	rand.Read(idb[:])
	rand.Read(sec[:])
	id := hex.EncodeToString(idb[:])
	token := keyPrefix + id + "_" + hex.EncodeToString(sec[:])
	k := Key{ID: id, Name: req.Name, Tenant: req.Tenant, Role: req.Role, Digest: r.digest(token),
		CreatedAt: now, CreatedBy: req.CreatedBy}
	if req.ExpiresAt != nil {
		at := req.ExpiresAt.UTC()
		k.ExpiresAt = &at
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, dup := r.keys[id]; dup {
		return Key{}, "", fmt.Errorf("key id collision: %w", errdefs.ErrConflict) // 2^-64: retry
	}
	if _, ok := r.tenants[req.Tenant]; !ok && req.Tenant != Default {
		t := Tenant{Name: req.Tenant, CreatedAt: now}
		if err := r.put(TenantBucket, t.Name, t); err != nil {
			return Key{}, "", err
		}
		r.tenants[t.Name] = t
	}
	if err := r.put(KeyBucket, id, k); err != nil {
		return Key{}, "", err
	}
	r.keys[id] = k
	return k, token, nil
}

func isControl(c rune) bool { return c < 0x20 || c == 0x7f }

func (r *Registry) put(bucket, key string, v any) error {
	if r.db == nil {
		return nil
	}
	return r.db.Put(bucket, key, v)
}

// keyNotFound is the answer for a key id that does not exist (or is out of
// the caller's scope).
func keyNotFound(id string) error {
	return errdefs.WithPublic(fmt.Errorf("key %q: %w", id, errdefs.ErrNotFound), "KEY::NOT_FOUND", fmt.Sprintf("key %s not found", id))
}

// rootKeyRecord describes the server's own key in listings.
func rootKeyRecord() Key {
	return Key{ID: RootKeyID, Name: "server key (MOAT_API_KEY or <root>/api-key)", Tenant: Default, Role: RolePlatform}
}

// Key returns the record of key id (the server's own key included).
func (r *Registry) Key(id string) (Key, error) {
	if id == RootKeyID && r.rootKey != "" {
		return rootKeyRecord(), nil
	}
	r.mu.RLock()
	k, ok := r.keys[id]
	r.mu.RUnlock()
	if !ok {
		return Key{}, keyNotFound(id)
	}
	return k, nil
}

// Keys returns the keys of tenant ("" = every tenant), oldest first, the
// server's own key first.
func (r *Registry) Keys(tenant string) []Key {
	var out []Key
	if r.rootKey != "" && (tenant == "" || tenant == Default) {
		out = append(out, rootKeyRecord())
	}
	r.mu.RLock()
	var ks []Key
	for _, k := range r.keys {
		if tenant == "" || Normalize(k.Tenant) == tenant {
			ks = append(ks, k)
		}
	}
	r.mu.RUnlock()
	sort.Slice(ks, func(i, j int) bool {
		if !ks[i].CreatedAt.Equal(ks[j].CreatedAt) {
			return ks[i].CreatedAt.Before(ks[j].CreatedAt)
		}
		return ks[i].ID < ks[j].ID
	})
	return append(out, ks...)
}

// RevokeKey revokes key id at once: every later request with it, and every
// session opened with it, is refused. Revoking a revoked key is a no-op.
func (r *Registry) RevokeKey(ctx context.Context, id string) (Key, error) {
	if id == RootKeyID && r.rootKey != "" {
		return Key{}, errdefs.WithPublic(fmt.Errorf("revoke root key: %w", errdefs.ErrFailedPrecondition), "KEY::NOT_REVOCABLE",
			"the server's own key cannot be revoked through the API: replace MOAT_API_KEY or <root>/api-key and restart the server")
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	k, ok := r.keys[id]
	if !ok {
		return Key{}, keyNotFound(id)
	}
	if k.RevokedAt != nil {
		return k, nil
	}
	now := r.now().UTC()
	k.RevokedAt = &now
	if err := r.put(KeyBucket, id, k); err != nil {
		return Key{}, err
	}
	r.keys[id] = k
	return k, nil
}

// tenantNotFound is the answer for a tenant that does not exist.
func tenantNotFound(name string) error {
	return errdefs.WithPublic(fmt.Errorf("tenant %q: %w", name, errdefs.ErrNotFound), "TENANT::NOT_FOUND", fmt.Sprintf("tenant %s not found", name))
}

// Tenant returns a tenant. The Default tenant always exists.
func (r *Registry) Tenant(name string) (Tenant, error) {
	r.mu.RLock()
	t, ok := r.tenants[name]
	r.mu.RUnlock()
	if ok {
		return t, nil
	}
	if name == Default {
		return Tenant{Name: Default}, nil
	}
	return Tenant{}, tenantNotFound(name)
}

// Tenants returns every tenant by name, Default included.
func (r *Registry) Tenants() []Tenant {
	r.mu.RLock()
	out := make([]Tenant, 0, len(r.tenants)+1)
	for _, t := range r.tenants {
		out = append(out, t)
	}
	_, hasDefault := r.tenants[Default]
	r.mu.RUnlock()
	if !hasDefault {
		out = append(out, Tenant{Name: Default})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// Quota returns the quota of tenant (zero: unlimited, also for a tenant
// without a record).
func (r *Registry) Quota(tenant string) Quota {
	r.mu.RLock()
	defer r.mu.RUnlock()
	return r.tenants[Normalize(tenant)].Quota
}

// PutTenant creates tenant name or sets its quota.
func (r *Registry) PutTenant(ctx context.Context, name string, q Quota) (t Tenant, created bool, err error) {
	if err := ValidName(name); err != nil {
		return Tenant{}, false, err
	}
	if err := q.Validate(); err != nil {
		return Tenant{}, false, err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	t, ok := r.tenants[name]
	if !ok {
		t = Tenant{Name: name, CreatedAt: r.now().UTC()}
	}
	t.Quota = q
	if err := r.put(TenantBucket, name, t); err != nil {
		return Tenant{}, false, err
	}
	r.tenants[name] = t
	return t, !ok, nil
}

// EgressGuardrail returns the egress guardrail of tenant (nil: none).
func (r *Registry) EgressGuardrail(tenant string) *policy.NetworkPolicy {
	r.mu.RLock()
	defer r.mu.RUnlock()
	if p := r.tenants[Normalize(tenant)].Egress; p != nil {
		c := p.Clone()
		return &c
	}
	return nil
}

// SetEgress sets (nil: removes) the egress guardrail of tenant name, which
// must exist (the Default tenant always does). p is validated and
// normalized.
func (r *Registry) SetEgress(ctx context.Context, name string, p *policy.NetworkPolicy) (Tenant, error) {
	if err := ValidName(name); err != nil {
		return Tenant{}, err
	}
	if p != nil {
		n, err := policy.Normalize(*p)
		if err != nil {
			return Tenant{}, err
		}
		p = &n
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	t, ok := r.tenants[name]
	if !ok {
		if name != Default {
			return Tenant{}, tenantNotFound(name)
		}
		t = Tenant{Name: Default, CreatedAt: r.now().UTC()}
	}
	t.Egress = p
	if err := r.put(TenantBucket, name, t); err != nil {
		return Tenant{}, err
	}
	r.tenants[name] = t
	return t, nil
}

// ErrTenantInUse is the class of a refused tenant deletion.
var ErrTenantInUse = errors.New("tenant in use")

// DeleteTenant removes tenant name. It is refused while the tenant has an
// active key, or while inUse (the caller's check of the tenant's sandboxes,
// pools and snapshots) reports a reason. The Default tenant cannot be
// deleted. Revoked keys of the tenant stay listed.
func (r *Registry) DeleteTenant(ctx context.Context, name string, inUse func(tenant string) string) error {
	if name == Default {
		return errdefs.WithPublic(fmt.Errorf("delete default tenant: %w", errdefs.ErrFailedPrecondition), "TENANT::NOT_DELETABLE", "the default tenant cannot be deleted")
	}
	if _, err := r.Tenant(name); err != nil {
		return err
	}
	// inUse runs unlocked: it asks other services, which may ask us.
	if inUse != nil {
		if why := inUse(name); why != "" {
			return errdefs.WithPublic(fmt.Errorf("tenant %s: %w: %w", name, ErrTenantInUse, errdefs.ErrFailedPrecondition), "TENANT::IN_USE",
				fmt.Sprintf("tenant %s still has %s", name, why))
		}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, ok := r.tenants[name]; !ok {
		return tenantNotFound(name)
	}
	now := r.now()
	for _, k := range r.keys {
		if k.Tenant == name && k.Active(now) {
			return errdefs.WithPublic(fmt.Errorf("tenant %s: %w: %w", name, ErrTenantInUse, errdefs.ErrFailedPrecondition), "TENANT::IN_USE",
				fmt.Sprintf("tenant %s still has active keys (revoke them first)", name))
		}
	}
	if r.db != nil {
		if err := r.db.Delete(TenantBucket, name); err != nil {
			return err
		}
	}
	delete(r.tenants, name)
	return nil
}

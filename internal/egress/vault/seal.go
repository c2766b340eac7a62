package vault

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/moat-sandbox/moat/internal/errdefs"
)

// KeySize is the size of a sealing key (AES-256).
const KeySize = 32

// Sealer encrypts vault state for storage with AES-256-GCM under a server
// key. Each sealed blob is bound to its sandbox by the additional data, so
// a blob copied into another sandbox's record does not open. It is safe
// for concurrent use.
type Sealer struct{ aead cipher.AEAD }

// NewSealer returns a Sealer for a KeySize-byte key.
func NewSealer(key []byte) (*Sealer, error) {
	if len(key) != KeySize {
		return nil, fmt.Errorf("vault key: want %d bytes, have %d: %w", KeySize, len(key), errdefs.ErrInvalidArgument)
	}
	block, err := aes.NewCipher(key)
	if err != nil {
		return nil, err
	}
	aead, err := cipher.NewGCM(block)
	if err != nil {
		return nil, err
	}
	return &Sealer{aead: aead}, nil
}

// Seal encrypts plaintext for sandbox id: nonce || ciphertext || tag.
func (s *Sealer) Seal(id string, plaintext []byte) []byte {
	nonce := make([]byte, s.aead.NonceSize(), s.aead.NonceSize()+len(plaintext)+s.aead.Overhead())
	if _, err := rand.Read(nonce); err != nil {
		panic("crypto/rand failed: " + err.Error()) // never returns an error on Linux
	}
	return s.aead.Seal(nonce, nonce, plaintext, ad(id))
}

// Open decrypts a blob sealed for sandbox id.
func (s *Sealer) Open(id string, blob []byte) ([]byte, error) {
	n := s.aead.NonceSize()
	if len(blob) < n+s.aead.Overhead() {
		return nil, errors.New("vault: sealed data too short")
	}
	out, err := s.aead.Open(nil, blob[:n], blob[n:], ad(id))
	if err != nil {
		return nil, errors.New("vault: sealed data does not open with this server's key")
	}
	return out, nil
}

func ad(id string) []byte { return []byte("moat-vault-v1\x00" + id) }

// LoadOrCreateKey reads a hex key from path, creating it (0600, random)
// if the file does not exist.
func LoadOrCreateKey(path string) ([]byte, error) {
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		key := make([]byte, KeySize)
		if _, err := rand.Read(key); err != nil {
			return nil, err
		}
		if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
			return nil, err
		}
		f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
		if errors.Is(err, os.ErrExist) {
			return LoadOrCreateKey(path) // lost a race with another creator
		}
		if err != nil {
			return nil, err
		}
		_, werr := f.WriteString(hex.EncodeToString(key) + "\n")
		if err := errors.Join(werr, f.Sync(), f.Close()); err != nil {
			os.Remove(path)
			return nil, err
		}
		return key, nil
	}
	if err != nil {
		return nil, err
	}
	return ParseKey(string(b))
}

// ParseKey decodes a hex key (64 hex digits, surrounding space ignored).
func ParseKey(s string) ([]byte, error) {
	key, err := hex.DecodeString(strings.TrimSpace(s))
	if err != nil || len(key) != KeySize {
		return nil, fmt.Errorf("vault key: want %d hex digits: %w", 2*KeySize, errdefs.ErrInvalidArgument)
	}
	return key, nil
}

// sealedForm is the plaintext JSON inside a sealed blob. It is the only
// place a value is marshalled as itself.
type sealedForm struct {
	Version     int                `json:"v"`
	Revision    int64              `json:"revision"`
	Credentials []sealedCredential `json:"credentials"`
	Bindings    []StoredBinding    `json:"bindings"`
	// Extra carries data sealed along with the vault (the sandbox CA key).
	Extra []byte `json:"extra,omitempty"`
}

type sealedCredential struct {
	Name       string `json:"name"`
	SourceType string `json:"sourceType"`
	Value      string `json:"value"`
	Revision   int64  `json:"revision"`
}

// SealState seals s (nil: no vault) and extra for sandbox id.
func SealState(sl *Sealer, id string, s *State, extra []byte) ([]byte, error) {
	f := sealedForm{Version: 1, Extra: extra}
	if s != nil {
		f.Revision = s.Revision
		for _, c := range s.credentialMetas() {
			sc := s.Credentials[c.Name]
			f.Credentials = append(f.Credentials, sealedCredential{Name: sc.Name, SourceType: sc.SourceType, Value: sc.Value.Reveal(), Revision: sc.Revision})
		}
		for _, b := range s.bindingMetas() {
			f.Bindings = append(f.Bindings, s.Bindings[b.Name])
		}
	}
	plain, err := json.Marshal(f)
	if err != nil {
		return nil, err
	}
	defer clear(plain)
	return sl.Seal(id, plain), nil
}

// OpenState opens a blob of SealState: the vault (nil if none) and extra.
func OpenState(sl *Sealer, id string, blob []byte) (*State, []byte, error) {
	plain, err := sl.Open(id, blob)
	if err != nil {
		return nil, nil, err
	}
	defer clear(plain)
	var f sealedForm
	if err := json.Unmarshal(plain, &f); err != nil {
		return nil, nil, errors.New("vault: sealed data is corrupt")
	}
	if f.Version != 1 {
		return nil, nil, fmt.Errorf("vault: sealed data version %d is not supported", f.Version)
	}
	if f.Revision == 0 {
		return nil, f.Extra, nil
	}
	s := &State{Revision: f.Revision, Credentials: map[string]StoredCredential{}, Bindings: map[string]StoredBinding{}}
	for _, c := range f.Credentials {
		s.Credentials[c.Name] = StoredCredential{Name: c.Name, SourceType: c.SourceType, Value: NewSecret(c.Value), Revision: c.Revision}
	}
	for _, b := range f.Bindings {
		s.Bindings[b.Name] = b
	}
	return s, f.Extra, nil
}

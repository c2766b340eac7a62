// Package mitm is the transparent egress proxy behind the Credential
// Vault. The host redirects a vault sandbox's outbound TCP to ports 80
// and 443 to it (nft.ApplyIntercept); for each connection it learns the
// sandbox from the source address and the original destination from
// conntrack (SO_ORIGINAL_DST), then:
//
//   - TLS whose SNI names no bound host, plain HTTP whose Host names none,
//     and anything it cannot parse is tunnelled to the original
//     destination byte for byte: the sandbox sees the upstream's own
//     certificate, and the proxy never decrypts it;
//   - TLS to a bound host is terminated with a certificate for the SNI
//     name signed by the sandbox's own CA (which the sandbox trusts), and
//     each request is forwarded over a new TLS connection to the original
//     destination, verified against the host's roots for that name;
//     requests that match a binding get the credential injected;
//   - plain HTTP to a bound host is forwarded the same way.
//
// Credentials go only where the sandbox's own DNS lookups through the moat
// DNS proxy sent it (Client's resolved check), so a sandbox cannot aim a
// bound host name at an address of its choice. Responses of intercepted
// connections are scrubbed of every credential value before they reach
// the sandbox.
//
// The package is built on the standard library's crypto/tls, crypto/x509
// and net/http/httputil: the transparent (not CONNECT-based) flow is small
// enough that the well-kept stdlib pieces serve better than a MITM
// framework (see docs/VAULT.md).
package mitm

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"sync"
	"time"
)

// Certificate lifetimes. A sandbox CA outlives any sandbox; leaves are
// short and re-issued from the cache before they expire.
const (
	caValidity   = 10 * 365 * 24 * time.Hour
	leafValidity = 7 * 24 * time.Hour
	leafRenew    = 24 * time.Hour // re-issue when less than this is left
	clockSkew    = time.Hour      // NotBefore backdating
	maxLeaves    = 512            // cached leaf certificates per CA
)

// CA is one sandbox's certificate authority: the sandbox trusts it (its
// certificate is installed in the sandbox's trust store) and the proxy
// signs a leaf certificate per intercepted host name with it. It is safe
// for concurrent use.
type CA struct {
	cert    *x509.Certificate
	certPEM []byte
	key     *ecdsa.PrivateKey
	// leafKey is shared by all leaves (as mitmproxy does): generating a
	// key per host would dominate the cost of a first connection.
	leafKey *ecdsa.PrivateKey

	mu     sync.Mutex
	leaves map[string]*tls.Certificate
}

// NewCA generates a CA (ECDSA P-256) whose subject names the sandbox.
func NewCA(sandboxID string) (*CA, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{CommonName: "moat sandbox CA " + sandboxID, Organization: []string{"moat credential vault"}},
		NotBefore:             now.Add(-clockSkew),
		NotAfter:              now.Add(caValidity),
		IsCA:                  true,
		BasicConstraintsValid: true,
		MaxPathLenZero:        true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
		SubjectKeyId:          keyID(&key.PublicKey),
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, err
	}
	return newCA(der, key)
}

// ParseCA rebuilds a CA from CertPEM and KeyDER output.
func ParseCA(certPEM, keyDER []byte) (*CA, error) {
	b, _ := pem.Decode(certPEM)
	if b == nil || b.Type != "CERTIFICATE" {
		return nil, errors.New("mitm: CA certificate is not PEM")
	}
	k, err := x509.ParsePKCS8PrivateKey(keyDER)
	if err != nil {
		return nil, fmt.Errorf("mitm: CA key: %w", err)
	}
	key, ok := k.(*ecdsa.PrivateKey)
	if !ok {
		return nil, errors.New("mitm: CA key is not ECDSA")
	}
	return newCA(b.Bytes, key)
}

func newCA(der []byte, key *ecdsa.PrivateKey) (*CA, error) {
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	if !cert.PublicKey.(*ecdsa.PublicKey).Equal(&key.PublicKey) {
		return nil, errors.New("mitm: CA key does not match its certificate")
	}
	leafKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	return &CA{
		cert:    cert,
		certPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		key:     key,
		leafKey: leafKey,
		leaves:  map[string]*tls.Certificate{},
	}, nil
}

// CertPEM is the CA certificate (public), for the sandbox's trust store.
func (c *CA) CertPEM() []byte { return c.certPEM }

// Certificate returns the parsed CA certificate.
func (c *CA) Certificate() *x509.Certificate { return c.cert }

// KeyDER is the CA private key (PKCS #8). Store it only sealed.
func (c *CA) KeyDER() ([]byte, error) { return x509.MarshalPKCS8PrivateKey(c.key) }

// Leaf returns a certificate for host signed by the CA, from the cache
// when a fresh one is there.
func (c *CA) Leaf(host string) (*tls.Certificate, error) {
	now := time.Now()
	c.mu.Lock()
	defer c.mu.Unlock()
	if l, ok := c.leaves[host]; ok && l.Leaf.NotAfter.Sub(now) > leafRenew {
		return l, nil
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{CommonName: host},
		DNSNames:              []string{host},
		NotBefore:             now.Add(-clockSkew),
		NotAfter:              now.Add(leafValidity),
		KeyUsage:              x509.KeyUsageDigitalSignature,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true,
		AuthorityKeyId:        c.cert.SubjectKeyId,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, c.cert, &c.leafKey.PublicKey, c.key)
	if err != nil {
		return nil, err
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	tc := &tls.Certificate{Certificate: [][]byte{der, c.cert.Raw}, PrivateKey: crypto.Signer(c.leafKey), Leaf: leaf}
	if len(c.leaves) >= maxLeaves {
		for h, l := range c.leaves { // evict expiring ones, else an arbitrary one
			if l.Leaf.NotAfter.Sub(now) <= leafRenew || len(c.leaves) >= maxLeaves {
				delete(c.leaves, h)
			}
			if len(c.leaves) < maxLeaves/2 {
				break
			}
		}
	}
	c.leaves[host] = tc
	return tc, nil
}

func serial() *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 126))
	if err != nil {
		panic("crypto/rand failed: " + err.Error())
	}
	return n.Add(n, big.NewInt(1))
}

func keyID(pub *ecdsa.PublicKey) []byte {
	b, _ := x509.MarshalPKIXPublicKey(pub)
	sum := sha256.Sum256(b)
	return sum[:20]
}

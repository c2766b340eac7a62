package server

import (
	"crypto/x509"
	"fmt"
	"os"

	"github.com/moat-sandbox/moat/internal/egress/vault"
)

// vaultSealer returns the sealer of Credential Vault state: the key from
// $MOAT_VAULT_KEY (VaultKey), else VaultKeyFile (created on first start).
func (c *Config) vaultSealer() (*vault.Sealer, error) {
	var key []byte
	var err error
	if c.VaultKey != "" {
		key, err = vault.ParseKey(c.VaultKey)
	} else {
		key, err = vault.LoadOrCreateKey(c.VaultKeyFile)
	}
	if err != nil {
		return nil, err
	}
	defer clear(key)
	return vault.NewSealer(key)
}

// vaultRoots are the roots the credential proxy verifies upstreams with:
// nil (the host's) unless VaultUpstreamCAFile adds some.
func (c *Config) vaultRoots() (*x509.CertPool, error) {
	pem, err := c.vaultUpstreamCA()
	if pem == nil || err != nil {
		return nil, err
	}
	pool, err := x509.SystemCertPool()
	if err != nil {
		pool = x509.NewCertPool()
	}
	pool.AppendCertsFromPEM(pem)
	return pool, nil
}

// vaultUpstreamCA is the content of VaultUpstreamCAFile (nil: none): PEM
// holding at least one certificate.
func (c *Config) vaultUpstreamCA() ([]byte, error) {
	if c.VaultUpstreamCAFile == "" {
		return nil, nil
	}
	pem, err := os.ReadFile(c.VaultUpstreamCAFile)
	if err != nil {
		return nil, fmt.Errorf("vault-upstream-ca: %w", err)
	}
	if !x509.NewCertPool().AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("vault-upstream-ca %s: no PEM certificate found", c.VaultUpstreamCAFile)
	}
	return pem, nil
}

package web

import (
	"crypto/tls"
	"errors"
	"fmt"
	"os"
	"sync"
	"time"
)

// Certificate serves a PEM certificate and key pair from files, reloading
// them when either file changes (a renewed wildcard certificate is picked
// up without a restart). It is safe for concurrent use.
type Certificate struct {
	certFile, keyFile string
	// Check bounds how often the files are looked at (default 10 s).
	check time.Duration

	mu      sync.Mutex
	cert    *tls.Certificate
	stamp   [2]time.Time
	checked time.Time
}

// LoadCertificate loads the pair once (a bad pair fails here, at start).
func LoadCertificate(certFile, keyFile string) (*Certificate, error) {
	if certFile == "" || keyFile == "" {
		return nil, errors.New("tls: both a certificate and a key file are needed")
	}
	c := &Certificate{certFile: certFile, keyFile: keyFile, check: 10 * time.Second}
	if err := c.reload(time.Now()); err != nil {
		return nil, err
	}
	return c, nil
}

func (c *Certificate) stamps() ([2]time.Time, error) {
	var s [2]time.Time
	for i, f := range []string{c.certFile, c.keyFile} {
		fi, err := os.Stat(f)
		if err != nil {
			return s, fmt.Errorf("tls: %w", err)
		}
		s[i] = fi.ModTime()
	}
	return s, nil
}

// reload reads the pair if the files changed. Callers hold c.mu (or own c).
func (c *Certificate) reload(now time.Time) error {
	c.checked = now
	s, err := c.stamps()
	if err != nil {
		return err
	}
	if c.cert != nil && s == c.stamp {
		return nil
	}
	cert, err := tls.LoadX509KeyPair(c.certFile, c.keyFile)
	if err != nil {
		return fmt.Errorf("tls: certificate %s, key %s: %w", c.certFile, c.keyFile, err)
	}
	c.cert, c.stamp = &cert, s
	return nil
}

// GetCertificate is tls.Config.GetCertificate. A pair that fails to
// reload (a half-written renewal) keeps the previous one in service.
func (c *Certificate) GetCertificate(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if now := time.Now(); now.Sub(c.checked) >= c.check {
		_ = c.reload(now)
	}
	return c.cert, nil
}

// TLSConfig is the server side of TLS with c: HTTP/2 negotiated by ALPN,
// HTTP/1.1 otherwise, TLS 1.2 at least.
func (c *Certificate) TLSConfig() *tls.Config {
	return &tls.Config{
		MinVersion:     tls.VersionTLS12,
		GetCertificate: c.GetCertificate,
		NextProtos:     []string{"h2", "http/1.1"},
	}
}

package web

import "time"

// SetCertificateCheck sets how often c looks at its files (tests).
func SetCertificateCheck(c *Certificate, d time.Duration) {
	c.mu.Lock()
	c.check = d
	c.mu.Unlock()
}

package execd

import (
	"bytes"
	"encoding/pem"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
)

// trustBundles are the system CA bundles of the common distributions, in
// order of preference for the environment variables: Debian/Ubuntu and
// Alpine, Alpine's and LibreSSL's cert.pem, RHEL/Fedora (two names of one
// file), openSUSE.
var trustBundles = []string{
	"/etc/ssl/certs/ca-certificates.crt",
	"/etc/ssl/cert.pem",
	"/etc/pki/tls/certs/ca-bundle.crt",
	"/etc/pki/ca-trust/extracted/pem/tls-ca-bundle.pem",
	"/etc/ssl/ca-bundle.pem",
}

// trustSources are directories the distributions' CA tools rebuild the
// bundles from (update-ca-certificates, update-ca-trust); the CA is also
// dropped there when they exist, so a rebuild keeps it.
var trustSources = map[string]string{
	"/usr/local/share/ca-certificates": "moat-sandbox-ca.crt",
	"/etc/pki/ca-trust/source/anchors": "moat-sandbox-ca.pem",
}

// trustEnvVars point TLS clients that do not read the system bundle by
// default (Python requests, Node.js, OpenSSL-based tools) at it.
var trustEnvVars = []string{"SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "NODE_EXTRA_CA_CERTS"}

// installTrust makes the sandbox trust the CA in $MOAT_TRUST_CA_PEM
// (agentproto.TrustCAEnv): it
// appends the certificate to every system bundle present (once: a
// restarted agent finds it there) or creates the Debian bundle if there is
// none, and returns env with SSL_CERT_FILE, REQUESTS_CA_BUNDLE and
// NODE_EXTRA_CA_CERTS set to the bundle unless the sandbox's environment
// sets them. It runs before the entrypoint starts. Failures are logged:
// the sandbox still runs, and TLS to bound hosts will fail visibly.
//
// root is the filesystem root ("/" in a sandbox; a directory in tests).
func installTrust(root, caPEM string, env []string, log *slog.Logger) []string {
	if caPEM == "" {
		return env
	}
	block, _ := pem.Decode([]byte(caPEM))
	if block == nil || block.Type != "CERTIFICATE" {
		log.Error("sandbox CA: not a PEM certificate; trust store unchanged")
		return env
	}
	cert := pem.EncodeToMemory(block)
	primary := ""
	seen := map[string]bool{}
	for _, p := range trustBundles {
		real, err := filepath.EvalSymlinks(filepath.Join(root, p))
		if err != nil || seen[real] {
			continue
		}
		seen[real] = true
		if fi, err := os.Stat(real); err != nil || !fi.Mode().IsRegular() {
			continue
		}
		if err := appendOnce(real, cert); err != nil {
			log.Error("sandbox CA: cannot add to bundle", "bundle", p, "err", err)
			continue
		}
		if primary == "" {
			primary = p
		}
	}
	if primary == "" {
		primary = trustBundles[0]
		path := filepath.Join(root, primary)
		err := os.MkdirAll(filepath.Dir(path), 0o755)
		if err == nil {
			err = os.WriteFile(path, cert, 0o644)
		}
		if err != nil {
			log.Error("sandbox CA: cannot create a bundle", "bundle", primary, "err", err)
			return env
		}
	}
	for d, name := range trustSources {
		dir := filepath.Join(root, d)
		if fi, err := os.Stat(dir); err != nil || !fi.IsDir() {
			continue
		}
		if err := os.WriteFile(filepath.Join(dir, name), cert, 0o644); err != nil {
			log.Warn("sandbox CA: cannot add to the CA sources", "dir", dir, "err", err)
		}
	}
	for _, k := range trustEnvVars {
		if !hasEnv(env, k) {
			env = append(env, k+"="+primary)
		}
	}
	log.Info("sandbox CA installed", "bundle", primary)
	return env
}

// appendOnce appends cert to the bundle at path unless it is there.
func appendOnce(path string, cert []byte) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	if bytes.Contains(b, bytes.TrimSpace(cert)) {
		return nil
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		return err
	}
	prefix := []byte{}
	if len(b) > 0 && b[len(b)-1] != '\n' {
		prefix = []byte{'\n'}
	}
	_, werr := f.Write(append(prefix, cert...))
	if cerr := f.Close(); werr == nil {
		werr = cerr
	}
	return werr
}

func hasEnv(env []string, key string) bool {
	for _, kv := range env {
		if strings.HasPrefix(kv, key+"=") {
			return true
		}
	}
	return false
}

package execd

import (
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

const testCA = `-----BEGIN CERTIFICATE-----
MIIBbTCCAROgAwIBAgIBATAKBggqhkjOPQQDAjAWMRQwEgYDVQQDEwttb2F0LXRl
c3QtY2EwHhcNMjYwMTAxMDAwMDAwWhcNMzYwMTAxMDAwMDAwWjAWMRQwEgYDVQQD
Ewttb2F0LXRlc3QtY2EwWTATBgcqhkjOPQIBBggqhkjOPQMBBwNCAAQ5xVb0ZqyQ
-----END CERTIFICATE-----
`

func TestInstallTrust(t *testing.T) {
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	write := func(root, p, content string) {
		t.Helper()
		if err := os.MkdirAll(filepath.Join(root, filepath.Dir(p)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(root, p), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	read := func(root, p string) string {
		b, _ := os.ReadFile(filepath.Join(root, p))
		return string(b)
	}
	for _, tc := range []struct {
		name    string
		setup   func(root string)
		env     []string
		bundles []string // files that must hold the CA
		primary string
	}{
		{"debian", func(r string) {
			write(r, "/etc/ssl/certs/ca-certificates.crt", "SYSTEM ROOTS\n")
			os.MkdirAll(filepath.Join(r, "/usr/local/share/ca-certificates"), 0o755)
		}, nil, []string{"/etc/ssl/certs/ca-certificates.crt", "/usr/local/share/ca-certificates/moat-sandbox-ca.crt"}, "/etc/ssl/certs/ca-certificates.crt"},
		{"alpine", func(r string) {
			write(r, "/etc/ssl/certs/ca-certificates.crt", "SYSTEM ROOTS") // no final newline
			os.Symlink("certs/ca-certificates.crt", filepath.Join(r, "/etc/ssl/cert.pem"))
		}, nil, []string{"/etc/ssl/certs/ca-certificates.crt"}, "/etc/ssl/certs/ca-certificates.crt"},
		{"rhel", func(r string) {
			write(r, "/etc/pki/ca-trust/extracted/pem/tls-ca-bundle.pem", "SYSTEM ROOTS\n")
			os.MkdirAll(filepath.Join(r, "/etc/pki/tls/certs"), 0o755)
			os.Symlink("../../ca-trust/extracted/pem/tls-ca-bundle.pem", filepath.Join(r, "/etc/pki/tls/certs/ca-bundle.crt"))
			os.MkdirAll(filepath.Join(r, "/etc/pki/ca-trust/source/anchors"), 0o755)
		}, nil, []string{"/etc/pki/ca-trust/extracted/pem/tls-ca-bundle.pem", "/etc/pki/ca-trust/source/anchors/moat-sandbox-ca.pem"}, "/etc/pki/tls/certs/ca-bundle.crt"},
		{"none", func(string) {}, []string{"SSL_CERT_FILE=/mine.pem"}, []string{"/etc/ssl/certs/ca-certificates.crt"}, "/etc/ssl/certs/ca-certificates.crt"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := t.TempDir()
			tc.setup(root)
			var env []string
			for range 2 { // a restarted agent must not add the CA twice
				env = installTrust(root, testCA, append([]string(nil), tc.env...), log)
			}
			for _, b := range tc.bundles {
				got := read(root, b)
				if strings.Count(got, "BEGIN CERTIFICATE") != 1 {
					t.Errorf("%s holds the CA %d times: %q", b, strings.Count(got, "BEGIN CERTIFICATE"), got)
				}
			}
			if got := read(root, tc.bundles[0]); tc.name != "none" && !strings.HasPrefix(got, "SYSTEM ROOTS\n-----BEGIN") {
				t.Errorf("system roots not kept: %q", got)
			}
			want := map[string]string{"SSL_CERT_FILE": tc.primary, "REQUESTS_CA_BUNDLE": tc.primary, "NODE_EXTRA_CA_CERTS": tc.primary}
			for _, kv := range tc.env { // the sandbox's own settings win
				k, v, _ := strings.Cut(kv, "=")
				want[k] = v
			}
			for k, v := range want {
				n := 0
				for _, kv := range env {
					if strings.HasPrefix(kv, k+"=") {
						n++
						if kv != k+"="+v {
							t.Errorf("%s, want %s=%s", kv, k, v)
						}
					}
				}
				if n != 1 {
					t.Errorf("%s set %d times in %q", k, n, env)
				}
			}
		})
	}
	if env := installTrust(t.TempDir(), "not a pem", []string{"A=1"}, log); len(env) != 1 {
		t.Fatalf("a bad PEM changed the env: %q", env)
	}
	if env := installTrust(t.TempDir(), "", []string{"A=1"}, log); len(env) != 1 {
		t.Fatalf("no CA changed the env: %q", env)
	}
}

// Package server wires `moat serve`: it opens the state store and the image
// store, builds the runtime backend, recovers sandboxes left by an earlier
// process, and serves the Lifecycle API until its context ends.
package server

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/moat-sandbox/moat/internal/agentbin"
	"github.com/moat-sandbox/moat/internal/image"
	"github.com/moat-sandbox/moat/internal/lifecycle"
	"github.com/moat-sandbox/moat/internal/tenant"
	"github.com/moat-sandbox/moat/internal/volume"
)

// Config is the configuration of `moat serve`. Defaults are applied by
// Default(); flags and environment (MOAT_*) override them in the CLI, then
// Validate runs once. To add a field: add it here with its unit and default
// documented, set the default in Default, bind a flag in internal/cli/serve.go,
// and check it in Validate.
type Config struct {
	// Listen is the API listen address. Default ":8080".
	Listen string
	// Root is the state directory (store, images, sandboxes). Default /var/lib/moat.
	Root string
	// RunRoot holds runtime state that must not survive a reboot. Default /run/moat.
	RunRoot string
	// CgroupParent is the cgroup native (oci) sandboxes are put under, as
	// <CgroupParent>/<id> in every hierarchy. Default "/moat". Do not change
	// it while sandboxes run.
	CgroupParent string
	// Runtime is the backend: "oci" (native, default), "docker" (Docker
	// Engine API) or "fake" (no processes; dev only).
	Runtime string
	// Kubernetes configures Runtime "kubernetes" (sandboxes are
	// BatchSandboxes served by `moat controller`).
	Kubernetes KubernetesConfig
	// DockerHost is the Docker Engine address for Runtime "docker"
	// (default unix:///var/run/docker.sock).
	DockerHost string
	// RuntimeClass is the default OCI runtime: runc (default), crun or runsc.
	RuntimeClass string
	// APIKey is the required OPEN-SANDBOX-API-KEY. If empty and auth is not
	// disabled, a key is read from (or generated into) APIKeyFile.
	APIKey string
	// APIKeyFile defaults to <Root>/api-key.
	APIKeyFile string
	// TenantsFile is OpenSandbox's multi-tenant configuration
	// (tenants.toml: [[tenants]] name, namespace, api_keys): its tenants
	// are created if missing and its keys authenticate (tenant.FileTenant).
	// On the kubernetes runtime it turns on tenant namespaces. Read at
	// start and reread every TenantsReload.
	TenantsFile string
	// TenantsReload is how often TenantsFile is reread (default 5s): a
	// changed file's keys and namespaces apply without a restart.
	TenantsReload time.Duration
	// fileTenants are TenantsFile's tenants (read by Validate).
	fileTenants []tenant.FileTenant
	// NoAuth disables API-key auth (only sensible on a loopback listener).
	NoAuth bool
	// KeySecretFile holds the server secret that API keys of the tenant
	// registry are hashed with (HMAC-SHA256), created with 32 random bytes
	// if missing (mode 0600). Default <Root>/key-secret. Losing it
	// invalidates every key created by `moat key create` (the server's
	// own key keeps working).
	KeySecretFile string
	// PublicAddress is host[:port] used in server-proxy endpoints. Default: the request Host.
	PublicAddress string
	// Bridge is the sandbox bridge name. Default "moat0".
	Bridge string
	// Subnet is the sandbox address range. Default 10.88.0.0/16.
	Subnet string
	// Subnet6, if set, gives native (oci) sandboxes IPv6 addresses from this
	// prefix (e.g. a ULA /64 "fd00:6d6f:6174::/64"), NAT66'd like IPv4.
	// Default "" (off): sandboxes have no IPv6 at all.
	Subnet6 string
	// NetworkSpares is how many sandbox networks (namespace, veth pair,
	// address) the native (oci) backend keeps made ahead, so that a create
	// only takes one. Default 4; 0 makes each in its create.
	NetworkSpares int
	// MaxTimeout caps sandbox timeouts (0 = no cap).
	MaxTimeout time.Duration
	// LogLevel is debug, info, warn or error. Default info.
	LogLevel string
	// IngressListen, if set, serves the ingress gateway there (routes by
	// OpenSandbox-Ingress-To header, <port>-<id>.<IngressDomain> host, or
	// /<id>/<port>/ path) and enables secureAccess sandboxes.
	IngressListen string
	// IngressDomain is the base domain of host routes (optional).
	IngressDomain string
	// E2BDomain is the sandbox domain the E2B API returns with every
	// sandbox (the SDKs reach envd at 49983-<id>.<domain>). Default "":
	// none, the SDKs use their own E2B_DOMAIN or sandboxUrl.
	E2BDomain string
	// TLSCert and TLSKey are PEM files of the certificate (a wildcard
	// *.<E2BDomain> one for E2B's domain mode) and key the API listener
	// serves TLS with, HTTP/2 by ALPN. Both or neither; reloaded when they
	// change. Default "": plain HTTP.
	TLSCert, TLSKey string
	// TLSListen, if set with TLSCert, serves TLS on this address and
	// keeps Listen plain HTTP (e.g. plain on loopback for the CLI, TLS on
	// :443). Default "": Listen itself is TLS.
	TLSListen string
	// IngressRouteMode, if set (wildcard, uri or header), makes the
	// endpoints API answer gateway addresses in upstream's shapes (see
	// ingress.Endpoints). Default "": the sandboxes' own addresses.
	IngressRouteMode string
	// IngressAddress is the gateway as clients reach it (host[:port]).
	// Default: <IngressDomain>:<port> (wildcard), else the public address's
	// host, the listen address, or the API request's host, with the
	// ingress listen port.
	IngressAddress string
	// IngressSecureAccessKeys are the OSEP-0011 route-signing secrets,
	// "a=BASE64,b=BASE64" (default $MOAT_INGRESS_SECURE_ACCESS_KEYS);
	// they enable signed routes and signed endpoints (?expires=).
	IngressSecureAccessKeys string
	// IngressActiveKey is the key id new signatures use (default: the
	// first key listed).
	IngressActiveKey string
	// DNSUpstreams are the resolvers ("host:port") the sandbox DNS proxy
	// forwards allowed names to. Default: the nameservers of /etc/resolv.conf.
	DNSUpstreams []string
	// AllowedRegistries restricts image pulls to matching registries
	// (image.WithAllowedRegistries patterns: host[:port], *.domain,
	// loopback). Empty allows any registry.
	AllowedRegistries []string
	// AuditLog is the audit log file (one JSON line per mutating API call,
	// rotated at 64 MiB, 5 kept). Default <Root>/audit.log; "off" disables.
	AuditLog string
	// AuditTrail is the directory of the sandboxes' audit trails (GET
	// /sandboxes/{id}/audit). Default <Root>/audit; "off" disables.
	AuditTrail string
	// AuditRetention is how long a deleted sandbox's trail is kept
	// (default 7 days).
	AuditRetention time.Duration
	// AuditTrailMax bounds one sandbox's trail, AuditTrailTotal all of
	// them ("2Mi", "512Mi" by default).
	AuditTrailMax, AuditTrailTotal string
	// AllowedHostPaths are the host directories host volumes may mount
	// (prefix match after cleaning and symlink resolution). Default none:
	// every host volume is refused with VOLUME::HOST_PATH_NOT_ALLOWED.
	AllowedHostPaths []string
	// Console serves the web console under /console on Listen. Default true.
	Console bool
	// ConsoleSecureCookie marks the console's session cookie Secure on
	// plain-HTTP requests too (a TLS-terminating proxy in front of moat).
	// Default false; requests over TLS always get a Secure cookie.
	ConsoleSecureCookie bool
	// AgentPath is the in-sandbox agent (a static cmd/moat-agent build)
	// the oci and docker runtimes mount into sandboxes. Default "": the
	// agent this moat carries, written once under <Root>/agent.
	AgentPath string
	// DiskQuota is the default writable-layer size of native sandboxes, a
	// Kubernetes quantity ("10Gi"); resourceLimits.disk overrides it.
	// Default "" (unlimited).
	DiskQuota string
	// ImageDiskBudget caps the image store (uncompressed layer bytes, a
	// Kubernetes quantity such as "20Gi"): once a minute the server prunes
	// images no sandbox or snapshot uses, least recently used first, until
	// the store fits. Default "" (no automatic pruning; `moat image prune`).
	ImageDiskBudget string
	// VolumeSize is the capacity of a native named volume (pvc) created
	// without pvc.storage, a Kubernetes quantity. Default "1Gi".
	VolumeSize string
	// VaultKeyFile holds the key (64 hex digits) that seals Credential
	// Vault state and sandbox CA keys in the store. Default
	// <Root>/vault.key, created on first start; $MOAT_VAULT_KEY overrides
	// the file.
	VaultKeyFile string
	// VaultKey is the key itself (from $MOAT_VAULT_KEY, never argv).
	VaultKey string
	// VaultUpstreamCAFile adds PEM CA certificates to the host's roots
	// when the credential proxy verifies upstream servers (e.g. a private
	// API's CA). Default "": the host's roots only.
	VaultUpstreamCAFile string
	// VaultInsecureWrites allows Credential Vault writes (they carry
	// credential values) over plain HTTP from non-loopback clients.
	// Default false: TLS or loopback, as upstream.
	VaultInsecureWrites bool
}

// agentBinary returns the agent binary for the runtimes: AgentPath, or the
// agent moat carries, installed under Root (agentbin.ErrMissing if this
// moat was built without it).
func (c *Config) agentBinary() (string, error) {
	if c.AgentPath != "" {
		return c.AgentPath, nil
	}
	p, err := agentbin.Install(filepath.Join(c.Root, "agent"))
	if err != nil {
		return "", fmt.Errorf("in-sandbox agent: %w", err)
	}
	return p, nil
}

// diskQuotaBytes is DiskQuota in bytes (0 = unlimited).
func (c *Config) diskQuotaBytes() (int64, error) {
	if c.DiskQuota == "" || c.DiskQuota == "0" {
		return 0, nil
	}
	r, err := lifecycle.ParseResources(map[string]string{"disk": c.DiskQuota})
	return r.DiskBytes, err
}

// imageBudgetBytes is ImageDiskBudget in bytes (0 = no automatic GC).
func (c *Config) imageBudgetBytes() (int64, error) {
	if c.ImageDiskBudget == "" || c.ImageDiskBudget == "0" {
		return 0, nil
	}
	r, err := lifecycle.ParseResources(map[string]string{"disk": c.ImageDiskBudget})
	return r.DiskBytes, err
}

// volumeSizeBytes is VolumeSize in bytes (0 = the backend default).
func (c *Config) volumeSizeBytes() (int64, error) {
	if c.VolumeSize == "" {
		return 0, nil
	}
	r, err := lifecycle.ParseResources(map[string]string{"disk": c.VolumeSize})
	if err == nil && (r.DiskBytes < volume.MinQuotaBytes || r.DiskBytes > volume.MaxQuotaBytes) {
		err = fmt.Errorf("%s is out of range (16Mi to 16Ti)", c.VolumeSize)
	}
	return r.DiskBytes, err
}

// Default returns the default configuration.
func Default() Config {
	return Config{
		Listen:        ":8080",
		Root:          "/var/lib/moat",
		RunRoot:       "/run/moat",
		CgroupParent:  "/moat",
		Runtime:       "oci",
		RuntimeClass:  "runc",
		Bridge:        "moat0",
		Subnet:        "10.88.0.0/16",
		NetworkSpares: 4,
		LogLevel:      "info",
		Console:       true,
	}
}

// Validate checks the configuration and fills derived defaults.
func (c *Config) Validate() error {
	var errs []error
	errs = append(errs, c.validateHost()...)
	errs = append(errs, c.validateNetwork()...)
	errs = append(errs, c.validateSettings()...)
	errs = append(errs, c.validateIngress()...)
	errs = append(errs, c.validateTLS()...)
	errs = append(errs, c.validateFiles()...)
	errs = append(errs, c.validateTenants()...)
	return errors.Join(errs...)
}

// validateTenants reads the tenants file.
func (c *Config) validateTenants() []error {
	if c.TenantsFile == "" {
		return nil
	}
	if c.NoAuth {
		return []error{errors.New("tenants-file needs API-key authentication (not --insecure-no-auth)")}
	}
	fts, err := tenant.LoadTenantsFile(c.TenantsFile)
	if err != nil {
		return []error{err}
	}
	c.fileTenants = fts
	return nil
}

// validateTLS checks the TLS options: both files, and a TLS listen
// address only with them.
func (c *Config) validateTLS() []error {
	var errs []error
	if (c.TLSCert == "") != (c.TLSKey == "") {
		errs = append(errs, errors.New("tls-cert and tls-key go together"))
	}
	if c.TLSListen != "" {
		if c.TLSCert == "" {
			errs = append(errs, errors.New("tls-listen needs --tls-cert and --tls-key"))
		}
		if _, _, err := net.SplitHostPort(c.TLSListen); err != nil {
			errs = append(errs, fmt.Errorf("tls-listen %q: want host:port or :port", c.TLSListen))
		}
	}
	return errs
}

// validateHost checks where the server listens and keeps its state, and
// which runtime it runs.
func (c *Config) validateHost() []error {
	var errs []error
	if c.Listen == "" {
		errs = append(errs, errors.New("listen address is empty"))
	}
	if !filepath.IsAbs(c.Root) {
		errs = append(errs, fmt.Errorf("root %q must be an absolute path", c.Root))
	}
	if !filepath.IsAbs(c.RunRoot) {
		errs = append(errs, fmt.Errorf("run-root %q must be an absolute path", c.RunRoot))
	}
	if cg := filepath.Clean(c.CgroupParent); !filepath.IsAbs(c.CgroupParent) || cg != c.CgroupParent || cg == "/" {
		errs = append(errs, fmt.Errorf("cgroup-parent %q must be a clean absolute path below /", c.CgroupParent))
	}
	if !slices.Contains(Backends(), c.Runtime) {
		errs = append(errs, fmt.Errorf("runtime %q: want one of %s", c.Runtime, strings.Join(Backends(), ", ")))
	}
	if classes := RuntimeClasses(); c.Runtime == "oci" && !slices.Contains(classes, c.RuntimeClass) {
		errs = append(errs, fmt.Errorf("runtime-class %q: want one of %s", c.RuntimeClass, strings.Join(classes, ", ")))
	}
	return errs
}

// validateNetwork checks the sandbox network's subnets and bridge.
func (c *Config) validateNetwork() []error {
	var errs []error
	if p, err := netip.ParsePrefix(c.Subnet); err != nil || !p.Addr().Is4() || p.Bits() > 28 || p.Bits() < 8 {
		errs = append(errs, fmt.Errorf("subnet %q: want an IPv4 prefix between /8 and /28", c.Subnet))
	}
	if c.Subnet6 != "" {
		if p, err := netip.ParsePrefix(c.Subnet6); err != nil || !p.Addr().Is6() || p.Addr().Is4In6() || p.Bits() < 48 || p.Bits() > 112 {
			errs = append(errs, fmt.Errorf("subnet6 %q: want an IPv6 prefix between /48 and /112", c.Subnet6))
		}
	}
	if c.Bridge == "" || len(c.Bridge) > 15 {
		errs = append(errs, fmt.Errorf("bridge %q: want 1-15 characters", c.Bridge))
	}
	return errs
}

// validateSettings checks the limits, the log level, the DNS upstreams
// and the allow lists.
func (c *Config) validateSettings() []error {
	var errs []error
	if c.MaxTimeout < 0 {
		errs = append(errs, errors.New("max-timeout must not be negative"))
	}
	switch c.LogLevel {
	case "debug", "info", "warn", "error":
	default:
		errs = append(errs, fmt.Errorf("log-level %q: want debug, info, warn or error", c.LogLevel))
	}
	for _, u := range c.DNSUpstreams {
		if _, err := netip.ParseAddrPort(u); err != nil {
			errs = append(errs, fmt.Errorf("dns-upstream %q: want ip:port", u))
		}
	}
	for _, p := range c.AllowedHostPaths {
		if !filepath.IsAbs(p) {
			errs = append(errs, fmt.Errorf("allow-host-path %q must be an absolute path", p))
		}
	}
	if _, err := c.diskQuotaBytes(); err != nil {
		errs = append(errs, fmt.Errorf("disk-quota: %v", err))
	}
	if _, err := c.volumeSizeBytes(); err != nil {
		errs = append(errs, fmt.Errorf("volume-size: %v", err))
	}
	if _, err := c.imageBudgetBytes(); err != nil {
		errs = append(errs, fmt.Errorf("image-disk-budget: %v", err))
	}
	for _, p := range c.AllowedRegistries {
		if err := image.ValidRegistryPattern(p); err != nil {
			errs = append(errs, fmt.Errorf("allow-registry: %v", err))
		}
	}
	return errs
}

// validateFiles fills the default paths of the key, vault and audit
// files under Root and checks the ones given.
func (c *Config) validateFiles() []error {
	var errs []error
	if c.APIKeyFile == "" {
		c.APIKeyFile = filepath.Join(c.Root, "api-key")
	}
	if c.KeySecretFile == "" {
		c.KeySecretFile = filepath.Join(c.Root, "key-secret")
	} else if !filepath.IsAbs(c.KeySecretFile) {
		errs = append(errs, fmt.Errorf("key-secret-file %q must be an absolute path", c.KeySecretFile))
	}
	if c.VaultKeyFile == "" {
		c.VaultKeyFile = filepath.Join(c.Root, "vault.key")
	}
	if c.VaultUpstreamCAFile != "" && !filepath.IsAbs(c.VaultUpstreamCAFile) {
		errs = append(errs, fmt.Errorf("vault-upstream-ca %q must be an absolute path", c.VaultUpstreamCAFile))
	}
	if c.AuditLog == "" {
		c.AuditLog = filepath.Join(c.Root, "audit.log")
	} else if c.AuditLog != "off" && !filepath.IsAbs(c.AuditLog) {
		errs = append(errs, fmt.Errorf("audit-log %q must be an absolute path or \"off\"", c.AuditLog))
	}
	if c.AuditTrail == "" {
		c.AuditTrail = filepath.Join(c.Root, "audit")
	} else if c.AuditTrail != "off" && !filepath.IsAbs(c.AuditTrail) {
		errs = append(errs, fmt.Errorf("audit-trail %q must be an absolute path or \"off\"", c.AuditTrail))
	}
	if c.AuditRetention < 0 {
		errs = append(errs, fmt.Errorf("audit-retention %s must not be negative", c.AuditRetention))
	}
	for _, f := range []struct{ name, v string }{{"audit-trail-max", c.AuditTrailMax}, {"audit-trail-total", c.AuditTrailTotal}} {
		if _, err := optionalSize(f.v); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", f.name, err))
		}
	}
	return errs
}

// resolveAPIKey returns the API key to enforce ("" when auth is off). A
// missing key file is created with a random key (mode 0600).
func (c *Config) resolveAPIKey() (key string, generated bool, err error) {
	if c.NoAuth {
		return "", false, nil
	}
	if c.APIKey != "" {
		return c.APIKey, false, nil
	}
	b, err := os.ReadFile(c.APIKeyFile)
	if err == nil {
		k := strings.TrimSpace(string(b))
		if k == "" {
			return "", false, fmt.Errorf("api key file %s is empty", c.APIKeyFile)
		}
		return k, false, nil
	}
	if !os.IsNotExist(err) {
		return "", false, err
	}
	var r [24]byte
	rand.Read(r[:])
	k := hex.EncodeToString(r[:])
	if err := os.MkdirAll(filepath.Dir(c.APIKeyFile), 0o700); err != nil {
		return "", false, err
	}
	if err := os.WriteFile(c.APIKeyFile, []byte(k+"\n"), 0o600); err != nil {
		return "", false, err
	}
	return k, true, nil
}

// loadKeySecret reads the key secret file, creating it with
// tenant.SecretLen random bytes (hex) if it does not exist.
func (c *Config) loadKeySecret() ([]byte, error) {
	return loadOrCreateSecret(c.KeySecretFile, tenant.SecretLen)
}

// loadOrCreateSecret reads the secret (hex, at least 16 bytes) in file
// path, creating the file (mode 0600) with n random bytes if it does not
// exist.
func loadOrCreateSecret(path string, n int) ([]byte, error) {
	b, err := os.ReadFile(path)
	if err == nil {
		sec, derr := hex.DecodeString(strings.TrimSpace(string(b)))
		if derr != nil || len(sec) < 16 {
			return nil, fmt.Errorf("secret file %s: want at least 16 hex-encoded bytes", path)
		}
		return sec, nil
	}
	if !os.IsNotExist(err) {
		return nil, err
	}
	sec := make([]byte, n)
	rand.Read(sec)
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, err
	}
	// O_EXCL: two servers racing on a fresh root cannot end up with
	// different secrets.
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		if os.IsExist(err) {
			return loadOrCreateSecret(path, n)
		}
		return nil, err
	}
	if _, err := f.WriteString(hex.EncodeToString(sec) + "\n"); err != nil {
		f.Close()
		return nil, err
	}
	if err := f.Close(); err != nil {
		return nil, err
	}
	return sec, nil
}

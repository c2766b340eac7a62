package cli

import (
	"os"
	"strings"

	"github.com/spf13/cobra"

	"github.com/moat-sandbox/moat/internal/server"
)

func newServeCommand() *cobra.Command {
	cfg := server.Default()
	cmd := &cobra.Command{
		Use:   "serve",
		Short: "Run the lifecycle API server (OpenSandbox Lifecycle API)",
		Long: `Run the moat lifecycle server.

The API key is taken from --api-key, else $MOAT_API_KEY, else the file
--api-key-file (default <root>/api-key), which is created with a random key
on first start. Clients send it in the OPEN-SANDBOX-API-KEY header. It is
the admin of tenant "default"; more keys, each of one tenant with a role
(admin, operator, viewer), are made with "moat key create".`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if cfg.APIKey == "" {
				cfg.APIKey = os.Getenv("MOAT_API_KEY")
			}
			cfg.VaultKey = os.Getenv("MOAT_VAULT_KEY")
			if err := cfg.Validate(); err != nil {
				return err
			}
			return server.Run(cmd.Context(), cfg, nil)
		},
	}
	f := cmd.Flags()
	hostFlags(cmd, &cfg)
	f.StringVar(&cfg.Listen, "listen", cfg.Listen, "API listen address")
	f.StringVar(&cfg.RunRoot, "run-root", cfg.RunRoot, "runtime state directory (tmpfs)")
	f.StringVar(&cfg.Kubernetes.Namespace, "k8s-namespace", "default", "namespace of the sandboxes for --runtime kubernetes")
	f.BoolVar(&cfg.Kubernetes.TenantNamespaces, "k8s-tenant-namespaces", false, "with --runtime kubernetes, put each tenant's sandboxes, pods, secrets and volumes in its own namespace (<k8s-tenant-namespace-prefix>-<tenant>, or the one --tenants-file names; it must exist), with a ResourceQuota and NetworkPolicy")
	f.StringVar(&cfg.Kubernetes.TenantNamespacePrefix, "k8s-tenant-namespace-prefix", "", "prefix of tenant namespaces (default: --k8s-namespace)")
	f.StringSliceVar(&cfg.Kubernetes.IngressNamespaces, "k8s-tenant-ingress-namespace", nil, "namespaces whose pods may reach sandbox pods in tenant namespaces (repeatable; default: --k8s-namespace and the server's own)")
	f.StringVar(&cfg.TenantsFile, "tenants-file", "", "OpenSandbox multi-tenant configuration (tenants.toml: [[tenants]] name, namespace, api_keys): its tenants and keys, reread every 5s; on --runtime kubernetes it turns on tenant namespaces")
	f.StringVar(&cfg.Kubernetes.Pool, "k8s-pool", "", "Pool to claim sandboxes from for --runtime kubernetes (optional)")
	f.StringVar(&cfg.Kubernetes.AgentImage, "k8s-agent-image", "", "image holding /moat for the agent init container (default: the controller's)")
	f.Float32Var(&cfg.Kubernetes.QPS, "k8s-api-qps", 0, "with --runtime kubernetes, API requests per second of the server's clients (client-side rate limit; default 200, as moat controller)")
	f.IntVar(&cfg.Kubernetes.Burst, "k8s-api-burst", 0, "with --runtime kubernetes, API request burst of the server's clients (default 400)")
	f.DurationVar(&cfg.Kubernetes.OrphanGrace, "k8s-orphan-grace", 0, "with --runtime kubernetes, how old a sandbox without a record (its replica died while creating it) must be before the leading replica deletes it (default 10m; must exceed the longest create)")
	f.StringVar(&cfg.AgentPath, "agent-path", "", "in-sandbox agent binary for the oci and docker runtimes (a static cmd/moat-agent build; default: the one moat carries)")
	f.Float64Var(&cfg.Kubernetes.RequestFraction, "k8s-request-fraction", 0, "share of a sandbox's cpu/memory limits its pod requests, in (0,1] (default: requests = limits)")
	f.StringVar(&cfg.APIKey, "api-key", "", "API key (prefer $MOAT_API_KEY or --api-key-file: argv is visible to other users)")
	f.StringVar(&cfg.APIKeyFile, "api-key-file", "", "file holding the API key (default <root>/api-key)")
	f.BoolVar(&cfg.NoAuth, "insecure-no-auth", false, "disable API-key authentication")
	f.StringVar(&cfg.KeySecretFile, "key-secret-file", "", "file holding the secret that API keys made by moat key create are hashed with (default <root>/key-secret, created on first start)")
	f.StringVar(&cfg.PublicAddress, "public-address", "", "host[:port] clients use to reach this server (for server-proxy endpoints)")
	f.StringVar(&cfg.Bridge, "bridge", cfg.Bridge, "sandbox bridge interface name")
	f.StringVar(&cfg.Subnet, "subnet", cfg.Subnet, "sandbox IPv4 subnet")
	f.IntVar(&cfg.NetworkSpares, "network-spares", cfg.NetworkSpares, "sandbox networks (namespace, veth pair, address) the native backend keeps made ahead so a create only takes one (0: none)")
	f.StringVar(&cfg.Subnet6, "subnet6", "", "sandbox IPv6 prefix, e.g. a ULA fd00:6d6f:6174::/64 (default: no IPv6 in sandboxes)")
	f.DurationVar(&cfg.MaxTimeout, "max-timeout", 0, "maximum sandbox timeout (0 = no cap)")
	f.StringVar(&cfg.IngressListen, "ingress-listen", "", "serve the ingress gateway on this address (e.g. :28888); enables secureAccess")
	f.StringVar(&cfg.IngressDomain, "ingress-domain", "", "base domain for ingress host routes (<port>-<id>.<domain>)")
	f.StringVar(&cfg.E2BDomain, "e2b-domain", "", "sandbox domain the E2B API returns (SDKs reach envd at 49983-<id>.<domain>; see docs/E2B.md)")
	f.StringVar(&cfg.TLSCert, "tls-cert", "", "PEM certificate the API listener serves TLS with (HTTP/2 by ALPN; a wildcard *.<e2b-domain> one for E2B's domain mode; reloaded when it changes)")
	f.StringVar(&cfg.TLSKey, "tls-key", "", "PEM private key of --tls-cert")
	f.StringVar(&cfg.TLSListen, "tls-listen", "", "serve TLS on this address and keep --listen plain HTTP (default: --listen is TLS when --tls-cert is set)")
	f.StringVar(&cfg.IngressRouteMode, "ingress-route-mode", "", "endpoints API answers gateway addresses: wildcard (<id>-<port>.<domain>), uri (<gateway>/<id>/<port>) or header (OpenSandbox-Ingress-To); default: sandbox addresses")
	f.StringVar(&cfg.IngressAddress, "ingress-address", "", "host[:port] clients reach the ingress gateway at (default: derived from --ingress-domain, --public-address or --ingress-listen)")
	f.StringVar(&cfg.IngressSecureAccessKeys, "ingress-secure-access-keys", "", "OSEP-0011 signed-route keys \"a=BASE64,b=BASE64\" (prefer $"+"MOAT_INGRESS_SECURE_ACCESS_KEYS: argv is visible)")
	f.StringVar(&cfg.IngressActiveKey, "ingress-active-key", "", "key id that signs new routes (default: the first key)")
	f.StringArrayVar(&cfg.AllowedHostPaths, "allow-host-path", nil, "allow host volumes under this directory (prefix match after symlink resolution), repeatable (default: none)")
	f.StringVar(&cfg.VolumeSize, "volume-size", "", `capacity of a native named volume (pvc) created without pvc.storage, e.g. "10Gi" (default 1Gi)`)
	f.StringVar(&cfg.ImageDiskBudget, "image-disk-budget", "", `prune unused images (least recently used first) once a minute while the image store exceeds this size, e.g. "20Gi" (default: no automatic pruning)`)
	f.StringArrayVar(&cfg.AllowedRegistries, "allow-registry", nil, "only pull images from registries matching this pattern (host[:port], *.domain or loopback), repeatable (default: any)")
	f.StringSliceVar(&cfg.DNSUpstreams, "dns-upstream", nil, "resolver (ip:port) for sandbox DNS, repeatable (default: /etc/resolv.conf)")
	f.BoolVar(&cfg.Console, "console", cfg.Console, "serve the web console under /console")
	f.BoolVar(&cfg.ConsoleSecureCookie, "console-secure-cookie", false, "mark the console session cookie Secure even over plain HTTP (TLS terminated by a proxy in front)")
	f.StringVar(&cfg.LogLevel, "log-level", cfg.LogLevel, "log level: debug, info, warn, error")
	f.StringVar(&cfg.AuditLog, "audit-log", "", `audit log file: one JSON line per mutating API call, rotated at 64 MiB (default <root>/audit.log; "off" disables)`)
	f.StringVar(&cfg.AuditTrail, "audit-trail", "", `directory of the sandboxes' audit trails (GET /v1/sandboxes/{id}/audit; default <root>/audit; "off" disables)`)
	f.DurationVar(&cfg.AuditRetention, "audit-retention", 0, "how long a deleted sandbox's audit trail is kept (default 168h)")
	f.StringVar(&cfg.AuditTrailMax, "audit-trail-max", "", `bound of one sandbox's audit trail, oldest records dropped first (default "2Mi")`)
	f.StringVar(&cfg.AuditTrailTotal, "audit-trail-total", "", `bound of all audit trails together; deleted sandboxes' trails go first (default "512Mi")`)
	f.StringVar(&cfg.VaultKeyFile, "vault-key-file", "", "key sealing Credential Vault state in the store, created on first start (default <root>/vault.key; $MOAT_VAULT_KEY overrides)")
	f.StringVar(&cfg.VaultUpstreamCAFile, "vault-upstream-ca", "", "PEM CA certificates the credential proxy trusts for upstream servers, besides the host's roots")
	f.BoolVar(&cfg.VaultInsecureWrites, "vault-insecure-writes", false, "allow Credential Vault writes over plain HTTP from non-loopback clients")
	return cmd
}

// hostFlags binds the flags of `moat serve` that decide what the host
// must have, which `moat doctor` takes too.
func hostFlags(cmd *cobra.Command, cfg *server.Config) {
	f := cmd.Flags()
	f.StringVar(&cfg.Root, "root", cfg.Root, "state directory")
	f.StringVar(&cfg.CgroupParent, "cgroup-parent", cfg.CgroupParent, "cgroup that native sandboxes are created under (<parent>/<id>)")
	f.StringVar(&cfg.Runtime, "runtime", cfg.Runtime, "sandbox backend: "+strings.Join(server.Backends(), ", "))
	f.StringVar(&cfg.Kubernetes.Kubeconfig, "kubeconfig", "", "kubeconfig for --runtime kubernetes (default $KUBECONFIG, ~/.kube/config, or in-cluster)")
	f.StringVar(&cfg.DockerHost, "docker-host", "", "Docker Engine address for --runtime docker (default unix:///var/run/docker.sock)")
	f.StringVar(&cfg.RuntimeClass, "runtime-class", cfg.RuntimeClass, "default OCI runtime of the oci backend: "+strings.Join(server.RuntimeClasses(), ", "))
	f.StringVar(&cfg.DiskQuota, "disk-quota", "", `default writable-layer quota of native sandboxes, e.g. "10Gi" (resourceLimits.disk overrides; default unlimited)`)
}

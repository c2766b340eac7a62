package lifecycle

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"math"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/moat-sandbox/moat/internal/egress/policy"
	"github.com/moat-sandbox/moat/internal/errdefs"
	"github.com/moat-sandbox/moat/internal/image"
	"github.com/moat-sandbox/moat/internal/runtime"
)

// Status is the observable status of a sandbox.
type Status struct {
	State            State     `json:"state"`
	Reason           string    `json:"reason,omitempty"`
	Message          string    `json:"message,omitempty"`
	LastTransitionAt time.Time `json:"lastTransitionAt"`
}

// Platform is the requested OS/arch.
type Platform struct {
	OS   string `json:"os"`
	Arch string `json:"arch"`
}

// Sandbox is the lifecycle record of one sandbox. It is persisted in the
// store (bucket "sandboxes") once the sandbox is Running; see Service.
type Sandbox struct {
	ID             string            `json:"id"`
	Image          string            `json:"image,omitempty"`
	SnapshotID     string            `json:"snapshotId,omitempty"`
	Entrypoint     []string          `json:"entrypoint"`
	Env            map[string]string `json:"env,omitempty"`
	Metadata       map[string]string `json:"metadata"`
	ResourceLimits map[string]string `json:"resourceLimits,omitempty"`
	Resources      runtime.Resources `json:"resources"`
	Extensions     map[string]string `json:"extensions,omitempty"`
	Platform       *Platform         `json:"platform,omitempty"`
	Class          string            `json:"class,omitempty"`
	Status         Status            `json:"status"`
	CreatedAt      time.Time         `json:"createdAt"`
	// ExpiresAt is nil for manual-cleanup sandboxes (no timeout).
	ExpiresAt *time.Time `json:"expiresAt,omitempty"`
	// AgentToken is the execd access token of this sandbox.
	AgentToken string `json:"agentToken,omitempty"`
	// RenewOnAccess is the extension access.renew.extend.seconds (0 = off).
	RenewOnAccess int `json:"renewOnAccess,omitempty"`
	// Pool is the warm pool the sandbox came from (or is waiting in).
	Pool string `json:"pool,omitempty"`
	// PoolRevision is the pool template revision it was created from.
	PoolRevision int `json:"poolRevision,omitempty"`
	// NetworkPolicy is the egress policy enforced on the sandbox (nil: none,
	// all egress allowed). Live changes through the egress API are saved here.
	NetworkPolicy *policy.NetworkPolicy `json:"networkPolicy,omitempty"`
	// AccessToken is the secureAccess token the ingress gateway requires
	// (OpenSandbox-Secure-Access), "" when secureAccess is off.
	AccessToken string `json:"accessToken,omitempty"`
	// EgressToken authenticates the sandbox's egress API (OPENSANDBOX-EGRESS-AUTH).
	EgressToken string `json:"egressToken,omitempty"`
	// CredentialProxy is set for sandboxes created with credentialProxy
	// enabled (the Credential Vault).
	CredentialProxy *CredentialProxyRecord `json:"credentialProxy,omitempty"`
	// Warm marks an idle pool sandbox, not yet claimed: it is invisible to
	// the Lifecycle API.
	Warm bool `json:"warm,omitempty"`
	// Mounts are the host volumes, validated against the allow-list, and
	// the named volumes (Mount.Volume).
	Mounts []runtime.Mount `json:"mounts,omitempty"`
	// Tenant owns the sandbox ("" in records from before tenants: the
	// default tenant). See tenancy.go.
	Tenant string `json:"tenant,omitempty"`
	// Claims are the named volumes (pvc) the sandbox mounts.
	Claims []Claim `json:"claims,omitempty"`
}

// clone returns a deep copy safe to hand out of the service.
func (s *Sandbox) clone() Sandbox {
	c := *s
	c.Entrypoint = append([]string(nil), s.Entrypoint...)
	c.Env = cloneMap(s.Env)
	c.Metadata = cloneMap(s.Metadata)
	if c.Metadata == nil {
		c.Metadata = map[string]string{}
	}
	c.ResourceLimits = cloneMap(s.ResourceLimits)
	c.Extensions = cloneMap(s.Extensions)
	c.Mounts = append([]runtime.Mount(nil), s.Mounts...)
	c.Claims = append([]Claim(nil), s.Claims...)
	if s.Platform != nil {
		p := *s.Platform
		c.Platform = &p
	}
	if s.ExpiresAt != nil {
		e := *s.ExpiresAt
		c.ExpiresAt = &e
	}
	if s.NetworkPolicy != nil {
		p := *s.NetworkPolicy
		p.Egress = append([]policy.Rule(nil), p.Egress...)
		c.NetworkPolicy = &p
	}
	return c
}

func cloneMap(m map[string]string) map[string]string {
	if m == nil {
		return nil
	}
	c := make(map[string]string, len(m))
	for k, v := range m {
		c[k] = v
	}
	return c
}

// CreateRequest is a validated-on-Create request for a new sandbox.
type CreateRequest struct {
	Image          string
	ImageAuth      *image.Auth
	SnapshotID     string
	Entrypoint     []string
	Env            map[string]string
	Metadata       map[string]string
	ResourceLimits map[string]string
	// Timeout is the lifetime; 0 means manual cleanup (no expiry).
	Timeout time.Duration
	// ShortTimeout admits a Timeout under OpenSandbox's 60-second
	// minimum (E2B's API has none: its SDK tests use 5 seconds).
	ShortTimeout bool
	Extensions   map[string]string
	Platform     *Platform
	// NetworkPolicy is the raw OpenSandbox networkPolicy JSON, if any.
	NetworkPolicy []byte
	// CredentialProxy is credentialProxy.enabled: intercept the sandbox's
	// HTTP(S) for the Credential Vault (requires NetworkPolicy).
	CredentialProxy bool
	SecureAccess    bool
	HasVolumes      bool
	// Volumes are the parsed OpenSandbox volumes (see ParseVolumes).
	Volumes []Volume
	// IDEnv, if set, names an env variable that carries the sandbox's own
	// id (E2B's E2B_SANDBOX_ID): in the env it starts with, or, for a
	// sandbox claimed from a pool, in the env its claim applies.
	IDEnv string
}

// withIDEnv returns env with variable name set to id (a copy; env itself
// when name is empty).
func withIDEnv(env map[string]string, name, id string) map[string]string {
	if name == "" {
		return env
	}
	c := make(map[string]string, len(env)+1)
	for k, v := range env {
		c[k] = v
	}
	c[name] = id
	return c
}

// Extension keys understood by moat.
const (
	// ExtRuntimeClass selects the OCI runtime binary per sandbox (runc, crun, runsc).
	ExtRuntimeClass = "moat.runtime"
	// ExtRenewOnAccess is OSEP-0009 renew-on-access (seconds, 300..86400).
	ExtRenewOnAccess = "access.renew.extend.seconds"
	// ExtPoolRef is the OpenSandbox pool reference.
	ExtPoolRef = "poolRef"
	// ExtIdlePrefix starts the keys of the idle policy (the idle feature,
	// internal/lifecycle/idle, reads them).
	ExtIdlePrefix = "moat.idle."
	// ExtTemplate records the template a sandbox was made from
	// (internal/lifecycle/template; E2B's templateID).
	ExtTemplate = "moat.template"
)

const codeInvalid = "SANDBOX::INVALID_PARAMETER"

// ParseResources converts OpenSandbox resourceLimits (Kubernetes quantity
// strings) into runtime limits. Known keys: cpu, memory, pids, disk
// (alias ephemeral-storage), gpu (only "0" accepted: no GPUs here).
func ParseResources(m map[string]string) (runtime.Resources, error) {
	var r runtime.Resources
	for k, v := range m {
		switch k {
		case "cpu":
			c, err := parseCPU(v)
			if err != nil {
				return r, err
			}
			r.CPUMillis = c
		case "memory":
			b, err := ParseBytes("resourceLimits."+k, v)
			if err != nil {
				return r, err
			}
			r.MemoryBytes = b
		case "disk", "ephemeral-storage":
			b, err := ParseBytes("resourceLimits."+k, v)
			if err != nil {
				return r, err
			}
			r.DiskBytes = b
		case "pids":
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil || n < 1 {
				return r, errdefs.Invalid(codeInvalid, fmt.Sprintf("resourceLimits.pids: %q is not a positive integer", v))
			}
			r.PidsLimit = n
		case "gpu", "nvidia.com/gpu":
			if n, err := strconv.Atoi(v); err != nil || n != 0 {
				return r, errdefs.Invalid(codeInvalid, "resourceLimits.gpu: GPUs are not available on this server")
			}
		default:
			return r, errdefs.Invalid(codeInvalid, fmt.Sprintf("resourceLimits: unknown resource %q (known: cpu, memory, pids, disk, gpu)", k))
		}
	}
	return r, nil
}

func parseCPU(v string) (int64, error) {
	bad := errdefs.Invalid(codeInvalid, fmt.Sprintf("resourceLimits.cpu: %q is not a CPU quantity (e.g. \"500m\", \"1\", \"0.5\")", v))
	if strings.HasSuffix(v, "m") {
		n, err := strconv.ParseInt(strings.TrimSuffix(v, "m"), 10, 64)
		if err != nil || n < 1 || n > 1<<20 {
			return 0, bad
		}
		return n, nil
	}
	f, err := strconv.ParseFloat(v, 64)
	if err != nil || f <= 0 || f > 1024 || math.IsNaN(f) {
		return 0, bad
	}
	m := int64(math.Round(f * 1000))
	if m < 1 {
		return 0, bad
	}
	return m, nil
}

var byteSuffixes = []struct {
	s string
	m int64
}{
	{"Ki", 1 << 10}, {"Mi", 1 << 20}, {"Gi", 1 << 30}, {"Ti", 1 << 40},
	{"k", 1000}, {"K", 1000}, {"M", 1000 * 1000}, {"G", 1000 * 1000 * 1000}, {"T", 1000 * 1000 * 1000 * 1000},
}

// ParseBytes parses a size quantity; field names it in the error.
func ParseBytes(field, v string) (int64, error) {
	bad := errdefs.Invalid(codeInvalid, fmt.Sprintf("%s: %q is not a size (e.g. \"512Mi\", \"2Gi\")", field, v))
	mult := int64(1)
	num := v
	for _, s := range byteSuffixes {
		if strings.HasSuffix(v, s.s) {
			mult, num = s.m, strings.TrimSuffix(v, s.s)
			break
		}
	}
	f, err := strconv.ParseFloat(num, 64)
	if err != nil || f <= 0 || math.IsNaN(f) || math.IsInf(f, 0) || f*float64(mult) > float64(1<<50) {
		return 0, bad
	}
	b := int64(f * float64(mult))
	if field == "resourceLimits.memory" && b < runtime.MinMemoryBytes {
		return 0, errdefs.Invalid(codeInvalid, fmt.Sprintf("resourceLimits.memory: %q is below the %dMi minimum", v, runtime.MinMemoryBytes>>20))
	}
	return b, nil
}

var (
	labelNameRe    = regexp.MustCompile(`^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$`)
	dnsSubdomainRe = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`)
)

const codeInvalidLabel = "SANDBOX::INVALID_METADATA_LABEL"

// ValidateMetadata applies Kubernetes label rules to metadata, and rejects
// the reserved opensandbox.io/ and moat.dev/ prefixes.
func ValidateMetadata(m map[string]string) error {
	for k, v := range m {
		if err := validateLabelKey(k); err != nil {
			return err
		}
		if v != "" && (len(v) > 63 || !labelNameRe.MatchString(v)) {
			return errdefs.Invalid(codeInvalidLabel, fmt.Sprintf("metadata %q: value %q must be at most 63 characters of [A-Za-z0-9-_.], starting and ending alphanumeric", k, v))
		}
	}
	return nil
}

func validateLabelKey(k string) error {
	name := k
	if i := strings.LastIndexByte(k, '/'); i >= 0 {
		prefix := k[:i]
		name = k[i+1:]
		if prefix == "" || len(prefix) > 253 || !dnsSubdomainRe.MatchString(prefix) {
			return errdefs.Invalid(codeInvalidLabel, fmt.Sprintf("metadata key %q: prefix must be a DNS subdomain", k))
		}
		if prefix == "opensandbox.io" || strings.HasSuffix(prefix, ".opensandbox.io") || prefix == "moat.dev" || strings.HasSuffix(prefix, ".moat.dev") {
			return errdefs.Invalid(codeInvalidLabel, fmt.Sprintf("metadata key %q: prefix %s/ is reserved", k, prefix))
		}
	}
	if name == "" || len(name) > 63 || !labelNameRe.MatchString(name) {
		return errdefs.Invalid(codeInvalidLabel, fmt.Sprintf("metadata key %q: name must be at most 63 characters of [A-Za-z0-9-_.], starting and ending alphanumeric", k))
	}
	return nil
}

// IDLen is the length of a sandbox (and snapshot) id.
const IDLen = 20

// idAlphabet is the id alphabet: lowercase letters and digits, the
// alphabet of E2B's sandbox ids, so that an id is one DNS label without
// '-' and "<port>-<id>.<domain>" splits at its first dash.
const idAlphabet = "abcdefghijklmnopqrstuvwxyz0123456789"

// NewID returns a random id of IDLen characters of [a-z0-9] (103 bits).
// It is a valid runtime id (runtime.ValidID) and an E2B sandbox id.
func NewID() string {
	var out [IDLen]byte
	var buf [2 * IDLen]byte
	for n := 0; n < IDLen; {
		rand.Read(buf[:])
		for _, b := range buf {
			// 252 = 7*36: rejecting the rest keeps every letter equally likely.
			if b < 252 && n < IDLen {
				out[n] = idAlphabet[b%36]
				n++
			}
		}
	}
	return string(out[:])
}

// NewToken returns a random 32-byte hex secret (an access token).
func NewToken() string {
	var b [32]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// SnapshotImagePrefix names snapshot images in the image store: a
// snapshot's image is the prefix and its ID. The registry host is
// loopback, so a lookup of a vanished snapshot image can never reach out
// of the host.
const SnapshotImagePrefix = image.SnapshotRepo + ":"

// ImageRef is the image the sandbox's root filesystem is built from.
func (s *Sandbox) ImageRef() string {
	if s.SnapshotID != "" {
		return SnapshotImagePrefix + s.SnapshotID
	}
	return s.Image
}

// Clone returns a deep copy of the record.
func (s *Sandbox) Clone() Sandbox { return s.clone() }

// CredentialProxyRecord is the persisted credential proxy of a sandbox
// (the Credential Vault, internal/lifecycle/credvault). Nothing secret is
// stored in the clear: the CA key and the vault are sealed with the
// server's vault key (vault.Sealer), bound to the sandbox.
type CredentialProxyRecord struct {
	// CACert is the sandbox CA certificate (PEM, public). Empty until the
	// sandbox is provisioned.
	CACert []byte `json:"caCert,omitempty"`
	// Sealed is vault.SealState of the vault (if any) and the CA key.
	Sealed []byte `json:"sealed,omitempty"`
}

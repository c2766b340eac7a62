package tenant

import (
	"errors"
	"fmt"
	"os"
	"regexp"

	"github.com/BurntSushi/toml"
)

// FileTenant is one tenant of OpenSandbox's multi-tenant configuration
// (tenants.toml, OpenSandbox's multi-tenancy proposal):
//
//	[[tenants]]
//	name = "team-a"
//	namespace = "opensandbox-a"
//	api_keys = ["key1", "key2"]
//
// role is moat's addition (default operator: what OpenSandbox's keys may
// do, their tenant's sandboxes and pools, without key management).
type FileTenant struct {
	Name      string   `toml:"name"`
	Namespace string   `toml:"namespace"`
	APIKeys   []string `toml:"api_keys"`
	Role      Role     `toml:"role"`
}

// dnsLabel is a namespace name.
var dnsLabel = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$`)

// LoadTenantsFile reads and checks a tenants.toml: every tenant has a
// name (a DNS label, not repeated) and at least one key, no key is given
// twice, a namespace is a DNS label, and a role is not platform (file
// keys act in their own tenant only).
func LoadTenantsFile(path string) ([]FileTenant, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("tenants file: %w", err)
	}
	var doc struct {
		Tenants []FileTenant `toml:"tenants"`
	}
	md, err := toml.Decode(string(b), &doc)
	if err != nil {
		return nil, fmt.Errorf("tenants file %s: %w", path, err)
	}
	if un := md.Undecoded(); len(un) > 0 {
		return nil, fmt.Errorf("tenants file %s: unknown key %s", path, un[0])
	}
	var errs []error
	names, keys := map[string]bool{}, map[string]string{}
	for i := range doc.Tenants {
		t := &doc.Tenants[i]
		switch {
		case ValidName(t.Name) != nil:
			errs = append(errs, fmt.Errorf("tenant %d: name %q must be a DNS label (lower-case letters, digits, '-')", i+1, t.Name))
		case names[t.Name]:
			errs = append(errs, fmt.Errorf("tenant %s is listed twice", t.Name))
		}
		names[t.Name] = true
		if t.Namespace != "" && !dnsLabel.MatchString(t.Namespace) {
			errs = append(errs, fmt.Errorf("tenant %s: namespace %q is not a namespace name", t.Name, t.Namespace))
		}
		if len(t.APIKeys) == 0 {
			errs = append(errs, fmt.Errorf("tenant %s: api_keys must list at least one key", t.Name))
		}
		for _, k := range t.APIKeys {
			if len(k) < 16 {
				errs = append(errs, fmt.Errorf("tenant %s: an API key is shorter than 16 characters", t.Name))
			}
			if other, dup := keys[k]; dup {
				// Never print the key itself.
				errs = append(errs, fmt.Errorf("tenants %s and %s declare the same API key", other, t.Name))
			}
			keys[k] = t.Name
		}
		switch t.Role {
		case "":
			t.Role = RoleOperator
		case RoleAdmin, RoleOperator, RoleViewer:
		default:
			errs = append(errs, fmt.Errorf("tenant %s: role %q must be admin, operator or viewer", t.Name, t.Role))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("tenants file %s: %w", path, err)
	}
	return doc.Tenants, nil
}

// FileKeyIDPrefix starts the key ids of tenants-file keys ("file-" and 16
// hex digits of the key's digest), so audit records name them without
// showing them.
const FileKeyIDPrefix = "file-"

// fileKey is a tenants-file key as the registry holds it.
type fileKey struct {
	id     string
	tenant string
	role   Role
}

// fileKeyID is the key id of tenants-file key digest (hex).
func fileKeyID(digest string) string { return FileKeyIDPrefix + digest[:16] }

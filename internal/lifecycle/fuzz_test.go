package lifecycle

import (
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/moat-sandbox/moat/internal/errdefs"
)

// wantPublicInvalid asserts err is a client error with a code and message.
func wantPublicInvalid(t *testing.T, what string, err error) {
	t.Helper()
	p, ok := errdefs.PublicOf(err)
	if !errdefs.IsInvalidArgument(err) || !ok || p.Code == "" || p.Message == "" {
		t.Fatalf("%s: error %v is not a public invalid-argument error", what, err)
	}
}

// FuzzParseResources checks that ParseResources never panics, rejects with
// a public invalid-argument error, and only accepts values within bounds.
func FuzzParseResources(f *testing.F) {
	for _, s := range [][2]string{
		{"cpu", "500m"}, {"cpu", "1"}, {"cpu", "0.5"}, {"cpu", "1e3"}, {"cpu", "NaN"}, {"cpu", "0.0001"}, {"cpu", "-1m"},
		{"memory", "512Mi"}, {"memory", "2Gi"}, {"memory", "1.5G"}, {"memory", "4Mi"}, {"memory", "1Ki"}, {"memory", "Inf"},
		{"memory", "1e308Ti"}, {"disk", "10Gi"}, {"ephemeral-storage", "1T"}, {"pids", "128"}, {"pids", "0"},
		{"gpu", "0"}, {"nvidia.com/gpu", "1"}, {"bogus", "1"}, {"", ""},
	} {
		f.Add(s[0], s[1], "memory", "1Gi")
	}
	f.Fuzz(func(t *testing.T, k1, v1, k2, v2 string) {
		m := map[string]string{k1: v1, k2: v2}
		r, err := ParseResources(m)
		if err != nil {
			wantPublicInvalid(t, "ParseResources", err)
			return
		}
		for k := range m {
			switch k {
			case "cpu", "memory", "disk", "ephemeral-storage", "pids", "gpu", "nvidia.com/gpu":
			default:
				t.Fatalf("accepted unknown resource %q", k)
			}
		}
		switch {
		case r.CPUMillis < 0 || r.CPUMillis > 1<<20:
			t.Fatalf("cpu %d out of range for %v", r.CPUMillis, m)
		case r.MemoryBytes < 0 || r.MemoryBytes > 1<<50 || (r.MemoryBytes > 0 && r.MemoryBytes < 4<<20):
			t.Fatalf("memory %d out of range for %v", r.MemoryBytes, m)
		case r.DiskBytes < 0 || r.DiskBytes > 1<<50:
			t.Fatalf("disk %d out of range for %v", r.DiskBytes, m)
		case r.PidsLimit < 0:
			t.Fatalf("pids %d for %v", r.PidsLimit, m)
		}
		if _, ok := m["cpu"]; ok && r.CPUMillis == 0 {
			t.Fatalf("cpu %q accepted as 0", m["cpu"])
		}
		if _, ok := m["memory"]; ok && r.MemoryBytes == 0 {
			t.Fatalf("memory %q accepted as 0", m["memory"])
		}
	})
}

// FuzzValidateMetadata checks ValidateMetadata against the Kubernetes label
// rules it implements: what it accepts is a well-formed label.
func FuzzValidateMetadata(f *testing.F) {
	for _, s := range [][2]string{
		{"app", "x"}, {"example.com/team", "a-b_c.d"}, {"a/b/c", "v"}, {"/x", ""}, {"x/", ""}, {"opensandbox.io/x", "y"},
		{"moat.dev/pool", "p"}, {strings.Repeat("a", 64), ""}, {"k", strings.Repeat("v", 64)}, {"k", "-v"}, {"ké", "v"},
		{"", ""}, {"A.b", "Z9"}, {"x.Y/z", "v"},
	} {
		f.Add(s[0], s[1])
	}
	f.Fuzz(func(t *testing.T, k, v string) {
		err := ValidateMetadata(map[string]string{k: v})
		if err != nil {
			wantPublicInvalid(t, "ValidateMetadata", err)
			return
		}
		name := k
		if i := strings.LastIndexByte(k, '/'); i >= 0 {
			prefix := k[:i]
			name = k[i+1:]
			if prefix == "" || len(prefix) > 253 || strings.ToLower(prefix) != prefix ||
				prefix == "opensandbox.io" || strings.HasSuffix(prefix, ".opensandbox.io") ||
				prefix == "moat.dev" || strings.HasSuffix(prefix, ".moat.dev") {
				t.Fatalf("accepted key %q with bad prefix", k)
			}
		}
		for _, s := range []string{name, v} {
			if len(s) > 63 || !utf8.ValidString(s) {
				t.Fatalf("accepted %q=%q", k, v)
			}
			for _, c := range s {
				if !(c == '-' || c == '_' || c == '.' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9') {
					t.Fatalf("accepted %q=%q with %q", k, v, c)
				}
			}
		}
		if name == "" {
			t.Fatalf("accepted empty label name in key %q", k)
		}
	})
}

package runtime

import (
	"bytes"
	"strings"
	"testing"

	"github.com/moat-sandbox/moat/internal/errdefs"
)

func TestValidID(t *testing.T) {
	for id, want := range map[string]bool{
		"a": true, "abc-123": true, "0f3c1a2b-9d8e-4f00-8a1b-123456789abc": true, strings.Repeat("a", 63): true,
		"": false, "-a": false, "a-": false, "A": false, "a_b": false, "a.b": false, "../x": false, "a/b": false,
		strings.Repeat("a", 64): false,
	} {
		if got := ValidID(id); got != want {
			t.Errorf("ValidID(%q) = %v, want %v", id, got, want)
		}
	}
}

func TestValidVolumeName(t *testing.T) {
	for name, want := range map[string]bool{
		"a": true, "data-1": true, "0abc": true, string(bytes.Repeat([]byte("a"), 253)): true,
		"": false, "-a": false, "a-": false, "A": false, "a_b": false, "a.b": true, "a..b": false, ".a": false, "a.": false, "..": false, "../x": false, "a/b": false,
		string(bytes.Repeat([]byte("a"), 254)): false,
	} {
		if got := ValidVolumeName(name); got != want {
			t.Errorf("ValidVolumeName(%q) = %v, want %v", name, got, want)
		}
	}
}

func TestCheckSubPath(t *testing.T) {
	for sub, ok := range map[string]bool{
		"": true, "a": true, "a/b": true, "a/./b/": true, "a..b": true,
		"..": false, "../a": false, "a/../../b": false, "a/..": false, "/a": false, "a\x00b": false,
	} {
		if err := CheckSubPath(sub); (err == nil) != ok {
			t.Errorf("CheckSubPath(%q) = %v, want ok=%v", sub, err, ok)
		}
	}
}

// TestSpecValidate is the rule every backend shares: each case must be
// refused with ErrInvalidArgument and a public message, without a wire
// code (the API edge picks it).
func TestSpecValidate(t *testing.T) {
	ok := func() Spec {
		return Spec{ID: "sb-1", Image: "busybox", WorkingDir: "/w", Env: map[string]string{"A": "1"},
			Resources: Resources{MemoryBytes: MinMemoryBytes},
			Mounts:    []Mount{{Source: "/srv/data", Destination: "/data"}, {Volume: "vol.a", SubPath: "x/y", Destination: "/v"}}}
	}
	good := ok()
	if err := good.Validate(); err != nil {
		t.Fatalf("valid spec: %v", err)
	}
	for i, tc := range []struct {
		name   string
		mutate func(*Spec)
	}{
		{"empty id", func(s *Spec) { s.ID = "" }},
		{"long id", func(s *Spec) { s.ID = strings.Repeat("a", 64) }},
		{"no image", func(s *Spec) { s.Image = "" }},
		{"negative cpu", func(s *Spec) { s.Resources.CPUMillis = -1 }},
		{"negative pids", func(s *Spec) { s.Resources.PidsLimit = -1 }},
		{"negative disk", func(s *Spec) { s.Resources.DiskBytes = -1 }},
		{"tiny memory", func(s *Spec) { s.Resources.MemoryBytes = MinMemoryBytes - 1 }},
		{"relative workdir", func(s *Spec) { s.WorkingDir = "w" }},
		{"env name with =", func(s *Spec) { s.Env = map[string]string{"A=B": "1"} }},
		{"empty env name", func(s *Spec) { s.Env = map[string]string{"": "1"} }},
		{"empty label key", func(s *Spec) { s.Labels = map[string]string{"": "1"} }},
		{"mount over /", func(s *Spec) { s.Mounts[0].Destination = "/" }},
		{"mount over the agent", func(s *Spec) { s.Mounts[0].Destination = AgentDir }},
		{"mount under the agent", func(s *Spec) { s.Mounts[1].Destination = AgentDir + "/x" }},
		{"relative destination", func(s *Spec) { s.Mounts[0].Destination = "data" }},
		{"unclean destination", func(s *Spec) { s.Mounts[0].Destination = "/a/../data" }},
		{"relative source", func(s *Spec) { s.Mounts[0].Source = "srv" }},
		{"source and volume", func(s *Spec) { s.Mounts[1].Source = "/srv" }},
		{"bad volume name", func(s *Spec) { s.Mounts[1].Volume = "Vol" }},
		{"escaping subPath", func(s *Spec) { s.Mounts[1].SubPath = "../x" }},
		{"subPath of a host mount", func(s *Spec) { s.Mounts[0].SubPath = "x" }},
	} {
		s := ok()
		tc.mutate(&s)
		err := s.Validate()
		if !errdefs.IsInvalidArgument(err) {
			t.Errorf("%d %s: Validate = %v, want ErrInvalidArgument", i, tc.name, err)
			continue
		}
		if p, isPub := errdefs.PublicOf(err); !isPub || p.Code != "" || p.Message == "" {
			t.Errorf("%d %s: error %v should carry a public message and no wire code", i, tc.name, err)
		}
	}
}

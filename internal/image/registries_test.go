package image

import (
	"context"
	"errors"
	"testing"

	"github.com/moat-sandbox/moat/internal/errdefs"
)

func TestAllowedRegistries(t *testing.T) {
	o := options{registries: []string{"loopback", "reg.example.com:5000", "*.corp.example"}}
	for _, tc := range []struct {
		registry string
		ok       bool
	}{
		{"127.0.0.1:41000", true},
		{"localhost:5000", true},
		{"[::1]:5000", true},
		{"reg.example.com:5000", true},
		{"reg.example.com", false},
		{"a.corp.example", true},
		{"a.corp.example:443", true},
		{"corp.example", false},
		{"index.docker.io", false},
		{"10.0.0.1:5000", false},
	} {
		err := o.registryAllowed(tc.registry)
		if tc.ok != (err == nil) || (err != nil && !errors.Is(err, errdefs.ErrPermissionDenied)) {
			t.Errorf("%s: %v, want allowed=%v", tc.registry, err, tc.ok)
		}
	}
	if err := (&options{}).registryAllowed("index.docker.io"); err != nil {
		t.Errorf("no allow-list: %v", err)
	}
	for _, p := range []string{"", "*.", "a/b", "u@h", "*"} {
		if ValidRegistryPattern(p) == nil {
			t.Errorf("pattern %q accepted", p)
		}
	}
}

// TestPullRefusedRegistry: a refused pull fails before any network use,
// and an allowed one works.
func TestPullRefusedRegistry(t *testing.T) {
	ctx := context.Background()
	reg := startRegistry(t, "", "")
	ref := reg.push(t, "test/app:v1", buildImage(t, nil, layerOf(t, baseLayerTar(t))))
	reg.mu.Lock()
	clear(reg.counts)
	reg.mu.Unlock()
	s := openStore(t, WithAllowedRegistries([]string{"registry.invalid"}))
	if _, err := s.Pull(ctx, ref, nil, nil); !errors.Is(err, errdefs.ErrPermissionDenied) {
		t.Fatalf("pull from a registry not allowed: %v", err)
	}
	reg.mu.Lock()
	n := len(reg.counts)
	reg.mu.Unlock()
	if n != 0 {
		t.Fatalf("refused pull reached the registry: %v", reg.counts)
	}
	s2 := openStore(t, WithAllowedRegistries([]string{"loopback"}))
	if _, err := s2.Pull(ctx, ref, nil, nil); err != nil {
		t.Fatal(err)
	}
}

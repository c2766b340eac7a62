package server

import (
	"context"
	"log/slog"

	"github.com/moat-sandbox/moat/internal/image"
	"github.com/moat-sandbox/moat/internal/runtime"
	"github.com/moat-sandbox/moat/internal/runtime/fake"
)

// deps are what a backend factory may use.
type deps struct {
	log    *slog.Logger
	images *image.Store
}

// factory builds a backend; the returned func releases it (not its sandboxes).
type factory func(ctx context.Context, cfg Config, d deps) (runtime.Runtime, func() error, error)

// backends is the explicit backend table; backends_linux.go adds "oci".
func backends() map[string]factory {
	m := map[string]factory{
		"fake": func(ctx context.Context, cfg Config, d deps) (runtime.Runtime, func() error, error) {
			rt := fake.New(fake.Hooks{})
			return rt, rt.Close, nil
		},
	}
	addPlatformBackends(m)
	return m
}

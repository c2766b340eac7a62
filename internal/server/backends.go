package server

import (
	"context"
	"log/slog"
	"maps"
	"slices"

	"github.com/moat-sandbox/moat/internal/image"
	"github.com/moat-sandbox/moat/internal/lifecycle"
	"github.com/moat-sandbox/moat/internal/lifecycle/snapshot"
	"github.com/moat-sandbox/moat/internal/runtime"
	"github.com/moat-sandbox/moat/internal/runtime/fake"
	"github.com/moat-sandbox/moat/internal/store"
	"github.com/moat-sandbox/moat/internal/tenant"
)

// deps are what a backend factory may use.
type deps struct {
	log    *slog.Logger
	images *image.Store
	// audit feeds egress decisions and credential injections into the
	// audit trail.
	audit *auditHooks
	// quota is a tenant's quota (the kubernetes backend's ResourceQuotas).
	quota func(tenant string) tenant.Quota
	// named is the namespace the tenants file names for a tenant (nil:
	// no file).
	named func(tenant string) (string, bool)
}

// backend is a built runtime with its optional egress enforcement.
type backend struct {
	rt     runtime.Runtime
	egress lifecycle.Egress // nil: networkPolicy unsupported
	// images overrides moat's image store (e.g. the Docker daemon's).
	images lifecycle.Images
	// committer stores snapshots (nil: snapshots unsupported).
	committer snapshot.Committer
	// close releases the backend (not its sandboxes).
	close func() error
	// store, if set, holds the server's records instead of its own bbolt
	// file (the kubernetes backend: the API server, shared by replicas);
	// events then holds the sandbox events.
	store  store.Store
	events store.Store
	// leader reports whether this replica runs the background duties
	// (nil: always).
	leader func() bool
	// shared, if set, gives the secrets every replica must agree on (the
	// API key, the key-hashing secret) when no file or flag gives them.
	shared func(ctx context.Context, name string, mk func() []byte) ([]byte, error)
}

// factory builds a backend; ctx bounds its start-up, run lives as long as
// the server (for background services such as the DNS proxy).
type factory func(ctx, run context.Context, cfg Config, d deps) (backend, error)

// Backends returns the names of the backends this build offers, sorted:
// the values --runtime accepts.
func Backends() []string { return slices.Sorted(maps.Keys(backends())) }

// RuntimeClasses returns the OCI runtime classes --runtime-class accepts
// (none on a platform without the native backend).
func RuntimeClasses() []string { return platformClasses() }

// backends is the explicit backend table; backends_linux.go adds "oci".
func backends() map[string]factory {
	m := map[string]factory{
		"fake": func(ctx, run context.Context, cfg Config, d deps) (backend, error) {
			rt := fake.New(fake.Hooks{})
			return backend{rt: rt, close: rt.Close}, nil
		},
	}
	m["docker"] = newDocker
	m["kubernetes"] = newKubernetes
	addPlatformBackends(m)
	return m
}

// Package sandbox is the sandbox service as the APIs serve it: the
// lifecycle core (internal/lifecycle) with its features plugged in
// (pools, snapshots, named volumes, the Credential Vault, idle policies). It only wires
// them: each feature owns its state and lock, and a new API or feature is
// a package beside them, a client of the core, not more methods on it.
package sandbox

import (
	"context"
	"fmt"
	"time"

	"github.com/moat-sandbox/moat/internal/egress/vault"
	"github.com/moat-sandbox/moat/internal/lifecycle"
	"github.com/moat-sandbox/moat/internal/lifecycle/credvault"
	"github.com/moat-sandbox/moat/internal/lifecycle/fork"
	"github.com/moat-sandbox/moat/internal/lifecycle/idle"
	"github.com/moat-sandbox/moat/internal/lifecycle/mounts"
	"github.com/moat-sandbox/moat/internal/lifecycle/pool"
	"github.com/moat-sandbox/moat/internal/lifecycle/snapshot"
	"github.com/moat-sandbox/moat/internal/lifecycle/template"
	"github.com/moat-sandbox/moat/internal/tenant"
)

// Config tunes the service: the core's settings and the features'.
type Config struct {
	lifecycle.Config
	// AllowedHostPaths are the host directories host volumes may mount
	// (prefix match after cleaning and symlink resolution). Empty refuses
	// every host volume (VOLUME::HOST_PATH_NOT_ALLOWED).
	AllowedHostPaths []string
	// Idle tunes the idle policies (sweep interval, wake budget).
	Idle idle.Config
}

// Deps are the collaborators: the core's and the features'.
type Deps struct {
	lifecycle.Deps
	// Committer is optional; without it (or a runtime.Snapshotter
	// runtime) snapshots are refused (501), unless the runtime commits
	// snapshot images itself (runtime.ImageSnapshotter).
	Committer snapshot.Committer
	// Sealer encrypts Credential Vault state for the store; without it
	// credentialProxy is refused (501).
	Sealer *vault.Sealer
}

// Service is the core with its features; their methods are its own.
type Service struct {
	*lifecycle.Service
	*pool.Pools
	*snapshot.Snapshots
	*mounts.Volumes
	*credvault.Proxies
	*idle.Idle
	// Templates are the sandbox templates both APIs create from (not
	// embedded: its Create and Get are the templates').
	Templates *template.Templates
	// Forks are the fork operations (not embedded: its Get and Run are
	// the forks').
	Forks *fork.Forks
}

// New returns the service. Call Recover before serving, and Run to start
// the reaper.
func New(cfg Config, deps Deps) (*Service, error) {
	core, err := lifecycle.New(cfg.Config, deps.Deps)
	if err != nil {
		return nil, err
	}
	d := core.Deps()
	pools := pool.New(core)
	snaps, err := snapshot.New(core, deps.Committer, pools)
	if err != nil {
		return nil, err
	}
	vols := mounts.New(core, d.Runtime, d.Log, cfg.AllowedHostPaths)
	vaults := credvault.New(core, d.Egress, deps.Sealer)
	im, _ := d.Metrics.(idle.Metrics)
	idl := idle.New(core, cfg.Idle, im)
	core.Use(lifecycle.Features{Pools: pools, Snapshots: snaps, Volumes: vols, Vault: vaults, Idle: idl})
	forks := fork.New(core, core, snaps, nil)
	forks.Vaults = vaults.CredentialVaults()
	return &Service{Service: core, Pools: pools, Snapshots: snaps, Volumes: vols, Proxies: vaults, Idle: idl,
		Templates: template.New(d.Store, d.Now), Forks: forks}, nil
}

// Run runs the core's reaper and the idle sweeps until ctx is done.
func (s *Service) Run(ctx context.Context) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		s.Idle.Run(ctx)
	}()
	forks := make(chan struct{})
	go func() {
		defer close(forks)
		s.Forks.Run(ctx, time.Minute)
	}()
	defer func() { <-forks }()
	s.Service.Run(ctx)
	<-done
}

// Recover re-adopts the sandboxes and pools after a restart (see
// lifecycle.Service.Recover).
// The fork operations are reconciled after the sandboxes (fork.Forks.Reconcile).
func (s *Service) Recover(ctx context.Context) error {
	if err := s.Service.Recover(ctx); err != nil {
		return err
	}
	return s.Forks.Reconcile(ctx)
}

// Close stops the pools' refill loops and the core's background loops
// (sandboxes keep running).
func (s *Service) Close() {
	s.Pools.Close()
	s.Forks.Wait()
	s.Service.Close()
}

// TenantInUse describes what tenant name still owns ("" if nothing): its
// sandboxes (of any state), pools, snapshots and templates. A tenant is
// deleted only when it owns nothing, so that nothing is left without an
// owner.
func (s *Service) TenantInUse(name string) string {
	name = tenant.Normalize(name)
	sbs, pools, snaps := s.TenantSandboxes(name), s.TenantPools(name), s.TenantSnapshots(name)
	tmpls := s.Templates.TenantTemplates(name)
	if sbs+pools+snaps+tmpls == 0 {
		return ""
	}
	return fmt.Sprintf("%d sandboxes, %d pools, %d snapshots and %d templates", sbs, pools, snaps, tmpls)
}

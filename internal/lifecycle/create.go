package lifecycle

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/moat-sandbox/moat/internal/agentproto"
	"github.com/moat-sandbox/moat/internal/egress/policy"
	"github.com/moat-sandbox/moat/internal/errdefs"
	"github.com/moat-sandbox/moat/internal/image"
	"github.com/moat-sandbox/moat/internal/runtime"
	"github.com/moat-sandbox/moat/internal/tenant"
	"github.com/moat-sandbox/moat/internal/volume"
)

// defaultSnapshotEntrypoint is the entrypoint of a sandbox restored from a
// snapshot when the request has none (as upstream).
var defaultSnapshotEntrypoint = []string{"tail", "-f", "/dev/null"}

// Validate checks a create request and returns the new sandbox's record
// (not yet owned: see Own). The steps run in a fixed order, so a request
// with several faults gets the answer of the first.
func (s *Service) Validate(ctx context.Context, req CreateRequest) (Sandbox, error) {
	now := s.Now()
	memory, entrypoint, err := s.validateSource(ctx, req)
	if err != nil {
		return Sandbox{}, err
	}
	res, err := validateShape(req, s.cfg.MaxTimeout)
	if err != nil {
		return Sandbox{}, err
	}
	np, err := s.validateAccess(req, memory != nil)
	if err != nil {
		return Sandbox{}, err
	}
	var mounts []runtime.Mount
	var claims []Claim
	if s.features.Volumes != nil {
		mounts, claims, err = s.features.Volumes.Mounts(req)
	} else if req.HasVolumes || len(req.Volumes) > 0 {
		err = errdefs.WithPublic(errdefs.ErrInvalidArgument, CodeHostPathNotAllowed, "volumes are not allowed by this server's configuration")
	}
	if err != nil {
		return Sandbox{}, err
	}
	sb := newRecord(req, now, entrypoint, res, np)
	sb.Mounts, sb.Claims = mounts, claims
	if err := applyExtensions(&sb, req.Extensions, s.deps.Runtime.Capabilities().Classes); err != nil {
		return Sandbox{}, err
	}
	if memory != nil {
		if Checkpointer(s.deps.Runtime, memory.Class) == nil {
			return Sandbox{}, errdefs.WithPublic(errdefs.ErrNotImplemented, "SANDBOX::API_NOT_SUPPORTED",
				fmt.Sprintf("snapshot %s holds process memory, which runtime %s of this server cannot restore", memory.ID, memory.Class))
		}
		sb.Class = memory.Class
	}
	if err := s.checkIdle(&sb); err != nil {
		return Sandbox{}, err
	}
	if req.Timeout > 0 {
		exp := now.Add(req.Timeout)
		sb.ExpiresAt = &exp
	}
	return sb, nil
}

// validateSource checks what the sandbox starts from (an image or a
// snapshot) and returns the memory snapshot it restores (nil: none) and
// its entrypoint.
func (s *Service) validateSource(ctx context.Context, req CreateRequest) (*SnapshotSource, []string, error) {
	switch {
	case req.Image == "" && req.SnapshotID == "":
		return nil, nil, errdefs.Invalid(codeInvalid, "one of image or snapshotId is required")
	case req.Image != "" && req.SnapshotID != "":
		return nil, nil, errdefs.Invalid(codeInvalid, "image and snapshotId are mutually exclusive")
	}
	entrypoint := req.Entrypoint
	if req.SnapshotID == "" {
		return nil, entrypoint, nil
	}
	if s.features.Snapshots == nil {
		return nil, nil, errdefs.WithPublic(errdefs.ErrNotImplemented, "SANDBOX::API_NOT_SUPPORTED", "this runtime cannot snapshot sandboxes")
	}
	sn, err := s.features.Snapshots.Source(ctx, req.SnapshotID)
	if err != nil {
		return nil, nil, err
	}
	if len(entrypoint) == 0 {
		entrypoint = defaultSnapshotEntrypoint
	}
	if !sn.Memory {
		return nil, entrypoint, nil
	}
	// The restored sandbox continues the source's processes: it runs the
	// source's entrypoint whatever the request says.
	if len(req.Volumes) > 0 || req.HasVolumes {
		return nil, nil, errdefs.Invalid(CodeInvalidVolume, "volumes cannot be added to a sandbox restored from a memory snapshot")
	}
	if c, ok := req.Extensions[ExtRuntimeClass]; ok && c != sn.Class {
		return nil, nil, errdefs.Invalid(codeInvalid, fmt.Sprintf("extensions[%s]: snapshot %s holds a %s sandbox's memory and restores only with runtime %s", ExtRuntimeClass, sn.ID, sn.Class, sn.Class))
	}
	return &sn, sn.Entrypoint, nil
}

// validateShape checks the request's entrypoint, timeout, resources,
// metadata, env and platform, and returns the parsed resources.
func validateShape(req CreateRequest, maxTimeout time.Duration) (runtime.Resources, error) {
	var none runtime.Resources
	if req.Image != "" && len(req.Entrypoint) == 0 {
		return none, errdefs.Invalid("SANDBOX::INVALID_ENTRYPOINT", "entrypoint is required when image is set")
	}
	for _, a := range req.Entrypoint {
		if len(a) > 1<<16 {
			return none, errdefs.Invalid("SANDBOX::INVALID_ENTRYPOINT", "entrypoint argument too long")
		}
	}
	if req.Timeout < 0 || (req.Timeout > 0 && req.Timeout < time.Second) {
		return none, errdefs.Invalid(codeInvalid, "timeout must be at least 1 second")
	}
	if !req.ShortTimeout && req.Timeout > 0 && req.Timeout < 60*time.Second {
		return none, errdefs.Invalid(codeInvalid, "timeout must be at least 60 seconds (omit it for manual cleanup)")
	}
	if maxTimeout > 0 && req.Timeout > maxTimeout {
		return none, errdefs.Invalid(codeInvalid, fmt.Sprintf("timeout exceeds the server maximum of %d seconds", int(maxTimeout.Seconds())))
	}
	res, err := ParseResources(req.ResourceLimits)
	if err != nil {
		return none, err
	}
	if err := ValidateMetadata(req.Metadata); err != nil {
		return none, err
	}
	if err := ValidateEnv(req.Env); err != nil {
		return none, err
	}
	if p := req.Platform; p != nil {
		if (p.OS != "" && p.OS != "linux") || (p.Arch != "" && p.Arch != hostArch()) {
			return none, errdefs.Invalid(codeInvalid, fmt.Sprintf("platform %s/%s is not supported by this server (linux/%s only)", p.OS, p.Arch, hostArch()))
		}
	}
	return res, nil
}

// ValidateEnv checks the names of env variables: not empty, no '=' or NUL.
func ValidateEnv(env map[string]string) error {
	for k := range env {
		if k == "" || containsAny(k, "=\x00") {
			return errdefs.Invalid(codeInvalid, fmt.Sprintf("env: invalid variable name %q", k))
		}
	}
	return nil
}

// validateAccess checks the network policy, the credential proxy and
// secure access, and returns the parsed policy (nil: none).
func (s *Service) validateAccess(req CreateRequest, memory bool) (*policy.NetworkPolicy, error) {
	var np *policy.NetworkPolicy
	if len(req.NetworkPolicy) > 0 {
		if s.deps.Egress == nil {
			return nil, errdefs.WithPublic(errdefs.ErrNotImplemented, "SANDBOX::API_NOT_SUPPORTED", "networkPolicy is not supported by this server's runtime")
		}
		p, err := policy.Parse(req.NetworkPolicy)
		if err != nil {
			return nil, err
		}
		np = &p
	}
	if req.CredentialProxy {
		if s.features.Vault == nil {
			return nil, errdefs.WithPublic(errdefs.ErrNotImplemented, "SANDBOX::API_NOT_SUPPORTED", "credentialProxy is not supported by this server's runtime")
		}
		if err := s.features.Vault.Check(req, np, memory); err != nil {
			return nil, err
		}
	}
	if req.SecureAccess && !s.cfg.SecureAccess {
		return nil, errdefs.WithPublic(errdefs.ErrNotImplemented, "SANDBOX::API_NOT_SUPPORTED", "secureAccess needs the ingress gateway (moat serve --ingress-listen)")
	}
	return np, nil
}

// newRecord is the record of a new sandbox of a validated request.
func newRecord(req CreateRequest, now time.Time, entrypoint []string, res runtime.Resources, np *policy.NetworkPolicy) Sandbox {
	id := NewID()
	env := cloneMap(req.Env)
	if req.IDEnv != "" {
		env = withIDEnv(env, req.IDEnv, id)
	}
	sb := Sandbox{
		ID:             id,
		Image:          req.Image,
		SnapshotID:     req.SnapshotID,
		Entrypoint:     append([]string(nil), entrypoint...),
		Env:            env,
		Metadata:       cloneMap(req.Metadata),
		ResourceLimits: cloneMap(req.ResourceLimits),
		Resources:      res,
		Extensions:     cloneMap(req.Extensions),
		Platform:       req.Platform,
		CreatedAt:      now,
		AgentToken:     NewToken(),
		NetworkPolicy:  np,
		Status:         Status{State: StatePending, Reason: ReasonCreating, LastTransitionAt: now},
	}
	if np != nil {
		sb.EgressToken = NewToken()
	}
	if req.CredentialProxy {
		// Marks the sandbox; provisioning makes its CA (the vault feature).
		sb.CredentialProxy = &CredentialProxyRecord{}
	}
	if req.SecureAccess {
		sb.AccessToken = NewToken()
	}
	if sb.Metadata == nil {
		sb.Metadata = map[string]string{}
	}
	return sb
}

// applyExtensions checks the request's extensions and applies them to sb.
func applyExtensions(sb *Sandbox, ext map[string]string, classes []string) error {
	for k, v := range ext {
		switch k {
		case ExtRuntimeClass:
			if !slices.Contains(classes, v) {
				return errdefs.Invalid(codeInvalid, fmt.Sprintf("extensions[%s]: runtime %q is not available (have %v)", k, v, classes))
			}
			sb.Class = v
		case ExtRenewOnAccess:
			n, err := parseInt(v)
			if err != nil || n < 300 || n > 86400 {
				return errdefs.Invalid(codeInvalid, fmt.Sprintf("extensions[%s]: must be an integer between 300 and 86400", k))
			}
			sb.RenewOnAccess = n
		case ExtPoolRef:
			// Handled by the pools feature before validation.
		}
	}
	return nil
}

// checkIdle validates the idle policy of new record sb (extensions
// ExtIdlePrefix...), which needs the idle feature.
func (s *Service) checkIdle(sb *Sandbox) error {
	if s.features.Idle != nil {
		return s.features.Idle.CheckPolicy(sb)
	}
	for k := range sb.Extensions {
		if strings.HasPrefix(k, ExtIdlePrefix) {
			return errdefs.WithPublic(errdefs.ErrNotImplemented, "SANDBOX::API_NOT_SUPPORTED",
				fmt.Sprintf("extensions[%s]: idle policies are not supported by this server", k))
		}
	}
	return nil
}

// Checkpointer returns rt's Checkpointer if it can checkpoint sandboxes
// of class (memory snapshots), else nil.
func Checkpointer(rt runtime.Runtime, class string) runtime.Checkpointer {
	cp, ok := rt.(runtime.Checkpointer)
	if !ok || !cp.CanCheckpoint(class) {
		return nil
	}
	return cp
}

// provision runs the create steps; the caller holds e.mu. On failure every
// runtime resource is released, the volumes the create made are deleted
// again, and the entry is left Failed.
func (e *Entry) provision(ctx context.Context, auth *image.Auth) (err error) {
	s := e.svc
	sb := &e.sb
	// The phases of a create, at debug level (moat bench --log-level
	// debug): each is the time since the start of provisioning.
	// Each phase is also a span, a child of the create request's (no-op
	// without tracing: the tracer comes from the span in ctx).
	t0 := time.Now()
	var phases []any
	ctx, span := trace.SpanFromContext(ctx).TracerProvider().Tracer("moat/lifecycle").Start(ctx, "sandbox.provision",
		trace.WithAttributes(attribute.String("osbx.id", sb.ID)))
	defer span.End()
	last := t0
	phase := func(name string) {
		now := time.Now()
		phases = append(phases, name, now.Sub(t0))
		_, ps := span.TracerProvider().Tracer("moat/lifecycle").Start(ctx, "sandbox.provision."+name, trace.WithTimestamp(last))
		ps.End(trace.WithTimestamp(now))
		last = now
	}
	defer func() {
		if err == nil {
			s.log.Debug("lifecycle: created", append([]any{"id", sb.ID}, phases...)...)
		} else if s.features.Volumes != nil {
			s.features.Volumes.Abort(ctx, e)
		}
	}()
	s.events.record(sb.ID, EventCreated, ScopeLifecycle, ReasonCreating, "image "+sb.ImageRef())
	if len(sb.Claims) > 0 && s.features.Volumes != nil {
		if err := s.features.Volumes.Ensure(ctx, e); err != nil {
			e.fail(ReasonProvisionFailed, "volumes unavailable")
			return err
		}
	}
	spec, readyToken, err := e.prepare(ctx, auth)
	phase("image")
	if err != nil {
		return err
	}
	st, err := s.deps.Runtime.Create(ctx, spec)
	phase("runtime")
	if err != nil {
		return e.startFailed(ctx, err)
	}
	if sb.Class == "" {
		sb.Class = st.Class
	}
	if err := e.attach(ctx, st.IP); err != nil {
		return err
	}
	if err := e.waitAgent(ctx, readyToken); err != nil {
		e.cleanupFailed(ctx)
		e.fail(ReasonAgentTimeout, "the sandbox agent did not become ready")
		return errdefs.WithPublic(err, "SANDBOX::EXECD_START_FAILED", "the sandbox agent did not become ready")
	}
	phase("agent")
	if spec.Checkpoint != "" {
		if err := e.configureRestored(ctx, readyToken); err != nil {
			return err
		}
	}
	e.mustTransition(StateRunning, ReasonRunning, "")
	if err := e.persist(); err != nil {
		e.cleanupFailed(ctx)
		e.fail(ReasonProvisionFailed, "could not record the sandbox")
		return err
	}
	phase("persist")
	return nil
}

// prepare ensures the sandbox's image and returns its runtime spec and
// the token its agent answers to at first (the source's for a restored
// memory snapshot). The caller holds e.mu.
func (e *Entry) prepare(ctx context.Context, auth *image.Auth) (runtime.Spec, string, error) {
	s := e.svc
	sb := &e.sb
	ref := sb.ImageRef()
	if sb.SnapshotID != "" && s.features.Snapshots != nil {
		// A runtime that commits its own snapshot images names them.
		if sn, ok := s.features.Snapshots.Restore(sb.SnapshotID); ok && sn.Image != "" {
			ref = sn.Image
		}
	}
	img, err := s.deps.Images.Ensure(ctx, ref, auth)
	if err != nil {
		e.fail(ReasonImagePullFailed, "image pull failed")
		if sb.SnapshotID != "" {
			return runtime.Spec{}, "", errdefs.WithPublic(fmt.Errorf("%w: snapshot image %s: %v", errdefs.ErrFailedPrecondition, ref, err), "SNAPSHOT::IMAGE_MISSING", fmt.Sprintf("the image of snapshot %s is missing", sb.SnapshotID))
		}
		if errdefs.IsInvalidArgument(err) || errdefs.IsNotFound(err) || errors.Is(err, errdefs.ErrPermissionDenied) {
			// A reference the registry does not have is the caller's error.
			return runtime.Spec{}, "", errdefs.WithPublic(fmt.Errorf("%w: %v", errdefs.ErrInvalidArgument, err), "SANDBOX::IMAGE_PULL_FAILED", fmt.Sprintf("pull image %q: %v", sb.Image, PublicCause(err)))
		}
		return runtime.Spec{}, "", errdefs.WithPublic(err, "SANDBOX::IMAGE_PULL_FAILED", fmt.Sprintf("pull image %q failed", sb.Image))
	}
	env := sb.Env
	if sb.CredentialProxy != nil && s.features.Vault != nil {
		if env, err = s.features.Vault.Prepare(e, env); err != nil {
			e.fail(ReasonProvisionFailed, "could not create the sandbox CA")
			return runtime.Spec{}, "", err
		}
	}
	spec := runtime.Spec{
		ID:         sb.ID,
		Image:      img.Name,
		Entrypoint: sb.Entrypoint,
		Env:        env,
		Resources:  sb.Resources,
		Class:      sb.Class,
		AgentToken: sb.AgentToken,
		Labels:     map[string]string{"moat.dev/sandbox": sb.ID},
		Mounts:     sb.Mounts,
		Tenant:     tenant.Normalize(sb.Tenant),
	}
	// A sandbox from a memory snapshot is restored: its agent answers
	// with the source's token until rotateToken gives it its own.
	readyToken := sb.AgentToken
	if sb.SnapshotID != "" && s.features.Snapshots != nil {
		if sn, ok := s.features.Snapshots.Restore(sb.SnapshotID); ok && sn.Memory {
			readyToken, spec.Checkpoint = sn.AgentToken, sn.ID
		}
	}
	// A backend that enforces egress inside the sandbox starts it under
	// its policy; attach then confirms it (a failure there is handled).
	if eff, err := s.effective(sb.Tenant, sb.NetworkPolicy); err == nil && eff != nil && s.deps.Egress != nil {
		if sb.EgressToken == "" {
			sb.EgressToken = NewToken() // filtered by its tenant's guardrail only
		}
		spec.Egress = &runtime.Egress{Token: sb.EgressToken, Policy: *eff, CredentialProxy: sb.CredentialProxy != nil}
	}
	return spec, readyToken, nil
}

// startFailed is the end of a create the runtime refused.
func (e *Entry) startFailed(ctx context.Context, err error) error {
	e.cleanupFailed(ctx)
	e.fail(ReasonProvisionFailed, "sandbox start failed")
	if errors.Is(err, volume.ErrSubPath) {
		return errdefs.WithPublic(err, CodeInvalidSubPath, "a volume's subPath leads out of the volume (through '..' or a symlink) or through a file")
	}
	if errdefs.IsInvalidArgument(err) || errdefs.IsAlreadyExists(err) || errors.Is(err, errdefs.ErrNotImplemented) ||
		errors.Is(err, runtime.ErrTenantNamespaceMissing) {
		// The spec's fault, or something this runtime refuses to do
		// (e.g. a disk quota on docker): the runtime's words say which.
		return err
	}
	return errdefs.WithPublic(err, "SANDBOX::START_FAILED", "sandbox start failed")
}

// attach applies the network policy of a started sandbox (address ip)
// and starts its credential proxy. The caller holds e.mu.
func (e *Entry) attach(ctx context.Context, ip string) error {
	s := e.svc
	attached, err := e.enforceEgress(ctx, e.sb.NetworkPolicy, false, ip)
	if err != nil {
		e.cleanupFailed(ctx)
		e.fail(ReasonProvisionFailed, "could not apply the network policy")
		return errdefs.WithPublic(err, "SANDBOX::EGRESS_FAILED", "could not apply the network policy")
	}
	if !attached {
		return nil
	}
	if e.sb.EgressToken == "" {
		e.sb.EgressToken = NewToken() // filtered by its tenant's guardrail only
	}
	if s.features.Vault != nil {
		if err := s.features.Vault.Attach(ctx, e); err != nil {
			e.cleanupFailed(ctx)
			e.fail(ReasonProvisionFailed, "could not start the credential proxy")
			return errdefs.WithPublic(err, "SANDBOX::EGRESS_FAILED", "could not start the credential proxy")
		}
	}
	return nil
}

// configureRestored gives the agent of a sandbox restored from a memory
// snapshot its own token and env. The caller holds e.mu.
func (e *Entry) configureRestored(ctx context.Context, readyToken string) error {
	s := e.svc
	sb := &e.sb
	err := e.rotateToken(ctx, readyToken)
	if err == nil && len(sb.Env) > 0 {
		err = applyEnv(ctx, s.deps, []*Entry{e}, sb.Env, "") // IDEnv is in sb.Env
	}
	if err != nil {
		e.cleanupFailed(ctx)
		e.fail(ReasonProvisionFailed, "the restored sandbox agent could not be configured")
		return errdefs.WithPublic(err, "SANDBOX::EXECD_START_FAILED", "the restored sandbox agent could not be configured")
	}
	return nil
}

// rotateToken gives the agent of a sandbox restored from a memory
// snapshot its own access token (the moat extension agentproto.TokenPath,
// authorized by the token the agent was checkpointed with). Until then
// the restored agent accepts only the source's token, which the server
// never shows to clients of the restored sandbox.
func (e *Entry) rotateToken(ctx context.Context, old string) error {
	s, id, token := e.svc, e.sb.ID, e.sb.AgentToken
	ep, err := s.deps.Runtime.Endpoint(ctx, id, agentproto.Port)
	if err == nil {
		err = agentClient(s.deps).RotateToken(ctx, ep, old, token)
	}
	if err != nil {
		return fmt.Errorf("rotate token of %s: %w", id, err)
	}
	return nil
}

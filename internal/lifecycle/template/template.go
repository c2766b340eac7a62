// Package template is the sandbox templates: a template id (E2B's
// templateID, OpenSandbox's templateId) names a moat image with the
// defaults of the sandboxes made from it (start command, env, resources,
// user, workdir, timeout) and, optionally, the warm pool that serves them,
// so that a create naming the template is a warm claim. Both APIs use the
// same records: the E2B control plane (internal/e2b) and the Lifecycle
// API (internal/httpapi) resolve ids here and fill a create request with
// Apply.
//
// Templates are per tenant, stored in the sandboxes' store (bucket
// "templates", key like a pool's); every tenant also sees the built-ins
// (Builtins), which a template of the same id in the tenant replaces.
// Records are read from the store on every lookup, so replicas sharing a
// store agree without following it.
package template

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"regexp"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/moat-sandbox/moat/internal/agentproto"
	"github.com/moat-sandbox/moat/internal/errdefs"
	"github.com/moat-sandbox/moat/internal/lifecycle"
	"github.com/moat-sandbox/moat/internal/store"
	"github.com/moat-sandbox/moat/internal/tenant"
)

// Bucket is the store bucket holding template records.
const Bucket = "templates"

// Template is a named set of sandbox defaults.
type Template struct {
	// ID names the template: 1 to 63 characters of [a-z0-9._-],
	// starting and ending alphanumeric.
	ID string `json:"id"`
	// Image is the moat image (exclusive with Pool's image: a template
	// with a pool creates from the pool's template).
	Image string `json:"image,omitempty"`
	// Entrypoint is the start command (default DefaultEntrypoint).
	Entrypoint []string `json:"entrypoint,omitempty"`
	// Env is added to every sandbox's env (the request's own wins).
	Env map[string]string `json:"env,omitempty"`
	// ResourceLimits are OpenSandbox quantities (cpu, memory, disk, pids).
	ResourceLimits map[string]string `json:"resourceLimits,omitempty"`
	// User and Workdir are the default user and working directory of
	// E2B's envd (agentproto.EnvdUserEnv, agentproto.EnvdWorkdirEnv).
	User    string `json:"user,omitempty"`
	Workdir string `json:"workdir,omitempty"`
	// TimeoutSeconds is the lifetime of a sandbox whose create gives none
	// (0: the API's default).
	TimeoutSeconds int `json:"timeoutSeconds,omitempty"`
	// Pool is the warm pool (of the same tenant) sandboxes are claimed
	// from; its template supplies image, entrypoint and resources.
	Pool string `json:"pool,omitempty"`
	// Tenant owns the template ("" for the built-ins).
	Tenant    string    `json:"tenant,omitempty"`
	CreatedAt time.Time `json:"createdAt,omitzero"`
	// BuiltIn marks a built-in (not stored).
	BuiltIn bool `json:"builtIn,omitempty"`
}

// DefaultEntrypoint keeps a sandbox alive when its template has no start
// command: the agent is PID 1 and serves both APIs whatever runs.
var DefaultEntrypoint = []string{"tail", "-f", "/dev/null"}

// Builtins are the templates every tenant has: E2B's default templates
// of the JS/Python SDK (base) and of the code-interpreter SDKs. Neither
// has a start command: the agent serves envd and the code interpreter
// (over the image's Jupyter kernels) itself.
func Builtins() []Template {
	return []Template{
		{ID: "base", Image: "moat-e2b-base:latest", User: "user", Workdir: "/home/user", BuiltIn: true},
		{ID: "code-interpreter-v1", Image: "moat-e2b-code-interpreter:latest", User: "user", Workdir: "/home/user", BuiltIn: true},
	}
}

// Codes of the template errors.
const (
	CodeNotFound = "TEMPLATE::NOT_FOUND"
	CodeInvalid  = "TEMPLATE::INVALID_PARAMETER"
	CodeExists   = "TEMPLATE::ALREADY_EXISTS"
	CodeBuiltIn  = "TEMPLATE::BUILT_IN"
)

var idRe = regexp.MustCompile(`^[a-z0-9]([a-z0-9._-]{0,61}[a-z0-9])?$`)

// ValidID checks a template id.
func ValidID(id string) error {
	if !idRe.MatchString(id) {
		return errdefs.Invalid(CodeInvalid, fmt.Sprintf("template id %q must be 1 to 63 characters of [a-z0-9._-], starting and ending alphanumeric", id))
	}
	return nil
}

// NotFound is the error of an unknown template id.
func NotFound(id string) error {
	return errdefs.WithPublic(fmt.Errorf("template %q: %w", id, errdefs.ErrNotFound), CodeNotFound, fmt.Sprintf("template %s not found", id))
}

// Templates is the template store. It is safe for concurrent use (the
// store serializes writes; a create checks for a duplicate first, and two
// racing creates of one id end with one record).
type Templates struct {
	db  store.Store
	now func() time.Time
}

// New returns the templates kept in db; now is the clock (nil: time.Now).
func New(db store.Store, now func() time.Time) *Templates {
	if now == nil {
		now = time.Now
	}
	return &Templates{db: db, now: now}
}

func key(owner, id string) string {
	if owner = tenant.Normalize(owner); owner == tenant.Default {
		return id
	}
	return owner + "/" + id
}

// Validate checks a template's shape (not that its image or pool exist).
func Validate(t Template) error {
	if err := ValidID(t.ID); err != nil {
		return err
	}
	switch {
	case t.Image == "" && t.Pool == "":
		return errdefs.Invalid(CodeInvalid, "a template needs an image or a pool")
	case t.Image != "" && t.Pool != "":
		return errdefs.Invalid(CodeInvalid, "image and pool are exclusive: a pooled template creates from its pool's template")
	case t.Pool != "" && (len(t.Entrypoint) > 0 || len(t.ResourceLimits) > 0):
		return errdefs.Invalid(CodeInvalid, "a pooled template takes its entrypoint and resources from its pool")
	case t.TimeoutSeconds < 0:
		return errdefs.Invalid(CodeInvalid, "timeoutSeconds must not be negative")
	}
	if _, err := lifecycle.ParseResources(t.ResourceLimits); err != nil {
		return err
	}
	if err := lifecycle.ValidateEnv(t.Env); err != nil {
		return err
	}
	for _, p := range []struct{ name, v string }{{"user", t.User}, {"workdir", t.Workdir}} {
		if strings.ContainsAny(p.v, "\x00\n") || len(p.v) > 4096 {
			return errdefs.Invalid(CodeInvalid, p.name+" must be one line")
		}
	}
	if t.Workdir != "" && !strings.HasPrefix(t.Workdir, "/") {
		return errdefs.Invalid(CodeInvalid, "workdir must be an absolute path")
	}
	return nil
}

// Create stores a new template in ctx's tenant. A template of a
// built-in's id replaces the built-in for that tenant.
func (s *Templates) Create(ctx context.Context, t Template) (Template, error) {
	if err := Validate(t); err != nil {
		return Template{}, err
	}
	t.Tenant, t.BuiltIn = tenant.Normalize(lifecycle.OwnerOf(ctx)), false
	t.CreatedAt = s.now().UTC().Truncate(time.Second)
	t.Entrypoint = slices.Clone(t.Entrypoint)
	t.Env, t.ResourceLimits = maps.Clone(t.Env), maps.Clone(t.ResourceLimits)
	k := key(t.Tenant, t.ID)
	var old Template
	switch err := s.db.Get(Bucket, k, &old); {
	case err == nil:
		return Template{}, errdefs.WithPublic(fmt.Errorf("template %q: %w", t.ID, errdefs.ErrAlreadyExists), CodeExists,
			fmt.Sprintf("template %s already exists", t.ID))
	case !errdefs.IsNotFound(err):
		return Template{}, err
	}
	if err := s.db.Put(Bucket, k, &t); err != nil {
		return Template{}, fmt.Errorf("store template %s: %w", t.ID, err)
	}
	return t, nil
}

// Get returns template id as ctx's tenant sees it: its own, else the
// built-in.
func (s *Templates) Get(ctx context.Context, id string) (Template, error) {
	if err := ValidID(id); err != nil {
		return Template{}, err
	}
	var t Template
	err := s.db.Get(Bucket, key(lifecycle.OwnerOf(ctx), id), &t)
	switch {
	case err == nil:
		return t, nil
	case !errdefs.IsNotFound(err):
		return Template{}, err
	}
	for _, b := range Builtins() {
		if b.ID == id {
			return b, nil
		}
	}
	return Template{}, NotFound(id)
}

// List returns the templates ctx sees, sorted by id: the built-ins its
// tenant did not replace and its own (every tenant's, for a context that
// sees every tenant).
func (s *Templates) List(ctx context.Context) ([]Template, error) {
	recs, err := store.List[Template](s.db, Bucket)
	if err != nil {
		return nil, err
	}
	own := tenant.Normalize(lifecycle.OwnerOf(ctx))
	var out []Template
	shadowed := map[string]bool{}
	for _, t := range recs {
		if !lifecycle.Visible(ctx, t.Tenant) {
			continue
		}
		out = append(out, t)
		if tenant.Normalize(t.Tenant) == own {
			shadowed[t.ID] = true
		}
	}
	for _, b := range Builtins() {
		if !shadowed[b.ID] {
			out = append(out, b)
		}
	}
	sort.SliceStable(out, func(i, j int) bool {
		if out[i].ID != out[j].ID {
			return out[i].ID < out[j].ID
		}
		return out[i].Tenant < out[j].Tenant
	})
	return out, nil
}

// Delete removes template id of ctx's tenant. A built-in cannot be
// deleted (409); deleting a replacement brings the built-in back.
func (s *Templates) Delete(ctx context.Context, id string) error {
	if err := ValidID(id); err != nil {
		return err
	}
	k := key(lifecycle.OwnerOf(ctx), id)
	var t Template
	err := s.db.Get(Bucket, k, &t)
	if errdefs.IsNotFound(err) {
		for _, b := range Builtins() {
			if b.ID == id {
				return errdefs.WithPublic(fmt.Errorf("template %q: built in: %w", id, errdefs.ErrFailedPrecondition), CodeBuiltIn,
					fmt.Sprintf("template %s is built in and cannot be deleted", id))
			}
		}
		return NotFound(id)
	}
	if err != nil {
		return err
	}
	if err := s.db.Delete(Bucket, k); err != nil && !errors.Is(err, errdefs.ErrNotFound) {
		return err
	}
	return nil
}

// TenantTemplates counts the templates tenant name owns.
func (s *Templates) TenantTemplates(name string) int {
	recs, err := store.List[Template](s.db, Bucket)
	if err != nil {
		return 0
	}
	n := 0
	for _, t := range recs {
		if tenant.Normalize(t.Tenant) == tenant.Normalize(name) {
			n++
		}
	}
	return n
}

// Apply fills req with t's defaults: what the request leaves unset comes
// from the template (image, entrypoint, resources, timeout), env is
// merged (the request's values win), and the template's user, workdir and
// id are passed to the sandbox's envd (E2B_TEMPLATE_ID). A pooled
// template turns the create into a claim from its pool.
func Apply(t Template, req *lifecycle.CreateRequest) error {
	if req.SnapshotID != "" {
		return errdefs.Invalid(CodeInvalid, "templateId and snapshotId are exclusive")
	}
	if req.Image != "" && req.Image != t.Image {
		return errdefs.Invalid(CodeInvalid, fmt.Sprintf("image %q differs from template %s's image", req.Image, t.ID))
	}
	env := maps.Clone(t.Env)
	if env == nil {
		env = map[string]string{}
	}
	env[agentproto.EnvdTemplateEnv] = t.ID
	if t.User != "" {
		env[agentproto.EnvdUserEnv] = t.User
	}
	if t.Workdir != "" {
		env[agentproto.EnvdWorkdirEnv] = t.Workdir
	}
	maps.Copy(env, req.Env)
	req.Env = env
	if req.Timeout == 0 && t.TimeoutSeconds > 0 {
		req.Timeout = time.Duration(t.TimeoutSeconds) * time.Second
	}
	req.Extensions = maps.Clone(req.Extensions)
	if req.Extensions == nil {
		req.Extensions = map[string]string{}
	}
	req.Extensions[lifecycle.ExtTemplate] = t.ID
	if t.Pool != "" {
		if p, ok := req.Extensions[lifecycle.ExtPoolRef]; ok && p != t.Pool {
			return errdefs.Invalid(CodeInvalid, fmt.Sprintf("extensions[%s] differs from template %s's pool %s", lifecycle.ExtPoolRef, t.ID, t.Pool))
		}
		req.Extensions[lifecycle.ExtPoolRef] = t.Pool
		return nil
	}
	req.Image = t.Image
	if len(req.Entrypoint) == 0 {
		req.Entrypoint = slices.Clone(t.Entrypoint)
		if len(req.Entrypoint) == 0 {
			req.Entrypoint = slices.Clone(DefaultEntrypoint)
		}
	}
	if len(t.ResourceLimits) > 0 {
		rl := maps.Clone(t.ResourceLimits)
		maps.Copy(rl, req.ResourceLimits)
		req.ResourceLimits = rl
	}
	return nil
}

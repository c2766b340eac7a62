package e2b

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"math"
	"net/http"
	goruntime "runtime"
	"time"

	"github.com/moat-sandbox/moat/internal/agentproto"
	"github.com/moat-sandbox/moat/internal/errdefs"
	"github.com/moat-sandbox/moat/internal/lifecycle"
	"github.com/moat-sandbox/moat/internal/lifecycle/snapshot"
	"github.com/moat-sandbox/moat/internal/lifecycle/template"
	"github.com/moat-sandbox/moat/internal/tenant"
	"github.com/moat-sandbox/moat/internal/web"
)

// clientID is the deprecated clientID every Sandbox carries (the Python
// SDK requires the key).
const clientID = "moat"

// Defaults of E2B's API: a v2 create lives 300 s, a v1 create 15 s (the
// SDKs always send one), a refresh extends by 15 s.
const (
	defaultTimeoutV2 = 300
	defaultTimeoutV1 = 15
	defaultRefresh   = 15
)

// newSandbox is NewSandbox (v1) and NewSandboxV2 (the same fields; v1
// adds secure, which moat ignores: every sandbox's envd checks its token).
type newSandbox struct {
	TemplateID          string            `json:"templateID"`
	Timeout             *json.Number      `json:"timeout"`
	Metadata            map[string]string `json:"metadata"`
	EnvVars             map[string]string `json:"envVars"`
	Secure              *bool             `json:"secure"`
	AllowInternetAccess *bool             `json:"allow_internet_access"`
	Network             *networkConfig    `json:"network"`
	AutoPause           *bool             `json:"autoPause"`
	AutoResume          json.RawMessage   `json:"autoResume"`
	MCP                 json.RawMessage   `json:"mcp"`
	VolumeMounts        []json.RawMessage `json:"volumeMounts"`
}

// sandboxJSON is E2B's Sandbox (create, connect, resume).
type sandboxJSON struct {
	TemplateID      string  `json:"templateID"`
	SandboxID       string  `json:"sandboxID"`
	ClientID        string  `json:"clientID"`
	EnvdVersion     string  `json:"envdVersion"`
	EnvdAccessToken string  `json:"envdAccessToken,omitempty"`
	Alias           string  `json:"alias,omitempty"`
	Domain          *string `json:"domain"`
}

// detailJSON is E2B's SandboxDetail and, without the token, ListedSandbox.
type detailJSON struct {
	TemplateID      string            `json:"templateID"`
	Alias           string            `json:"alias,omitempty"`
	SandboxID       string            `json:"sandboxID"`
	ClientID        string            `json:"clientID"`
	StartedAt       time.Time         `json:"startedAt"`
	EndAt           time.Time         `json:"endAt"`
	EnvdVersion     string            `json:"envdVersion"`
	EnvdAccessToken string            `json:"envdAccessToken,omitempty"`
	CPUCount        int               `json:"cpuCount"`
	MemoryMB        int64             `json:"memoryMB"`
	DiskSizeMB      int64             `json:"diskSizeMB"`
	State           string            `json:"state"`
	Metadata        map[string]string `json:"metadata"`
	Domain          *string           `json:"domain,omitempty"`
	Lifecycle       *lifecycleJSON    `json:"lifecycle,omitempty"`
}

type lifecycleJSON struct {
	OnTimeout  string `json:"onTimeout"`
	AutoResume bool   `json:"autoResume"`
}

// noEnd is the endAt of a sandbox without expiry (made through the
// Lifecycle API for manual cleanup): E2B requires one.
var noEnd = time.Date(9999, 12, 31, 23, 59, 59, 0, time.UTC)

// state is E2B's state of a moat sandbox, "" for one E2B does not show
// (being created, stopping, gone or failed: E2B's sandboxes are running
// or paused, and a dead one is not found).
func state(st lifecycle.State) string {
	switch st {
	case lifecycle.StateRunning, lifecycle.StatePausing:
		return "running"
	case lifecycle.StatePaused, lifecycle.StateResuming:
		return "paused"
	}
	return ""
}

func (a *API) domain() *string {
	if a.cfg.Domain == "" {
		return nil
	}
	d := a.cfg.Domain
	return &d
}

// templateOf is the templateID of a sandbox: its template, else its
// snapshot, else its image (a sandbox made through the Lifecycle API).
func templateOf(sb lifecycle.Sandbox) string {
	if t := sb.Extensions[lifecycle.ExtTemplate]; t != "" {
		return t
	}
	if sb.SnapshotID != "" {
		return sb.SnapshotID
	}
	return sb.Image
}

func (a *API) sandboxJSON(sb lifecycle.Sandbox) sandboxJSON {
	return sandboxJSON{TemplateID: templateOf(sb), SandboxID: sb.ID, ClientID: clientID,
		EnvdVersion: agentproto.EnvdVersion, EnvdAccessToken: sb.AgentToken, Domain: a.domain()}
}

func (a *API) detail(sb lifecycle.Sandbox, token bool) detailJSON {
	d := detailJSON{TemplateID: templateOf(sb), SandboxID: sb.ID, ClientID: clientID,
		StartedAt: sb.CreatedAt.UTC(), EndAt: noEnd, EnvdVersion: agentproto.EnvdVersion,
		State: state(sb.Status.State), Metadata: metadataOf(sb), Domain: a.domain(),
		CPUCount:   int(math.Ceil(float64(sb.Resources.CPUMillis) / 1000)),
		MemoryMB:   sb.Resources.MemoryBytes >> 20,
		DiskSizeMB: sb.Resources.DiskBytes >> 20,
		Lifecycle:  &lifecycleJSON{OnTimeout: "kill"},
	}
	if sb.ExpiresAt != nil {
		d.EndAt = sb.ExpiresAt.UTC()
	}
	if d.CPUCount == 0 {
		d.CPUCount = goruntime.NumCPU() // no limit: the host's
	}
	if token {
		d.EnvdAccessToken = sb.AgentToken
	}
	return d
}

// canDrive reports whether the caller may drive sandboxes (operator or
// admin): only they are shown envd tokens.
func canDrive(r *http.Request) bool {
	p, ok := tenant.PrincipalFrom(r.Context())
	return !ok || p.Role.Allows(tenant.AccessWrite)
}

// seconds reads a timeout in seconds: a positive integer.
func seconds(n *json.Number, def int, field string) (time.Duration, error) {
	if n == nil {
		return time.Duration(def) * time.Second, nil
	}
	f, err := n.Float64()
	if err != nil || f != math.Trunc(f) || f > math.MaxInt32 {
		return 0, invalid(field + " must be an integer number of seconds")
	}
	if f <= 0 {
		return 0, invalid(field + " must be positive")
	}
	return time.Duration(f) * time.Second, nil
}

func (a *API) createV1(w http.ResponseWriter, r *http.Request) error {
	return a.create(w, r, defaultTimeoutV1)
}

func (a *API) createV2(w http.ResponseWriter, r *http.Request) error {
	return a.create(w, r, defaultTimeoutV2)
}

func (a *API) create(w http.ResponseWriter, r *http.Request, defTimeout int) error {
	var body newSandbox
	if err := web.DecodeJSON(r, &body, false); err != nil {
		return err
	}
	req, err := a.createRequest(r, body, defTimeout)
	if err != nil {
		return err
	}
	sb, err := a.svc.Create(r.Context(), req)
	if err != nil {
		return err
	}
	w.Header().Set("Location", "/sandboxes/"+sb.ID)
	web.WriteJSON(w, http.StatusCreated, a.sandboxJSON(sb))
	return nil
}

// createRequest turns an E2B create into the service's: the template
// (or snapshot) named by templateID, E2B's env, metadata and timeout.
func (a *API) createRequest(r *http.Request, body newSandbox, defTimeout int) (lifecycle.CreateRequest, error) {
	var req lifecycle.CreateRequest
	switch {
	case body.AutoPause != nil && *body.AutoPause:
		return req, errdefs.WithPublic(errdefs.ErrNotImplemented, "", "autoPause is not supported by this server: sandboxes are killed when they time out")
	case len(body.AutoResume) > 0 && string(body.AutoResume) != "null" && string(body.AutoResume) != `{"enabled":false}`:
		return req, errdefs.WithPublic(errdefs.ErrNotImplemented, "", "autoResume is not supported by this server")
	case len(body.MCP) > 0 && string(body.MCP) != "null":
		return req, errdefs.WithPublic(errdefs.ErrNotImplemented, "", "mcp is not supported by this server")
	case len(body.VolumeMounts) > 0:
		return req, errdefs.WithPublic(errdefs.ErrNotImplemented, "", "volumeMounts are not supported by this server's E2B API (mount volumes through the Lifecycle API)")
	}
	timeout, err := seconds(body.Timeout, defTimeout, "timeout")
	if err != nil {
		return req, err
	}
	if body.TemplateID == "" {
		body.TemplateID = "base"
	}
	if err := a.fromTemplate(r, body.TemplateID, &req); err != nil {
		return req, err
	}
	if body.Timeout != nil || req.Timeout == 0 {
		req.Timeout = timeout
	}
	req.ShortTimeout = true
	env := maps.Clone(req.Env)
	if env == nil {
		env = map[string]string{}
	}
	maps.Copy(env, body.EnvVars)
	env["E2B_SANDBOX"] = "true"
	req.Env = env
	// The sandbox starts with its own id (a claim applies it), not in a
	// second call to its agent after the create.
	req.IDEnv = sandboxIDEnv
	if req.Metadata, req.Extensions, err = splitMetadata(body.Metadata, req.Extensions); err != nil {
		return req, err
	}
	if req.NetworkPolicy, err = networkPolicy(body.AllowInternetAccess, body.Network); err != nil {
		return req, err
	}
	return req, nil
}

// sandboxIDEnv is the variable that carries a sandbox's id in E2B's.
const sandboxIDEnv = "E2B_SANDBOX_ID"

// setSandboxID gives the processes of a sandbox made through the
// Lifecycle API, at its first E2B connect, E2B_SANDBOX=true and
// E2B_SANDBOX_ID, through the agent's env extension (agentproto.EnvPath,
// which pool claims use too); an E2B create has them from the start
// (CreateRequest.IDEnv). A failure is logged, not fatal: the sandbox
// works without them.
func (a *API) setSandboxID(ctx context.Context, sb lifecycle.Sandbox) {
	env := map[string]string{sandboxIDEnv: sb.ID, "E2B_SANDBOX": "true"}
	ep, err := a.svc.Endpoint(ctx, sb.ID, agentproto.Port)
	if err == nil {
		err = (&agentproto.Client{HTTP: a.http}).SetEnv(ctx, ep.Address, sb.AgentToken, env)
	}
	if err != nil {
		a.log.Warn("e2b: set E2B_SANDBOX_ID", "id", sb.ID, "err", err)
	}
}

// fromTemplate fills req from templateID: a template, else a snapshot of
// the caller's (E2B creates from a snapshot by naming it as the
// template). Neither: 404, as E2B answers an unknown template.
func (a *API) fromTemplate(r *http.Request, ref string, req *lifecycle.CreateRequest) error {
	ctx := r.Context()
	id, err := templateRef(ref)
	if err != nil {
		return err
	}
	t, terr := a.svc.Templates.Get(ctx, id)
	if terr == nil {
		return template.Apply(t, req)
	}
	if !errdefs.IsNotFound(terr) {
		return terr
	}
	if sn, err := a.svc.GetSnapshot(ctx, id); err == nil && sn.Status.State == snapshot.SnapshotReady {
		req.SnapshotID = sn.ID
		req.Extensions = map[string]string{lifecycle.ExtTemplate: sn.ID}
		return nil
	}
	return errdefs.WithPublic(terr, "", fmt.Sprintf("template '%s' not found", id))
}

// visible returns sandbox id if E2B shows it (running or paused).
func (a *API) visible(r *http.Request, id string) (lifecycle.Sandbox, error) {
	sb, err := a.svc.Get(r.Context(), id)
	if err != nil {
		return sb, err
	}
	if state(sb.Status.State) == "" {
		return sb, errdefs.WithPublic(fmt.Errorf("sandbox %s is %s: %w", id, sb.Status.State, errdefs.ErrNotFound), "",
			fmt.Sprintf("sandbox %s not found", id))
	}
	return sb, nil
}

func (a *API) get(w http.ResponseWriter, r *http.Request) error {
	sb, err := a.visible(r, r.PathValue("id"))
	if err != nil {
		return err
	}
	web.WriteJSON(w, http.StatusOK, a.detail(sb, canDrive(r)))
	return nil
}

func (a *API) kill(w http.ResponseWriter, r *http.Request) error {
	if err := a.svc.Delete(r.Context(), r.PathValue("id")); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

func (a *API) pause(w http.ResponseWriter, r *http.Request) error {
	id := r.PathValue("id")
	if _, err := a.visible(r, id); err != nil {
		return err
	}
	if err := a.svc.Pause(r.Context(), id); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

type connectBody struct {
	Timeout *json.Number `json:"timeout"`
	Memory  *bool        `json:"memory"`
}

func (a *API) connectV1(w http.ResponseWriter, r *http.Request) error {
	var body connectBody
	if err := web.DecodeJSON(r, &body, false); err != nil {
		return err
	}
	if body.Timeout == nil {
		return invalid("timeout is required")
	}
	return a.connect(w, r, body, false)
}

func (a *API) connectV2(w http.ResponseWriter, r *http.Request) error {
	var body connectBody
	if err := web.DecodeJSON(r, &body, true); err != nil {
		return err
	}
	return a.connect(w, r, body, false)
}

// resume is the deprecated POST /resume: connect, but only to a paused
// sandbox (409 otherwise).
func (a *API) resume(w http.ResponseWriter, r *http.Request) error {
	var body connectBody
	if err := web.DecodeJSON(r, &body, true); err != nil {
		return err
	}
	if body.Timeout == nil {
		n := json.Number(fmt.Sprint(defaultTimeoutV1))
		body.Timeout = &n
	}
	return a.connect(w, r, body, true)
}

// connect resumes a paused sandbox (201) or answers a running one (200),
// and extends its expiry to at least now + timeout (never shortens it).
func (a *API) connect(w http.ResponseWriter, r *http.Request, body connectBody, pausedOnly bool) error {
	timeout, err := seconds(body.Timeout, defaultTimeoutV2, "timeout")
	if err != nil {
		return err
	}
	id := r.PathValue("id")
	sb, err := a.visible(r, id)
	if err != nil {
		return err
	}
	status := http.StatusOK
	switch {
	case sb.Status.State == lifecycle.StatePaused:
		if err := a.svc.Resume(r.Context(), id); err != nil {
			return err
		}
		status = http.StatusCreated
	case pausedOnly:
		return errdefs.WithPublic(fmt.Errorf("sandbox %s is %s: %w", id, sb.Status.State, errdefs.ErrFailedPrecondition), "",
			fmt.Sprintf("sandbox %s is not paused", id))
	}
	if err := a.extend(r, sb, timeout); err != nil {
		return err
	}
	if sb, err = a.svc.Get(r.Context(), id); err != nil {
		return err
	}
	if sb.Env["E2B_SANDBOX"] != "true" {
		// Made through the Lifecycle API: its processes get E2B's
		// variables from the first E2B connect on.
		a.setSandboxID(r.Context(), sb)
	}
	web.WriteJSON(w, status, a.sandboxJSON(sb))
	return nil
}

// extend moves sb's expiry to now + d if that is later.
func (a *API) extend(r *http.Request, sb lifecycle.Sandbox, d time.Duration) error {
	at := a.now().Add(d)
	if sb.ExpiresAt == nil || !at.After(*sb.ExpiresAt) {
		return nil
	}
	_, err := a.svc.Renew(r.Context(), sb.ID, at)
	return err
}

func (a *API) setTimeout(w http.ResponseWriter, r *http.Request) error {
	var body struct {
		Timeout *json.Number `json:"timeout"`
	}
	if err := web.DecodeJSON(r, &body, false); err != nil {
		return err
	}
	if body.Timeout == nil {
		return invalid("timeout is required")
	}
	d, err := seconds(body.Timeout, 0, "timeout")
	if err != nil {
		return err
	}
	id := r.PathValue("id")
	if _, err := a.visible(r, id); err != nil {
		return err
	}
	if _, err := a.svc.Renew(r.Context(), id, a.now().Add(d)); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

func (a *API) refresh(w http.ResponseWriter, r *http.Request) error {
	var body struct {
		Duration *json.Number `json:"duration"`
	}
	if err := web.DecodeJSON(r, &body, true); err != nil {
		return err
	}
	d, err := seconds(body.Duration, defaultRefresh, "duration")
	if err != nil {
		return err
	}
	sb, err := a.visible(r, r.PathValue("id"))
	if err != nil {
		return err
	}
	if err := a.extend(r, sb, d); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

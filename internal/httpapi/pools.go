package httpapi

import (
	"encoding/json"
	"net/http"
	"strconv"
	"strings"

	"github.com/moat-sandbox/moat/internal/errdefs"
	"github.com/moat-sandbox/moat/internal/gen/lifecycleapi"
	"github.com/moat-sandbox/moat/internal/lifecycle"
	"github.com/moat-sandbox/moat/internal/lifecycle/pool"
	"github.com/moat-sandbox/moat/internal/tenant"
	"github.com/moat-sandbox/moat/internal/web"
)

// Pools API: the upstream server's /pools shape (name, template,
// capacitySpec, status), with a moat template (the create request's image,
// entrypoint, env, resourceLimits and extensions) instead of a PodTemplate.

// poolTemplateJSON is the request's template. Responses use the generated
// lifecycleapi.Pool; requests keep this struct because a missing template or
// capacitySpec must be told apart from an empty one.
type poolTemplateJSON struct {
	Image          *imageSpec        `json:"image,omitempty"`
	SnapshotID     string            `json:"snapshotId,omitempty"`
	Entrypoint     []string          `json:"entrypoint"`
	Env            map[string]string `json:"env,omitempty"`
	ResourceLimits map[string]string `json:"resourceLimits,omitempty"`
	Extensions     map[string]string `json:"extensions,omitempty"`
	Volumes        []json.RawMessage `json:"volumes,omitempty"`
}

type poolRequest struct {
	Name         string            `json:"name"`
	Template     *poolTemplateJSON `json:"template"`
	CapacitySpec *pool.Capacity    `json:"capacitySpec"`
}

func poolOut(p pool.Pool, st pool.PoolStatus) lifecycleapi.Pool {
	t := p.Template
	c := p.Capacity
	owner := tenant.Normalize(p.Tenant)
	return lifecycleapi.Pool{
		Name: p.Name, Tenant: &owner,
		Template: lifecycleapi.PoolTemplate{Image: poolImage(t.Image), SnapshotID: optString(t.SnapshotID),
			Entrypoint: optSlice(t.Entrypoint), Env: optMap(t.Env), ResourceLimits: optMap(t.ResourceLimits),
			Extensions: extensionsOut(t.Extensions), Volumes: volumesOut(t.Volumes)},
		CapacitySpec: lifecycleapi.PoolCapacity{BufferMin: &c.BufferMin, BufferMax: &c.BufferMax, PoolMin: &c.PoolMin, PoolMax: &c.PoolMax},
		Status:       lifecycleapi.PoolStatus{Total: st.Total, Allocated: st.Allocated, Available: st.Available, Revision: strconv.Itoa(st.Revision)},
		CreatedAt:    p.CreatedAt.UTC(),
	}
}

func poolImage(uri string) *lifecycleapi.ImageSpec {
	if uri == "" {
		return nil
	}
	return &lifecycleapi.ImageSpec{URI: uri}
}

// volumesOut writes volumes as the generated model (same JSON names).
func volumesOut(vols []lifecycle.Volume) *[]lifecycleapi.Volume {
	if len(vols) == 0 {
		return nil
	}
	data, err := json.Marshal(vols)
	if err != nil {
		return nil
	}
	var out []lifecycleapi.Volume
	if json.Unmarshal(data, &out) != nil {
		return nil
	}
	return &out
}

// optSlice and optMap are nil when empty, so that the field is omitted.
func optSlice(s []string) *[]string {
	if len(s) == 0 {
		return nil
	}
	return &s
}

func optMap(m map[string]string) *map[string]string {
	if len(m) == 0 {
		return nil
	}
	return &m
}

// extensionsOut writes an extensions map as the generated model. Every key,
// well-known or not, goes through AdditionalProperties: the model encodes
// them all as plain string members.
func extensionsOut(m map[string]string) *lifecycleapi.Extensions {
	if len(m) == 0 {
		return nil
	}
	return &lifecycleapi.Extensions{AdditionalProperties: m}
}

func poolImageURI(im *imageSpec) string {
	if im == nil {
		return ""
	}
	return im.URI
}

func decodePool(r *http.Request, name string) (pool.Pool, error) {
	var body poolRequest
	if err := web.DecodeJSON(r, &body, false); err != nil {
		return pool.Pool{}, err
	}
	if name != "" {
		if body.Name != "" && body.Name != name {
			return pool.Pool{}, errdefs.Invalid("POOL::INVALID_NAME", "name in the body differs from the path")
		}
		body.Name = name
	}
	if body.Template == nil {
		return pool.Pool{}, errdefs.Invalid("POOL::INVALID_TEMPLATE", "template is required")
	}
	hasImage := body.Template.Image != nil && strings.TrimSpace(body.Template.Image.URI) != ""
	hasSnap := strings.TrimSpace(body.Template.SnapshotID) != ""
	if hasImage == hasSnap {
		return pool.Pool{}, errdefs.Invalid("POOL::INVALID_TEMPLATE", "template needs exactly one of image.uri or snapshotId")
	}
	if body.CapacitySpec == nil {
		return pool.Pool{}, errdefs.Invalid("POOL::INVALID_CAPACITY", "capacitySpec is required")
	}
	t := body.Template
	vols, err := lifecycle.ParseVolumes(t.Volumes)
	if err != nil {
		return pool.Pool{}, err
	}
	if len(vols) == 0 {
		vols = nil
	}
	return pool.Pool{Name: body.Name, Capacity: *body.CapacitySpec, Template: pool.PoolTemplate{
		Image: poolImageURI(t.Image), SnapshotID: strings.TrimSpace(t.SnapshotID), Entrypoint: t.Entrypoint, Env: t.Env, ResourceLimits: t.ResourceLimits, Extensions: t.Extensions,
		Volumes: vols}}, nil
}

func (s *Server) createPool(w http.ResponseWriter, r *http.Request) error {
	p, err := decodePool(r, "")
	if err != nil {
		return err
	}
	p, err = s.svc.CreatePool(r.Context(), p)
	if err != nil {
		return err
	}
	_, st, _ := s.svc.GetPool(r.Context(), p.Name)
	web.WriteJSON(w, http.StatusCreated, poolOut(p, st))
	return nil
}

func (s *Server) updatePool(w http.ResponseWriter, r *http.Request) error {
	p, err := decodePool(r, r.PathValue("name"))
	if err != nil {
		return err
	}
	if p, err = s.svc.UpdatePool(r.Context(), p); err != nil {
		return err
	}
	_, st, _ := s.svc.GetPool(r.Context(), p.Name)
	web.WriteJSON(w, http.StatusOK, poolOut(p, st))
	return nil
}

func (s *Server) getPool(w http.ResponseWriter, r *http.Request) error {
	p, st, err := s.svc.GetPool(r.Context(), r.PathValue("name"))
	if err != nil {
		return err
	}
	web.WriteJSON(w, http.StatusOK, poolOut(p, st))
	return nil
}

func (s *Server) listPools(w http.ResponseWriter, r *http.Request) error {
	defs, sts := s.svc.ListPools(r.Context())
	out := lifecycleapi.ListPoolsResponse{Items: make([]lifecycleapi.Pool, 0, len(defs))}
	for i := range defs {
		out.Items = append(out.Items, poolOut(defs[i], sts[i]))
	}
	web.WriteJSON(w, http.StatusOK, out)
	return nil
}

func (s *Server) deletePool(w http.ResponseWriter, r *http.Request) error {
	if err := s.svc.DeletePool(r.Context(), r.PathValue("name")); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// batchRequest is a create request plus a count (moat extension).
type batchRequest struct {
	createSandboxRequest
	Count int `json:"count"`
}

func (s *Server) createBatch(w http.ResponseWriter, r *http.Request) error {
	var body batchRequest
	if err := web.DecodeJSON(r, &body, false); err != nil {
		return err
	}
	if body.Count < 1 || body.Count > lifecycle.MaxBatch {
		return errdefs.Invalid("SANDBOX::INVALID_PARAMETER", "count must be between 1 and "+strconv.Itoa(lifecycle.MaxBatch))
	}
	req, err := s.createRequest(r, body.createSandboxRequest)
	if err != nil {
		return err
	}
	sbs, err := s.svc.CreateBatch(r.Context(), req, body.Count)
	if err != nil {
		return err
	}
	out := struct {
		Items []createSandboxResponse `json:"items"`
	}{Items: make([]createSandboxResponse, 0, len(sbs))}
	for _, sb := range sbs {
		out.Items = append(out.Items, createResponse(sb))
	}
	web.WriteJSON(w, http.StatusAccepted, out)
	return nil
}

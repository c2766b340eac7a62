package httpapi

import (
	"net/http"
	"strconv"
	"strings"

	"github.com/moat-sandbox/moat/internal/errdefs"
	"github.com/moat-sandbox/moat/internal/lifecycle"
	"github.com/moat-sandbox/moat/internal/web"
)

// Pools API: the upstream server's /pools shape (name, template,
// capacitySpec, status), with a moat template (the create request's image,
// entrypoint, env, resourceLimits and extensions) instead of a PodTemplate.

type poolTemplateJSON struct {
	Image          *imageSpec        `json:"image,omitempty"`
	SnapshotID     string            `json:"snapshotId,omitempty"`
	Entrypoint     []string          `json:"entrypoint"`
	Env            map[string]string `json:"env,omitempty"`
	ResourceLimits map[string]string `json:"resourceLimits,omitempty"`
	Extensions     map[string]string `json:"extensions,omitempty"`
}

type poolRequest struct {
	Name         string              `json:"name"`
	Template     *poolTemplateJSON   `json:"template"`
	CapacitySpec *lifecycle.Capacity `json:"capacitySpec"`
}

type poolStatusJSON struct {
	Total     int    `json:"total"`
	Allocated int    `json:"allocated"`
	Available int    `json:"available"`
	Revision  string `json:"revision"`
}

type poolJSON struct {
	Name         string             `json:"name"`
	Template     poolTemplateJSON   `json:"template"`
	CapacitySpec lifecycle.Capacity `json:"capacitySpec"`
	Status       poolStatusJSON     `json:"status"`
	CreatedAt    string             `json:"createdAt"`
}

func poolOut(p lifecycle.Pool, st lifecycle.PoolStatus) poolJSON {
	return poolJSON{
		Name: p.Name,
		Template: poolTemplateJSON{Image: poolImage(p.Template.Image), SnapshotID: p.Template.SnapshotID, Entrypoint: p.Template.Entrypoint,
			Env: p.Template.Env, ResourceLimits: p.Template.ResourceLimits, Extensions: p.Template.Extensions},
		CapacitySpec: p.Capacity,
		Status:       poolStatusJSON{Total: st.Total, Allocated: st.Allocated, Available: st.Available, Revision: strconv.Itoa(st.Revision)},
		CreatedAt:    ts(p.CreatedAt),
	}
}

func poolImage(uri string) *imageSpec {
	if uri == "" {
		return nil
	}
	return &imageSpec{URI: uri}
}

func poolImageURI(im *imageSpec) string {
	if im == nil {
		return ""
	}
	return im.URI
}

func decodePool(r *http.Request, name string) (lifecycle.Pool, error) {
	var body poolRequest
	if err := web.DecodeJSON(r, &body, false); err != nil {
		return lifecycle.Pool{}, err
	}
	if name != "" {
		if body.Name != "" && body.Name != name {
			return lifecycle.Pool{}, errdefs.Invalid("POOL::INVALID_NAME", "name in the body differs from the path")
		}
		body.Name = name
	}
	if body.Template == nil {
		return lifecycle.Pool{}, errdefs.Invalid("POOL::INVALID_TEMPLATE", "template is required")
	}
	hasImage := body.Template.Image != nil && strings.TrimSpace(body.Template.Image.URI) != ""
	hasSnap := strings.TrimSpace(body.Template.SnapshotID) != ""
	if hasImage == hasSnap {
		return lifecycle.Pool{}, errdefs.Invalid("POOL::INVALID_TEMPLATE", "template needs exactly one of image.uri or snapshotId")
	}
	if body.CapacitySpec == nil {
		return lifecycle.Pool{}, errdefs.Invalid("POOL::INVALID_CAPACITY", "capacitySpec is required")
	}
	t := body.Template
	return lifecycle.Pool{Name: body.Name, Capacity: *body.CapacitySpec, Template: lifecycle.PoolTemplate{
		Image: poolImageURI(t.Image), SnapshotID: strings.TrimSpace(t.SnapshotID), Entrypoint: t.Entrypoint, Env: t.Env, ResourceLimits: t.ResourceLimits, Extensions: t.Extensions}}, nil
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
	out := struct {
		Items []poolJSON `json:"items"`
	}{Items: make([]poolJSON, 0, len(defs))}
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
	req, err := toCreateRequest(body.createSandboxRequest)
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

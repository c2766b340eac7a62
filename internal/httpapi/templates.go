package httpapi

import (
	"net/http"

	"github.com/moat-sandbox/moat/internal/gen/lifecycleapi"
	"github.com/moat-sandbox/moat/internal/lifecycle"
	"github.com/moat-sandbox/moat/internal/lifecycle/template"
	"github.com/moat-sandbox/moat/internal/web"
)

// Template API: the sandbox templates (internal/lifecycle/template), the
// same records E2B's templateID names. Responses are the generated models.

func templateOut(t template.Template) lifecycleapi.Template {
	out := lifecycleapi.Template{ID: t.ID, Image: optString(t.Image), Entrypoint: optSlice(t.Entrypoint),
		Env: optMap(t.Env), ResourceLimits: optMap(t.ResourceLimits), User: optString(t.User), Workdir: optString(t.Workdir),
		Pool: optString(t.Pool), Tenant: optString(t.Tenant)}
	if t.TimeoutSeconds > 0 {
		out.TimeoutSeconds = &t.TimeoutSeconds
	}
	if t.BuiltIn {
		out.BuiltIn = &t.BuiltIn
	}
	if !t.CreatedAt.IsZero() {
		at := t.CreatedAt.UTC()
		out.CreatedAt = &at
	}
	return out
}

func deref[T any](p *T) T {
	var zero T
	if p == nil {
		return zero
	}
	return *p
}

func (s *Server) createTemplate(w http.ResponseWriter, r *http.Request) error {
	var body lifecycleapi.CreateTemplateRequest
	if err := web.DecodeJSON(r, &body, false); err != nil {
		return err
	}
	t, err := s.svc.Templates.Create(r.Context(), template.Template{ID: body.ID, Image: deref(body.Image),
		Entrypoint: deref(body.Entrypoint), Env: deref(body.Env), ResourceLimits: deref(body.ResourceLimits),
		User: deref(body.User), Workdir: deref(body.Workdir), TimeoutSeconds: deref(body.TimeoutSeconds), Pool: deref(body.Pool)})
	if err != nil {
		return err
	}
	web.WriteJSON(w, http.StatusCreated, templateOut(t))
	return nil
}

func (s *Server) listTemplates(w http.ResponseWriter, r *http.Request) error {
	ts, err := s.svc.Templates.List(r.Context())
	if err != nil {
		return err
	}
	out := lifecycleapi.ListTemplatesResponse{Items: make([]lifecycleapi.Template, 0, len(ts))}
	for _, t := range ts {
		out.Items = append(out.Items, templateOut(t))
	}
	web.WriteJSON(w, http.StatusOK, out)
	return nil
}

func (s *Server) getTemplate(w http.ResponseWriter, r *http.Request) error {
	t, err := s.svc.Templates.Get(r.Context(), r.PathValue("templateId"))
	if err != nil {
		return err
	}
	web.WriteJSON(w, http.StatusOK, templateOut(t))
	return nil
}

func (s *Server) deleteTemplate(w http.ResponseWriter, r *http.Request) error {
	if err := s.svc.Templates.Delete(r.Context(), r.PathValue("templateId")); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// createRequest is toCreateRequest with the request's template (if any)
// applied.
func (s *Server) createRequest(r *http.Request, b createSandboxRequest) (lifecycle.CreateRequest, error) {
	req, err := toCreateRequest(b)
	if err != nil || b.TemplateID == "" {
		return req, err
	}
	t, err := s.svc.Templates.Get(r.Context(), b.TemplateID)
	if err != nil {
		return req, err
	}
	return req, template.Apply(t, &req)
}

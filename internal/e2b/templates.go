package e2b

import (
	"fmt"

	"github.com/moat-sandbox/moat/internal/agentproto"
	"math"
	"net/http"
	"strings"

	"github.com/moat-sandbox/moat/internal/errdefs"
	"github.com/moat-sandbox/moat/internal/lifecycle"
	"github.com/moat-sandbox/moat/internal/lifecycle/snapshot"
	"github.com/moat-sandbox/moat/internal/lifecycle/template"
	"github.com/moat-sandbox/moat/internal/web"
)

// snapshotJSON is E2B's SnapshotInfo: the id a create names as its
// templateID, and its names.
type snapshotJSON struct {
	SnapshotID string   `json:"snapshotID"`
	Names      []string `json:"names"`
}

func toSnapshotJSON(sn snapshot.Snapshot) snapshotJSON {
	out := snapshotJSON{SnapshotID: sn.ID, Names: []string{}}
	if sn.Name != "" {
		out.Names = append(out.Names, sn.Name)
	}
	return out
}

// createSnapshot snapshots a sandbox (moat's snapshot: its filesystem,
// and its memory on a runtime that checkpoints). It is synchronous.
func (a *API) createSnapshot(w http.ResponseWriter, r *http.Request) error {
	var body struct {
		Name string `json:"name"`
	}
	if err := web.DecodeJSON(r, &body, true); err != nil {
		return err
	}
	id := r.PathValue("id")
	if _, err := a.visible(r, id); err != nil {
		return err
	}
	sn, err := a.svc.CreateSnapshot(r.Context(), id, body.Name)
	if err != nil {
		return err
	}
	web.WriteJSON(w, http.StatusCreated, toSnapshotJSON(sn))
	return nil
}

// listSnapshots lists the caller's Ready snapshots (?sandboxID, ?name),
// with the same cursor as sandboxes.
func (a *API) listSnapshots(w http.ResponseWriter, r *http.Request) error {
	q := r.URL.Query()
	lq, err := parseListQuery(q, true)
	if err != nil {
		return err
	}
	items, _ := a.svc.ListSnapshots(r.Context(), snapshot.SnapshotFilter{SandboxID: q.Get("sandboxID"),
		States: []snapshot.SnapshotState{snapshot.SnapshotReady}}, 1, math.MaxInt32)
	name := q.Get("name")
	var out []snapshot.Snapshot
	for _, sn := range items {
		if name != "" && sn.Name != name {
			continue
		}
		if c := lq.after; c != nil && !before(false, c.at, c.id, sn.CreatedAt, sn.ID) {
			continue
		}
		out = append(out, sn)
	}
	if len(out) > lq.limit {
		out = out[:lq.limit]
		last := out[len(out)-1]
		w.Header().Set("X-Next-Token", cursor{at: last.CreatedAt, id: last.ID}.encode())
	}
	body := make([]snapshotJSON, 0, len(out))
	for _, sn := range out {
		body = append(body, toSnapshotJSON(sn))
	}
	web.WriteJSON(w, http.StatusOK, body)
	return nil
}

// templateJSON is E2B's Template (as GET /templates lists them).
type templateJSON struct {
	TemplateID  string   `json:"templateID"`
	BuildID     string   `json:"buildID"`
	Aliases     []string `json:"aliases"`
	Names       []string `json:"names"`
	Public      bool     `json:"public"`
	CPUCount    int      `json:"cpuCount"`
	MemoryMB    int64    `json:"memoryMB"`
	DiskSizeMB  int64    `json:"diskSizeMB"`
	EnvdVersion string   `json:"envdVersion"`
	BuildStatus string   `json:"buildStatus"`
}

func (a *API) toTemplateJSON(t template.Template) templateJSON {
	res, _ := lifecycle.ParseResources(t.ResourceLimits)
	return templateJSON{TemplateID: t.ID, BuildID: t.ID, Aliases: []string{t.ID}, Names: []string{t.ID}, Public: t.BuiltIn,
		CPUCount: int(math.Ceil(float64(res.CPUMillis) / 1000)), MemoryMB: res.MemoryBytes >> 20, DiskSizeMB: res.DiskBytes >> 20,
		EnvdVersion: agentproto.EnvdVersion, BuildStatus: "ready"}
}

func (a *API) listTemplates(w http.ResponseWriter, r *http.Request) error {
	ts, err := a.svc.Templates.List(r.Context())
	if err != nil {
		return err
	}
	out := make([]templateJSON, 0, len(ts))
	for _, t := range ts {
		out = append(out, a.toTemplateJSON(t))
	}
	web.WriteJSON(w, http.StatusOK, out)
	return nil
}

// templateRef reads a template reference as the SDK sends it: an id or
// alias, maybe "namespace/alias" or with a ":tag"; moat's templates have
// one namespace per tenant and no tags, so only "default" and "latest"
// tags are accepted and the namespace is ignored.
func templateRef(ref string) (string, error) {
	if i := strings.LastIndexByte(ref, '/'); i >= 0 {
		ref = ref[i+1:]
	}
	if name, tag, ok := strings.Cut(ref, ":"); ok {
		if tag != "default" && tag != "latest" {
			return "", errdefs.WithPublic(errdefs.ErrNotFound, "", fmt.Sprintf("template tag %q not found (templates here have no tags)", tag))
		}
		ref = name
	}
	if err := template.ValidID(ref); err != nil {
		return "", invalid(fmt.Sprintf("template %q is not a valid template id", ref))
	}
	return ref, nil
}

func (a *API) getTemplate(w http.ResponseWriter, r *http.Request) error {
	id, err := templateRef(r.PathValue("id"))
	if err != nil {
		return err
	}
	t, err := a.svc.Templates.Get(r.Context(), id)
	if err != nil {
		return err
	}
	web.WriteJSON(w, http.StatusOK, a.toTemplateJSON(t))
	return nil
}

// templateAlias is Template.exists: 200 with the id when the caller can
// create from it (a template or one of its snapshots), else 404.
func (a *API) templateAlias(w http.ResponseWriter, r *http.Request) error {
	id, err := templateRef(r.PathValue("alias"))
	if err != nil {
		return err
	}
	t, err := a.svc.Templates.Get(r.Context(), id)
	if err == nil {
		web.WriteJSON(w, http.StatusOK, map[string]any{"templateID": t.ID, "public": t.BuiltIn})
		return nil
	}
	if sn, serr := a.svc.GetSnapshot(r.Context(), id); serr == nil {
		web.WriteJSON(w, http.StatusOK, map[string]any{"templateID": sn.ID, "public": false})
		return nil
	}
	return errdefs.WithPublic(err, "", fmt.Sprintf("template '%s' not found", id))
}

// deleteTemplate deletes a snapshot (the SDK's deleteSnapshot) or a
// template of the caller's tenant.
func (a *API) deleteTemplate(w http.ResponseWriter, r *http.Request) error {
	id, err := templateRef(r.PathValue("id"))
	if err != nil {
		return err
	}
	if _, serr := a.svc.GetSnapshot(r.Context(), id); serr == nil {
		if err := a.svc.DeleteSnapshot(r.Context(), id); err != nil {
			return err
		}
		w.WriteHeader(http.StatusNoContent)
		return nil
	}
	if err := a.svc.Templates.Delete(r.Context(), id); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

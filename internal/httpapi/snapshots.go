package httpapi

import (
	"net/http"
	"net/url"

	"github.com/moat-sandbox/moat/internal/errdefs"
	"github.com/moat-sandbox/moat/internal/gen/lifecycleapi"
	"github.com/moat-sandbox/moat/internal/lifecycle/snapshot"
	"github.com/moat-sandbox/moat/internal/web"
)

// Snapshot wire types are the models generated from the spec
// (lifecycleapi.Snapshot, ListSnapshotsResponse, CreateSnapshotRequest).

func snapshotToJSON(sn snapshot.Snapshot) lifecycleapi.Snapshot {
	out := lifecycleapi.Snapshot{ID: sn.ID, SandboxID: sn.SandboxID, Name: optString(sn.Name), CreatedAt: sn.CreatedAt.UTC(),
		Status: lifecycleapi.SnapshotStatus{State: lifecycleapi.SnapshotState(sn.Status.State),
			Reason: optString(sn.Status.Reason), Message: optString(sn.Status.Message)}}
	if !sn.Status.LastTransitionAt.IsZero() {
		at := sn.Status.LastTransitionAt.UTC()
		out.Status.LastTransitionAt = &at
	}
	return out
}

// optString is nil for "", so that unset optional fields are omitted.
func optString(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}

// createSnapshot answers 202 like upstream. moat commits synchronously, so
// the state is normally already Ready; upstream clients poll
// GET /snapshots/{id} until Ready, which works unchanged.
func (s *Server) createSnapshot(w http.ResponseWriter, r *http.Request) error {
	var body lifecycleapi.CreateSnapshotRequest
	if err := web.DecodeJSON(r, &body, true); err != nil {
		return err
	}
	var name string
	if body.Name != nil {
		name = *body.Name
	}
	sn, err := s.svc.CreateSnapshot(r.Context(), r.PathValue("id"), name)
	if err != nil {
		return err
	}
	w.Header().Set("Location", "/v1/snapshots/"+sn.ID)
	web.WriteJSON(w, http.StatusAccepted, snapshotToJSON(sn))
	return nil
}

func (s *Server) listSnapshots(w http.ResponseWriter, r *http.Request) error {
	q, err := url.ParseQuery(r.URL.RawQuery)
	if err != nil {
		return errdefs.Invalid("SANDBOX::INVALID_PARAMETER", "malformed query string")
	}
	f := snapshot.SnapshotFilter{SandboxID: q.Get("sandboxId"), States: filterStates(q, snapshot.ParseSnapshotState)}
	page, size, err := pageParams(q)
	if err != nil {
		return err
	}
	items, total := s.svc.ListSnapshots(r.Context(), f, page, size)
	resp := lifecycleapi.ListSnapshotsResponse{Items: make([]lifecycleapi.Snapshot, 0, len(items))}
	for _, sn := range items {
		resp.Items = append(resp.Items, snapshotToJSON(sn))
	}
	resp.Pagination = pagination(page, size, total)
	web.WriteJSON(w, http.StatusOK, resp)
	return nil
}

func (s *Server) getSnapshot(w http.ResponseWriter, r *http.Request) error {
	sn, err := s.svc.GetSnapshot(r.Context(), r.PathValue("snapshotId"))
	if err != nil {
		return err
	}
	web.WriteJSON(w, http.StatusOK, snapshotToJSON(sn))
	return nil
}

func (s *Server) deleteSnapshot(w http.ResponseWriter, r *http.Request) error {
	if err := s.svc.DeleteSnapshot(r.Context(), r.PathValue("snapshotId")); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

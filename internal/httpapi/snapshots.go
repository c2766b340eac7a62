package httpapi

import (
	"net/http"
	"net/url"
	"strings"

	"github.com/moat-sandbox/moat/internal/errdefs"
	"github.com/moat-sandbox/moat/internal/lifecycle"
	"github.com/moat-sandbox/moat/internal/web"
)

// Snapshot wire types (OpenSandbox Snapshot, ListSnapshotsResponse).

type createSnapshotRequest struct {
	Name string `json:"name"`
}

type snapshotJSON struct {
	ID        string        `json:"id"`
	SandboxID string        `json:"sandboxId"`
	Name      string        `json:"name,omitempty"`
	Status    sandboxStatus `json:"status"`
	CreatedAt string        `json:"createdAt"`
}

type listSnapshotsResponse struct {
	Items      []snapshotJSON `json:"items"`
	Pagination paginationInfo `json:"pagination"`
}

func snapshotToJSON(sn lifecycle.Snapshot) snapshotJSON {
	st := sandboxStatus{State: string(sn.Status.State), Reason: sn.Status.Reason, Message: sn.Status.Message}
	if !sn.Status.LastTransitionAt.IsZero() {
		st.LastTransitionAt = ts(sn.Status.LastTransitionAt)
	}
	return snapshotJSON{ID: sn.ID, SandboxID: sn.SandboxID, Name: sn.Name, Status: st, CreatedAt: ts(sn.CreatedAt)}
}

// createSnapshot answers 202 like upstream. moat commits synchronously, so
// the state is normally already Ready; upstream clients poll
// GET /snapshots/{id} until Ready, which works unchanged.
func (s *Server) createSnapshot(w http.ResponseWriter, r *http.Request) error {
	var body createSnapshotRequest
	if err := web.DecodeJSON(r, &body, true); err != nil {
		return err
	}
	sn, err := s.svc.CreateSnapshot(r.Context(), r.PathValue("id"), body.Name)
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
	f := lifecycle.SnapshotFilter{SandboxID: q.Get("sandboxId")}
	for _, v := range q["state"] {
		for _, part := range strings.Split(v, ",") {
			if part = strings.TrimSpace(part); part == "" {
				continue
			}
			st, err := lifecycle.ParseSnapshotState(part)
			if err != nil {
				return err
			}
			f.States = append(f.States, st)
		}
	}
	page, size, err := pageParams(q)
	if err != nil {
		return err
	}
	items, total := s.svc.ListSnapshots(r.Context(), f, page, size)
	resp := listSnapshotsResponse{Items: make([]snapshotJSON, 0, len(items))}
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

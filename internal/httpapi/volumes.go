package httpapi

import (
	"net/http"

	"github.com/moat-sandbox/moat/internal/gen/lifecycleapi"
	"github.com/moat-sandbox/moat/internal/lifecycle/mounts"
	"github.com/moat-sandbox/moat/internal/web"
)

// Volume API (moat extension): the runtime's named volumes, the storage
// behind OpenSandbox's pvc backend. Responses are the generated models.

func volumeOut(v mounts.VolumeInfo) lifecycleapi.NamedVolume {
	out := lifecycleapi.NamedVolume{Name: v.Name, CreatedAt: v.CreatedAt.UTC(), Managed: v.Managed,
		Sandboxes: v.Sandboxes, AccessModes: optSlice(v.AccessModes), Labels: optMap(v.Labels)}
	if out.Sandboxes == nil {
		out.Sandboxes = []string{}
	}
	if v.SizeBytes > 0 {
		out.CapacityBytes = &v.SizeBytes
	}
	if v.UsedBytes > 0 {
		out.UsedBytes = &v.UsedBytes
	}
	if v.StorageClass != "" {
		out.StorageClass = &v.StorageClass
	}
	return out
}

func (s *Server) listVolumes(w http.ResponseWriter, r *http.Request) error {
	vols, err := s.svc.ListVolumes(r.Context())
	if err != nil {
		return err
	}
	out := lifecycleapi.ListVolumesResponse{Items: make([]lifecycleapi.NamedVolume, 0, len(vols))}
	for _, v := range vols {
		out.Items = append(out.Items, volumeOut(v))
	}
	web.WriteJSON(w, http.StatusOK, out)
	return nil
}

func (s *Server) getVolume(w http.ResponseWriter, r *http.Request) error {
	v, err := s.svc.GetVolume(r.Context(), r.PathValue("name"))
	if err != nil {
		return err
	}
	web.WriteJSON(w, http.StatusOK, volumeOut(v))
	return nil
}

func (s *Server) deleteVolume(w http.ResponseWriter, r *http.Request) error {
	if err := s.svc.DeleteVolume(r.Context(), r.PathValue("name")); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

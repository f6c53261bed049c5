package e2b

import (
	"encoding/json"
	"fmt"
	"net/http"

	"github.com/sandgate/sandgate/internal/providers"
	"github.com/sandgate/sandgate/internal/sandbox"
)

// E2B's volumes are sandgate volumes (/v1/volumes) of the caller's key:
// Volume.create, getInfo, list and destroy, and a create's volumeMounts.
// E2B's volumes have no size; one made here is volumeSizeGiB (a sparse
// image: what it holds is what it takes). The volume content API (the
// SDK's volume.readFile and the like, at E2B_VOLUME_API_URL) is not
// served: a sandbox that mounts the volume reads and writes it.

// volumeSizeGiB is the size of a volume made through the E2B face.
const volumeSizeGiB = 1

// volumeReply is a volume as E2B's API describes it. Token is E2B's
// content API's; sandgate serves none, so it is empty.
type volumeReply struct {
	VolumeID string  `json:"volumeID"`
	Name     string  `json:"name"`
	Token    string  `json:"token"`
	Domain   *string `json:"domain"`
}

func (s *server) volumeRoutes(mux *http.ServeMux) {
	mux.HandleFunc("POST /volumes", s.createVolume)
	mux.HandleFunc("GET /volumes", s.listVolumes)
	mux.HandleFunc("GET /volumes/{id}", s.getVolume)
	mux.HandleFunc("DELETE /volumes/{id}", s.destroyVolume)
}

func (s *server) createVolume(w http.ResponseWriter, r *http.Request) {
	c := apiCaller(r)
	if _, _, err := s.svc.Authenticate(r.Context(), c, ""); err != nil {
		s.writeError(w, r, err)
		return
	}
	var body struct {
		Name string `json:"name"`
	}
	if err := decode(r, &body); err != nil {
		s.writeError(w, r, err)
		return
	}
	v, err := s.svc.CreateVolume(r.Context(), c, body.Name, volumeSizeGiB)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusCreated, volumeReply{VolumeID: v.ID, Name: v.Name})
}

func (s *server) listVolumes(w http.ResponseWriter, r *http.Request) {
	list, err := s.svc.Volumes(r.Context(), apiCaller(r))
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	out := make([]volumeReply, len(list))
	for i, v := range list {
		out[i] = volumeReply{VolumeID: v.ID, Name: v.Name}
	}
	writeJSON(w, http.StatusOK, out)
}

// getVolume describes a volume by id (or, as sandgate's own API, name).
func (s *server) getVolume(w http.ResponseWriter, r *http.Request) {
	v, err := s.svc.GetVolume(r.Context(), apiCaller(r), r.PathValue("id"))
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, volumeReply{VolumeID: v.ID, Name: v.Name})
}

// destroyVolume deletes a volume and what it holds: 404 when there is
// none (the SDK then says false), 409 while a sandbox mounts it.
func (s *server) destroyVolume(w http.ResponseWriter, r *http.Request) {
	if err := s.svc.DeleteVolume(r.Context(), apiCaller(r), r.PathValue("id")); err != nil {
		s.writeError(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// mountsOf is a create's volumeMounts ([{name, path}]) as sandgate volume
// mounts of the caller's volumes, each by name or id; a malformed list is
// added to bad (the service checks the names and paths).
func mountsOf(raw json.RawMessage, bad *providers.InvalidFields) []sandbox.VolumeRequest {
	if len(raw) == 0 || string(raw) == "null" {
		return nil
	}
	var mounts []struct {
		Name string `json:"name"`
		Path string `json:"path"`
	}
	if err := json.Unmarshal(raw, &mounts); err != nil {
		bad.Add("volumeMounts", "must be a list of {name, path}")
		return nil
	}
	out := make([]sandbox.VolumeRequest, 0, len(mounts))
	for i, m := range mounts {
		if m.Name == "" || m.Path == "" {
			bad.Add(fmt.Sprintf("volumeMounts[%d]", i), "needs a name and a path")
			continue
		}
		out = append(out, sandbox.VolumeRequest{Volume: m.Name, MountPath: m.Path})
	}
	return out
}

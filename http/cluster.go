package httpapi

import (
	"net/http"
)

func (s *Server) cluster(w http.ResponseWriter, r *http.Request) {
	v, err := s.cfg.Backend.View(r.Context())
	if err != nil {
		writeError(w, &apiError{Status: http.StatusServiceUnavailable, Message: err.Error(), Type: "server_error"})
		return
	}
	writeJSON(w, http.StatusOK, v)
}

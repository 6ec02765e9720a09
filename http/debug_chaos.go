//go:build chaos

package httpapi

import (
	"net/http"
	"strconv"

	"github.com/go-chi/chi/v5"
)

// faultInjector is what a chaos build's backend offers.
type faultInjector interface {
	InjectFault(target string, rank int) error
}

// debugRoutes adds POST /debug/fault?target=engine|api-server|coordinator
// [&rank=N], for the chaos suite. Builds without the chaos tag have no
// such route.
func (s *Server) debugRoutes(r chi.Router) {
	r.With(s.adminOnly).Post("/debug/fault", func(w http.ResponseWriter, req *http.Request) {
		inj, ok := s.cfg.Backend.(faultInjector)
		if !ok {
			writeError(w, &apiError{Status: http.StatusNotImplemented, Type: "server_error", Message: "this backend cannot inject faults"})
			return
		}
		rank, _ := strconv.Atoi(req.URL.Query().Get("rank"))
		if err := inj.InjectFault(req.URL.Query().Get("target"), rank); err != nil {
			writeError(w, badRequest(err.Error(), "target"))
			return
		}
		writeJSON(w, http.StatusAccepted, map[string]string{"status": "injected"})
	})
}

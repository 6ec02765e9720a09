//go:build !chaos

package httpapi

import "github.com/go-chi/chi/v5"

// debugRoutes adds nothing: fault injection exists only in builds with the
// chaos tag.
func (s *Server) debugRoutes(chi.Router) {}

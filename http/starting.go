package httpapi

import (
	"net/http"
	"sync/atomic"
)

// Starting answers on a node's port while it joins its cluster and loads
// its model, which may take minutes: probes and clients get a 503 (and
// /health says starting) rather than a connection that hangs. Ready hands
// the port to the node's routes.
type Starting struct {
	h atomic.Pointer[http.Handler]
}

// Ready serves h from now on.
func (s *Starting) Ready(h http.Handler) { s.h.Store(&h) }

func (s *Starting) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if h := s.h.Load(); h != nil {
		(*h).ServeHTTP(w, r)
		return
	}
	w.Header().Set("Retry-After", "5")
	if r.URL.Path == "/health" {
		writeJSON(w, http.StatusServiceUnavailable, map[string]any{"status": "starting"})
		return
	}
	writeError(w, &apiError{Status: http.StatusServiceUnavailable, Type: "server_error", Code: strp("starting"),
		Message: "this node is starting: it is joining its cluster or loading its model; send this request to another node, or again shortly"})
}

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
	// loading lists the local ranks whose engines have not started yet,
	// once the node has begun starting them.
	loading atomic.Pointer[func() []int]
}

// Loading has /health list the ranks loading returns.
func (s *Starting) Loading(loading func() []int) { s.loading.Store(&loading) }

// Ready serves h from now on.
func (s *Starting) Ready(h http.Handler) { s.h.Store(&h) }

func (s *Starting) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if h := s.h.Load(); h != nil {
		(*h).ServeHTTP(w, r)
		return
	}
	w.Header().Set("Retry-After", "5")
	if r.URL.Path == "/health" {
		body := map[string]any{"status": "starting"}
		if f := s.loading.Load(); f != nil {
			body["loading_ranks"] = (*f)()
		}
		writeJSON(w, http.StatusServiceUnavailable, body)
		return
	}
	writeError(w, &apiError{Status: http.StatusServiceUnavailable, Type: "server_error", Code: strp("starting"),
		Message: "this node is starting: it is joining its cluster or loading its model; send this request to another node, or again shortly"})
}

package httpapi

import (
	"fmt"
	"net/http"
	"time"
)

// overloaded is the 503 of a call past MaxRequests. A client that honours
// Retry-After comes back when some requests have likely finished; OpenAI's
// SDKs retry a 503 on their own.
func (s *Server) overloaded(w http.ResponseWriter) {
	s.rejected.WithLabelValues("overloaded").Inc()
	w.Header().Set("Retry-After", "1")
	writeError(w, &apiError{Status: http.StatusServiceUnavailable, Type: "server_error", Code: strp("overloaded"),
		Message: fmt.Sprintf("the server is overloaded: it holds %d requests, its limit (--max-pending-requests); try again shortly", s.cfg.MaxRequests)})
}

// shedLoad refuses a call at once while the server is full, before its
// body is read or tokenized: under a burst, refusing must cost next to
// nothing, or the refusals themselves make the server unresponsive.
func (s *Server) shedLoad(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if s.cfg.MaxRequests > 0 && s.inFlight.Load() >= int64(s.cfg.MaxRequests) {
			s.overloaded(w)
			return
		}
		next.ServeHTTP(w, r)
	})
}

// admit reserves room for n requests, all or none.
func (s *Server) admit(n int) bool {
	if s.cfg.MaxRequests == 0 {
		s.inFlight.Add(int64(n))
		return true
	}
	for {
		cur := s.inFlight.Load()
		if cur+int64(n) > int64(s.cfg.MaxRequests) {
			return false
		}
		if s.inFlight.CompareAndSwap(cur, cur+int64(n)) {
			return true
		}
	}
}

func (s *Server) release(n int) { s.inFlight.Add(-int64(n)) }

// Timeouts bound what a client may hold of the server without sending:
// a connection that trickles its headers (slowloris) or its body, or one
// left idle between requests. None bounds a response: a long generation
// streams for as long as it takes.
type Timeouts struct {
	// ReadHeader bounds the request line and headers.
	ReadHeader time.Duration
	// Read bounds the whole request, body included; once a handler has
	// read the body, the rest of the call is not bounded by it.
	Read time.Duration
	// Idle bounds a keep-alive connection between requests.
	Idle time.Duration
}

// DefaultTimeouts: headers within 10 s; a body within 60 s (a 16 MiB body
// at 2 Mbit/s); idle connections kept 75 s, longer than the 60 s after
// which load balancers (AWS's, for one) drop theirs, so that the server is
// never the side that closes a connection a balancer is about to reuse.
func DefaultTimeouts() Timeouts {
	return Timeouts{ReadHeader: 10 * time.Second, Read: time.Minute, Idle: 75 * time.Second}
}

// NewHTTPServer returns an http.Server for h with the timeouts t, where
// those not set are DefaultTimeouts'.
func NewHTTPServer(h http.Handler, t Timeouts) *http.Server {
	d := DefaultTimeouts()
	for _, f := range []struct{ v, def *time.Duration }{{&t.ReadHeader, &d.ReadHeader}, {&t.Read, &d.Read}, {&t.Idle, &d.Idle}} {
		if *f.v <= 0 {
			*f.v = *f.def
		}
	}
	return &http.Server{Handler: h, ReadHeaderTimeout: t.ReadHeader, ReadTimeout: t.Read, IdleTimeout: t.Idle}
}

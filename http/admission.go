package httpapi

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"sync/atomic"
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

// Timeouts bound what a client may hold of the server without sending or
// reading: a connection that trickles its headers (slowloris) or its body,
// one left idle between requests, or one that stops reading its response.
// None bounds a response's length: a long generation streams for as long
// as it takes while the client takes it.
type Timeouts struct {
	// ReadHeader bounds the request line and headers.
	ReadHeader time.Duration
	// Read bounds the whole request, body included; once a handler has
	// read the body, the rest of the call is not bounded by it.
	Read time.Duration
	// Idle bounds a keep-alive connection between requests.
	Idle time.Duration
	// Write bounds each write of a response: a client that takes none of
	// it for this long has its request aborted (its KV cache and its
	// admission freed) and its connection closed. It applies per write,
	// so a stream that is read may last for hours.
	Write time.Duration
}

// DefaultTimeouts: headers within 10 s; a body within 60 s (a 16 MiB body
// at 2 Mbit/s); idle connections kept 75 s, longer than the 60 s after
// which load balancers (AWS's, for one) drop theirs, so that the server is
// never the side that closes a connection a balancer is about to reuse;
// a response's writes taken within 30 s, far longer than any client that
// reads needs, and short enough that one that reads nothing cannot hold
// its slots for long.
func DefaultTimeouts() Timeouts {
	return Timeouts{ReadHeader: 10 * time.Second, Read: time.Minute, Idle: 75 * time.Second, Write: 30 * time.Second}
}

// NewHTTPServer returns an http.Server for h with the timeouts t, where
// those not set are DefaultTimeouts'.
func NewHTTPServer(h http.Handler, t Timeouts) *http.Server {
	d := DefaultTimeouts()
	for _, f := range []struct{ v, def *time.Duration }{{&t.ReadHeader, &d.ReadHeader}, {&t.Read, &d.Read}, {&t.Idle, &d.Idle}, {&t.Write, &d.Write}} {
		if *f.v <= 0 {
			*f.v = *f.def
		}
	}
	return &http.Server{Handler: h, ReadHeaderTimeout: t.ReadHeader, ReadTimeout: t.Read, IdleTimeout: t.Idle}
}

// writeDeadline bounds the next write of a response by the write timeout.
// It returns a func that lifts it again: net/http keeps a connection's
// deadline into its next request, which must not inherit this one's.
func (s *Server) writeDeadline(w http.ResponseWriter) (lift func()) {
	rc := http.NewResponseController(w)
	if rc.SetWriteDeadline(time.Now().Add(s.cfg.WriteTimeout)) != nil {
		return func() {}
	}
	return func() { _ = rc.SetWriteDeadline(time.Time{}) }
}

// errBodyBudget is a body refused because the bodies being read hold all
// the bytes the server allows.
var errBodyBudget = errors.New("httpapi: too many bytes of request bodies in flight")

// bodyBudget bounds the bytes of the request bodies being read at once.
//
// Concurrency: safe for concurrent use.
type bodyBudget struct {
	limit int64
	used  atomic.Int64
}

func (b *bodyBudget) take(n int64) bool {
	if b.used.Add(n) > b.limit {
		b.used.Add(-n)
		return false
	}
	return true
}

// budgetReader reads a body, taking each byte read from a budget until
// release gives them all back.
type budgetReader struct {
	r      io.Reader
	budget *bodyBudget
	taken  int64
}

func (br *budgetReader) Read(p []byte) (int, error) {
	n, err := br.r.Read(p)
	if n > 0 {
		if !br.budget.take(int64(n)) {
			return 0, errBodyBudget
		}
		br.taken += int64(n)
	}
	return n, err
}

func (br *budgetReader) release() {
	br.budget.used.Add(-br.taken)
	br.taken = 0
}

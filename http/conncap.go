package httpapi

import (
	"container/list"
	"context"
	"fmt"
	"net"
	"net/http"
	"sync"
	"syscall"

	"github.com/prometheus/client_golang/prometheus"
)

// ConnCap bounds a server's open connections, so that clients cannot use
// up the process's file descriptors (then nothing, /health included,
// answers, and the engines cannot open theirs).
//
// At the cap a new connection takes the place of the one that has waited
// longest without a request in progress: idle between requests, or open
// and silent since it connected (a client that connects sends its request
// at once). When every connection is in a request, up to a small reserve
// more are taken, for the routes that must answer under any load
// (/health, /ping, /metrics, /version), and closed after one; the rest get
// 503. Past the reserve a connection is closed as soon as it is accepted.
//
// Concurrency: safe for concurrent use.
type ConnCap struct {
	max, reserve int

	mu sync.Mutex
	// conns are the connections open, counted unless closing.
	conns map[net.Conn]*capConn
	// waiting are the connections without a request in progress, those
	// waiting longest first: the ones to close at the cap.
	waiting  *list.List
	counted  int
	overflow int

	open    prometheus.Gauge
	dropped *prometheus.CounterVec
}

type capConn struct {
	// waiting is the connection's place in ConnCap.waiting, nil while it
	// serves a request.
	waiting *list.Element
	// overflow marks a connection of the reserve; closing one closed to
	// make room, not counted any more.
	overflow, closing bool
}

// connReserve is how many connections past the cap may serve the cheap
// routes.
const connReserve = 32

// NewConnCap returns a cap of max connections (and the reserve).
func NewConnCap(max int) *ConnCap {
	return &ConnCap{
		max: max, reserve: connReserve, conns: make(map[net.Conn]*capConn), waiting: list.New(),
		open: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "dpnode_http_connections_open",
			Help: "HTTP connections open, bounded by --max-connections (and a reserve for /health and /metrics).",
		}),
		dropped: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "dpnode_http_connections_closed_at_cap_total",
			Help: "HTTP connections closed because --max-connections were open: to make room (one idle, or silent since it connected), or refused as accepted (every connection busy and the reserve full).",
		}, []string{"reason"}),
	}
}

// DefaultMaxConnections is the cap for a process allowed nofile
// descriptors: all but 1,024 of them (for the engines, their workers, the
// cluster's connections and files), at most 65,536 and at least 64.
func DefaultMaxConnections() int {
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		return 1024
	}
	return int(max(64, min(65536, int64(lim.Cur)-1024)))
}

// Register adds the cap's metrics to reg.
func (c *ConnCap) Register(reg prometheus.Registerer) error {
	for _, l := range []string{"made_room", "refused"} {
		c.dropped.WithLabelValues(l)
	}
	for _, col := range []prometheus.Collector{c.open, c.dropped} {
		if err := reg.Register(col); err != nil {
			return fmt.Errorf("httpapi: registering metrics: %w", err)
		}
	}
	return nil
}

// Apply makes srv keep to the cap on the listener returned.
func (c *ConnCap) Apply(srv *http.Server, ln net.Listener) net.Listener {
	prev := srv.ConnState
	srv.ConnState = func(conn net.Conn, st http.ConnState) {
		c.state(conn, st)
		if prev != nil {
			prev(conn, st)
		}
	}
	srv.ConnContext = func(ctx context.Context, conn net.Conn) context.Context {
		c.mu.Lock()
		cc := c.conns[conn]
		c.mu.Unlock()
		if cc != nil && cc.overflow {
			return context.WithValue(ctx, overflowKey{}, true)
		}
		return ctx
	}
	srv.Handler = c.cheapOnly(srv.Handler)
	return &capListener{Listener: ln, cap: c}
}

type overflowKey struct{}

// cheapOnly serves a reserve connection's call only on the routes that
// must answer under any load, and closes it after.
func (c *ConnCap) cheapOnly(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Context().Value(overflowKey{}) == nil {
			next.ServeHTTP(w, r)
			return
		}
		w.Header().Set("Connection", "close")
		switch r.URL.Path {
		case "/health", "/ping", "/metrics", "/version":
			next.ServeHTTP(w, r)
		default:
			w.Header().Set("Retry-After", "1")
			writeError(w, &apiError{Status: http.StatusServiceUnavailable, Type: "server_error", Code: strp("overloaded"),
				Message: fmt.Sprintf("the server has %d connections open, its limit (--max-connections), each in a request; try again shortly", c.max)})
		}
	})
}

type capListener struct {
	net.Listener
	cap *ConnCap
}

func (l *capListener) Accept() (net.Conn, error) {
	for {
		conn, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		if l.cap.admit(conn) {
			return conn, nil
		}
		conn.Close()
	}
}

// admit counts conn in, making room for it if the cap is reached; false
// refuses it.
func (c *ConnCap) admit(conn net.Conn) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	cc := &capConn{}
	if c.counted >= c.max {
		if front := c.waiting.Front(); front != nil {
			old := front.Value.(net.Conn)
			oc := c.conns[old]
			c.waiting.Remove(front)
			oc.waiting, oc.closing = nil, true
			c.uncount(oc)
			c.dropped.WithLabelValues("made_room").Inc()
			// Closing it wakes its server goroutine, which reports it
			// closed; it no longer counts.
			_ = old.Close()
		}
	}
	switch {
	case c.counted < c.max:
		c.counted++
	case c.overflow < c.reserve:
		cc.overflow = true
		c.overflow++
	default:
		c.dropped.WithLabelValues("refused").Inc()
		return false
	}
	cc.waiting = c.waiting.PushBack(conn)
	c.conns[conn] = cc
	c.open.Inc()
	return true
}

func (c *ConnCap) uncount(cc *capConn) {
	if cc.overflow {
		c.overflow--
	} else {
		c.counted--
	}
}

// state follows a connection: waiting while idle, busy while active,
// gone once closed.
func (c *ConnCap) state(conn net.Conn, st http.ConnState) {
	c.mu.Lock()
	defer c.mu.Unlock()
	cc := c.conns[conn]
	if cc == nil {
		return
	}
	switch st {
	case http.StateActive:
		if cc.waiting != nil {
			c.waiting.Remove(cc.waiting)
			cc.waiting = nil
		}
	case http.StateIdle:
		if cc.waiting == nil && !cc.closing {
			cc.waiting = c.waiting.PushBack(conn)
		}
	case http.StateClosed, http.StateHijacked:
		if cc.waiting != nil {
			c.waiting.Remove(cc.waiting)
		}
		if !cc.closing {
			c.uncount(cc)
		}
		delete(c.conns, conn)
		c.open.Dec()
	}
}

package node

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/asynkron/protoactor-go/remote"
	"google.golang.org/protobuf/proto"

	"github.com/dpnode/dpnode/actors"
	"github.com/dpnode/dpnode/control"
	"github.com/dpnode/dpnode/dp"
	httpapi "github.com/dpnode/dpnode/http"
	dpnodev1 "github.com/dpnode/dpnode/proto/dpnode/v1"
)

// Running is a started node.
type Running struct {
	node       *actors.Node
	membership *control.Membership
	// api, server and ln are nil on a headless node; server serves
	// starting, which answers for api once the node runs.
	api      *httpapi.Server
	server   *http.Server
	starting *httpapi.Starting
	ln       net.Listener
	// conns caps the connections of server.
	conns *httpapi.ConnCap
	// metrics serves the --metrics-port, when set, with metricsAPI's
	// routes.
	metrics    *http.Server
	metricsAPI *httpapi.Server
	metricsLn  net.Listener
	// drainRequested is closed by POST /admin/drain, leaveRequested by
	// POST /admin/leave.
	drainRequested chan struct{}
	drainOnce      sync.Once
	leaveRequested chan struct{}
	leaveOnce      sync.Once
	// leaveOnTerminate makes a stop a leave (--leave-on-terminate).
	leaveOnTerminate bool
	served           chan error
	logger           *slog.Logger
	drain            time.Duration

	// closeEngine stops what the engine runs beside the actors: the
	// llama.cpp tokenizer's worker.
	closeEngine func()
	// stopStats stops the stats line; nil when it is off.
	stopStats context.CancelFunc

	shutdownOnce sync.Once
	shutdownErr  error
}

// nodeName is unique per incarnation: a restarted node is a new member,
// and the name says which machine and process it is.
func nodeName(hostname string, transport *remote.Config) string {
	return fmt.Sprintf("%s/%s/%s", hostname, transport.AdvertisedHost, rand.Text()[:6])
}

func rankRange(t dp.Topology) string {
	size := strconv.Itoa(t.Size)
	if t.Elastic {
		size = "auto"
	}
	if t.LocalSize == 0 {
		return "none of " + size
	}
	return fmt.Sprintf("%d-%d of %s", t.StartRank, t.StartRank+t.LocalSize-1, size)
}

// Addr is the HTTP listener's address; empty on a headless node.
func (r *Running) Addr() string {
	if r.ln == nil {
		return ""
	}
	return r.ln.Addr().String()
}

// Node is the node's actors.
func (r *Running) Node() *actors.Node { return r.node }

// RequestDrain asks Run to drain the node and return (POST /admin/drain).
func (r *Running) RequestDrain() { r.drainOnce.Do(func() { close(r.drainRequested) }) }

// RequestLeave asks Run to take the node out of the deployment and return
// (POST /admin/leave).
func (r *Running) RequestLeave() { r.leaveOnce.Do(func() { close(r.leaveRequested) }) }

// Shutdown drains, then stops. Draining, the node refuses new requests
// (503, and /health says draining) and gossips that it drains, so that
// other nodes' API servers send it nothing new; it waits, up to the drain
// timeout, until neither its API server nor its engines hold a request,
// and past the timeout ends those left with a clear error. Then it stops
// serving HTTP, leaves the cluster (the others drop its ranks at once),
// and stops the actors. Its ranks stay its own, for it to take back when
// it restarts. Calls after the first (or Leave) return its result.
func (r *Running) Shutdown() error {
	r.shutdownOnce.Do(func() { r.shutdownErr = r.shutdown(r.leaveOnTerminate) })
	return r.shutdownErr
}

// Leave is Shutdown that also gives the node's ranks back once it has
// drained: an elastic deployment shrinks by them, and a fixed one has
// them free for another node.
func (r *Running) Leave() error {
	r.shutdownOnce.Do(func() { r.shutdownErr = r.shutdown(true) })
	return r.shutdownErr
}

// releaseTimeout bounds a leaving node's wait for the coordinator to take
// its ranks back; past it the node goes anyway, and its ranks stay down.
const releaseTimeout = 10 * time.Second

func (r *Running) shutdown(leave bool) error {
	deadline := time.Now().Add(r.drain)
	r.logger.Info("draining: no new requests; waiting for those in flight", "timeout", r.drain)
	// Both ports' /health say so: a headless node's probes read its
	// metrics port.
	for _, s := range []*httpapi.Server{r.api, r.metricsAPI} {
		if s != nil {
			s.SetDraining()
		}
	}
	meta := proto.Clone(r.node.Meta()).(*dpnodev1.NodeMeta)
	meta.Draining = true
	if err := r.membership.SetMeta(meta); err != nil {
		r.logger.Warn("could not gossip that this node drains", "error", err)
	}
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		idle, err := r.node.Idle(ctx)
		cancel()
		if idle || err != nil {
			break
		}
		if time.Now().After(deadline) {
			r.logger.Warn("drain timeout passed; ending the requests still in flight with an error")
			r.node.FailInFlight()
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if leave {
		ctx, cancel := context.WithTimeout(context.Background(), releaseTimeout)
		if err := r.membership.Release(ctx); err != nil {
			r.logger.Warn("could not give this node's ranks back; they stay down until a node takes them", "error", err)
		} else {
			r.logger.Info("gave this node's ranks back", "size", r.membership.Roster().Size())
		}
		cancel()
	}
	var err error
	if r.server != nil {
		// What is left are handlers writing their last bytes.
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err = r.server.Shutdown(ctx); errors.Is(err, context.DeadlineExceeded) {
			err = r.server.Close()
		}
		if serveErr := <-r.served; serveErr != nil && !errors.Is(serveErr, http.ErrServerClosed) {
			err = serveErr
		}
	}
	if r.stopStats != nil {
		r.stopStats()
	}
	r.membership.Leave(2 * time.Second)
	if r.metrics != nil {
		_ = r.metrics.Close()
	}
	r.node.Stop()
	r.closeEngine()
	r.logger.Info("stopped")
	return err
}

// Run starts a node and serves until ctx is done, then drains.
func Run(ctx context.Context, o Options) error {
	r, err := StartContext(ctx, o)
	if err != nil {
		if ctx.Err() != nil {
			// Stopped while it waited to join: nothing to drain.
			o.Logger.Info("stopped before serving", "error", err)
			return nil
		}
		return err
	}
	select {
	case <-ctx.Done():
	case <-r.drainRequested:
		r.logger.Info("drain requested over HTTP")
	case <-r.leaveRequested:
		r.logger.Info("leave requested over HTTP")
		return r.Leave()
	case err := <-r.served:
		r.membership.Leave(2 * time.Second)
		r.closeEngine()
		return fmt.Errorf("cluster: the HTTP server stopped: %w", err)
	case <-r.node.Failed():
		_ = r.Shutdown()
		return fmt.Errorf("cluster: the node cannot serve: %w", r.node.Err())
	}
	return r.Shutdown()
}

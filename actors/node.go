package actors

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/asynkron/protoactor-go/remote"

	"github.com/dpnode/dpnode/control"
	"github.com/dpnode/dpnode/dp"
	"github.com/dpnode/dpnode/engine"
	dpnodev1 "github.com/dpnode/dpnode/proto/dpnode/v1"
)

// Node is a running node: its actor system and the PIDs the HTTP server
// and the membership talk to.
type Node struct {
	// name is the node's name from Listen; cfg is set by Start.
	name      string
	cfg       NodeConfig
	system    *actor.ActorSystem
	remote    *remote.Remote
	meta      *dpnodev1.NodeMeta
	root      *actor.PID
	apiServer *actor.PID
	metrics   *Metrics
	// failed is closed when the node can no longer serve: an actor it
	// cannot do without was stopped for good by its supervisor.
	failed   chan struct{}
	failOnce sync.Once
	failErr  error
	stopOnce sync.Once
	// roster is the newest roster heard of, for a node actor that
	// restarts.
	roster atomic.Pointer[control.Roster]
}

// StartNode starts a node's actors and returns once its engines run:
// Listen, then Start.
func StartNode(cfg NodeConfig) (*Node, error) {
	n, err := Listen(cfg.Name, cfg.Remote, cfg.Logger)
	if err != nil {
		return nil, err
	}
	if err := n.Start(cfg); err != nil {
		return nil, err
	}
	return n, nil
}

// identityID is the actor that answers Identify.
const identityID = "identity"

// Listen starts a node's actor system and, given a transport, serves it
// to other nodes: the first step of a start. A node that joins an elastic
// deployment listens before it asks for its ranks, so that the cluster
// can check its certificate and its name (Identify) before it counts it;
// Start then starts its actors. name is the node's name, unique per
// incarnation.
func Listen(name string, transport *remote.Config, logger *slog.Logger) (*Node, error) {
	if logger == nil {
		logger = slog.Default()
	}
	system := actor.NewActorSystem(actor.WithLoggerFactory(func(*actor.ActorSystem) *slog.Logger {
		// protoactor logs every dead letter and lifecycle step at Info;
		// only its warnings concern an operator.
		return slog.New(minLevel{logger.Handler(), slog.LevelWarn}).With("component", "protoactor")
	}))
	n := &Node{name: name, system: system, failed: make(chan struct{})}
	if transport != nil {
		// remote.Start panics when it cannot listen; find out first.
		ln, err := net.Listen("tcp", transport.Address())
		if err != nil {
			system.Shutdown()
			return nil, fmt.Errorf("actors: the actor transport cannot listen on %s: %w", transport.Address(), err)
		}
		ln.Close()
		n.remote = remote.NewRemote(system, transport)
		// Start sets gRPC's process-wide logger, which the gRPC goroutines
		// of any other node of the process read unsynchronized: a process
		// runs one node with a transport at a time (tests included).
		n.remote.Start()
	}
	identity := &dpnodev1.Identity{Name: name}
	if _, err := system.Root.SpawnNamed(actor.PropsFromFunc(func(ctx actor.Context) {
		if _, ok := ctx.Message().(*dpnodev1.Identify); ok {
			ctx.Respond(identity)
		}
	}), identityID); err != nil {
		n.shutdownSystem()
		return nil, fmt.Errorf("actors: starting the identity actor: %w", err)
	}
	return n, nil
}

// Address is where the node's actor system listens ("nonhost" without a
// transport).
func (n *Node) Address() string { return n.system.Address() }

// Identify asks the node whose actor system listens at address for its
// name, within ctx's deadline (a second without one).
func (n *Node) Identify(ctx context.Context, address string) (string, error) {
	timeout, err := futureTimeout(ctx, time.Second)
	if err != nil {
		return "", err
	}
	res, err := n.system.Root.RequestFuture(actor.NewPID(address, identityID), &dpnodev1.Identify{}, timeout).Result()
	if err != nil {
		return "", err
	}
	id, ok := res.(*dpnodev1.Identity)
	if !ok {
		return "", fmt.Errorf("actors: %s answered %T to Identify", address, res)
	}
	return id.Name, nil
}

// futureTimeout is how long a request to an actor may wait for its answer
// within ctx; def without a deadline. protoactor's futures take a
// negative timeout as none at all: a deadline that passed on the way (a
// slow TLS handshake before Identify) must end the call, not block it.
func futureTimeout(ctx context.Context, def time.Duration) (time.Duration, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	d, ok := ctx.Deadline()
	if !ok {
		return def, nil
	}
	if t := time.Until(d); t > 0 {
		return t, nil
	}
	return 0, context.DeadlineExceeded
}

// SendClaim sends a claim for ranks, or a release, to the node actor of
// the node whose actor system listens at address.
func (n *Node) SendClaim(address string, c *dpnodev1.RankClaim) {
	n.system.Root.Send(actor.NewPID(address, nodeID), c)
}

// Start starts the node's actors on the system Listen started, and
// returns once its engines run. cfg.Name, when set, must be the name the
// node listened with; cfg.Remote is not read. On an error the node is
// stopped.
func (n *Node) Start(cfg NodeConfig) error {
	cfg.Name = cmp.Or(cfg.Name, n.name)
	err := cfg.validate()
	if err == nil && cfg.Name != n.name {
		err = fmt.Errorf("actors: the node listened as %s and starts as %s", n.name, cfg.Name)
	}
	if err != nil {
		n.Stop()
		return err
	}
	system := n.system
	n.cfg, n.metrics = cfg, NewMetrics(cfg.Registry, cfg.Model, cfg.Scheduler.MaxModelLen)
	n.roster.Store(&cfg.Roster)
	n.meta = cfg.PendingMeta()
	n.meta.ActorAddress, n.meta.HttpAddress = system.Address(), cfg.HTTPAddress
	n.meta.StartRank, n.meta.LocalSize = uint32(cfg.Topology.StartRank), uint32(cfg.Topology.LocalSize)
	props := actor.PropsFromProducer(func() actor.Actor {
		return &nodeActor{cfg: cfg, self: n.meta, metrics: n.metrics, fail: n.fail, roster: &n.roster}
	})
	pid, err := system.Root.SpawnNamed(props, nodeID)
	if err != nil {
		n.Stop()
		return fmt.Errorf("actors: starting the node actor: %w", err)
	}
	n.root = pid
	res, err := system.Root.RequestFuture(pid, &getChildren{}, 10*time.Second).Result()
	if err != nil {
		n.Stop()
		return fmt.Errorf("actors: the node actor did not start: %w", err)
	}
	n.apiServer = res.(*children).apiServer
	// Serving before every engine is up would send the first burst to
	// whichever rank started first.
	res, err = system.Root.RequestFuture(n.apiServer, &awaitReady{}, cfg.StartTimeout).Result()
	if err != nil {
		n.Stop()
		return fmt.Errorf("actors: the engines did not start within %v: %w", cfg.StartTimeout, err)
	}
	if err := res.(*ready).err; err != nil {
		n.Stop()
		return err
	}
	return nil
}

// Name is the node's name, unique per incarnation.
func (n *Node) Name() string { return n.name }

// Meta is what the node gossips about itself.
func (n *Node) Meta() *dpnodev1.NodeMeta { return n.meta }

// Model is the served model name.
func (n *Node) Model() string { return n.cfg.Model }

// Topology is the node's place in the deployment.
func (n *Node) Topology() dp.Topology { return n.cfg.Topology }

// Submit hands a request to the API server; its events arrive on
// s.Stream.
func (n *Node) Submit(s *Submission) {
	select {
	case <-n.failed:
		s.Stream.push(Event{Index: s.Index, Finish: engine.FinishedError, Err: n.failErr})
	default:
		n.system.Root.Send(n.apiServer, s)
	}
}

// Abort cancels a request.
func (n *Node) Abort(id string) { n.system.Root.Send(n.apiServer, &Abort{ID: id}) }

// Finished records a request's outcome in the metrics.
func (n *Node) Finished(o Outcome) { n.metrics.recordOutcome(o) }

// MemberEvent hands the node a membership change. It never blocks, so it
// may be called from the membership library's own goroutines.
func (n *Node) MemberEvent(ev *control.MemberEvent) { n.system.Root.Send(n.root, ev) }

// SetRoster hands the node a roster heard of by gossip; an older one
// than the node has is ignored. It never blocks.
func (n *Node) SetRoster(r control.Roster) {
	if storeNewer(&n.roster, r) {
		n.system.Root.Send(n.root, &rosterChanged{})
	}
}

// storeNewer stores r unless p holds a roster as new or newer, and says
// whether it did.
func storeNewer(p *atomic.Pointer[control.Roster], r control.Roster) bool {
	for {
		cur := p.Load()
		if !r.Newer(*cur) {
			return false
		}
		if p.CompareAndSwap(cur, &r) {
			return true
		}
	}
}

// Roster is the newest roster the node has heard of.
func (n *Node) Roster() control.Roster { return *n.roster.Load() }

// ClaimRanks hands the node a node's claim for ranks, or (release) its
// leave; the node decides it when it leads, and ignores it
// otherwise. It never blocks.
func (n *Node) ClaimRanks(c control.Claim, release bool) {
	n.system.Root.Send(n.root, &claimRanks{claim: c, release: release})
}

// MembershipReady tells the node that it has joined the cluster (or
// started a new one) and knows its members: the election may run.
func (n *Node) MembershipReady() { n.system.Root.Send(n.root, &membershipReady{}) }

// FailInFlight ends every request in flight with ErrDrained, in their
// engines too: a drain ran out of time.
func (n *Node) FailInFlight() { n.system.Root.Send(n.apiServer, &failAll{err: ErrDrained}) }

// Idle reports whether the node has no request in flight: none of its API
// server's, and none in its engines (sent by other nodes' API servers).
func (n *Node) Idle(ctx context.Context) (bool, error) {
	v, err := n.View(ctx)
	if err != nil {
		return false, err
	}
	if v.InFlight > 0 || v.Parked > 0 {
		return false, nil
	}
	for _, r := range v.Ranks {
		if r.Local && r.Running+r.Waiting > 0 {
			return false, nil
		}
	}
	return true, nil
}

// Failed is closed when the node can no longer serve; Err says why.
func (n *Node) Failed() <-chan struct{} { return n.failed }

// Err is why the node failed, once Failed is closed.
func (n *Node) Err() error {
	select {
	case <-n.failed:
		return n.failErr
	default:
		return nil
	}
}

// Fail marks the node as unable to serve; the process then exits with err.
func (n *Node) Fail(err error) { n.fail(err) }

func (n *Node) fail(err error) {
	n.failOnce.Do(func() {
		n.failErr = err
		close(n.failed)
	})
}

// Stop stops every actor of the node and waits for them.
func (n *Node) Stop() {
	n.stopOnce.Do(func() {
		if n.root != nil {
			_ = n.system.Root.StopFuture(n.root).Wait()
		}
		n.shutdownSystem()
	})
}

func (n *Node) shutdownSystem() {
	if n.remote != nil {
		// Not remote.Shutdown(true): its endpoint manager clears a map
		// that a connection lost at the same moment (a peer stopping too)
		// still reads, a data race that can panic. Stopping the server,
		// then the endpoint actors, closes every connection without it.
		n.remote.Shutdown(false)
		for _, id := range []string{"EndpointSupervisor", "activator"} {
			_ = n.system.Root.StopFuture(n.system.NewLocalPID(id)).Wait()
		}
	}
	n.system.Shutdown()
}

// System is the node's actor system, for tests that inject faults.
func (n *Node) System() *actor.ActorSystem { return n.system }

// APIServer is the API server actor's PID.
func (n *Node) APIServer() *actor.PID { return n.apiServer }

// minLevel drops records below a level.
type minLevel struct {
	slog.Handler
	level slog.Level
}

func (h minLevel) Enabled(ctx context.Context, l slog.Level) bool {
	return l >= h.level && h.Handler.Enabled(ctx, l)
}

func (h minLevel) WithAttrs(attrs []slog.Attr) slog.Handler {
	return minLevel{h.Handler.WithAttrs(attrs), h.level}
}

func (h minLevel) WithGroup(name string) slog.Handler {
	return minLevel{h.Handler.WithGroup(name), h.level}
}

// metaRanks names a member's ranks for an event.
func metaRanks(m *dpnodev1.NodeMeta) string {
	switch m.LocalSize {
	case 0:
		return "none (an API server only)"
	case 1:
		return strconv.Itoa(int(m.StartRank))
	}
	return fmt.Sprintf("%d-%d", m.StartRank, m.StartRank+m.LocalSize-1)
}

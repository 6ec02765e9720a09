package actors

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/asynkron/protoactor-go/eventstream"
	"github.com/asynkron/protoactor-go/remote"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/dpnode/dpnode/control"
	"github.com/dpnode/dpnode/dp"
	"github.com/dpnode/dpnode/engine"
	"github.com/dpnode/dpnode/gpu"
	dpnodev1 "github.com/dpnode/dpnode/proto/dpnode/v1"
)

// NodeConfig is everything a node runs with.
type NodeConfig struct {
	// Name is unique per process incarnation.
	Name string
	// Model is the served model name requests must name.
	Model    string
	Topology dp.Topology
	// Devices are the GPUs of the local ranks, one each, in rank order.
	Devices   []gpu.Device
	Scheduler engine.SchedulerConfig
	// NewExecutor builds a local rank's executor; it is called again each
	// time the rank's engine restarts, off the engine's mailbox, and must
	// return when ctx is done.
	NewExecutor func(ctx context.Context, rank int, dev gpu.Device) (engine.Executor, error)
	// Policy picks ranks; nil means dp.LiveLoad.
	Policy      dp.Policy
	Restart     RestartPolicy
	ParkTimeout time.Duration
	// Migration moves requests with output off a lost engine (see
	// APIServerConfig.Migration); MaxMigrations bounds it.
	Migration     bool
	MaxMigrations int
	Publish       dp.PublishConfig
	// StartTimeout bounds how long StartNode waits for the engines.
	StartTimeout time.Duration
	// Remote, when set, serves the node's actors to other nodes; nil keeps
	// them in the process (a node that will never have peers).
	Remote *remote.Config
	// HTTPAddress is gossiped for views; empty for a headless node.
	HTTPAddress string
	// ExpertParallel makes the ranks step in lockstep waves
	// (--enable-expert-parallel, a MoE model).
	ExpertParallel bool
	// Engine and Profile say what the ranks run, for other nodes to check
	// that they run the same (dpnodev1.NodeMeta).
	Engine, Profile string
	// CollectiveTimeout bounds a step's wait for the other ranks' reports
	// before the group re-forms without the late ones; vLLM waits for
	// NCCL's timeout, minutes, with the whole group stuck.
	CollectiveTimeout time.Duration
	// Roster is which node holds which ranks when the node starts:
	// control.Roster{Fixed: size} for a fixed size and no assigned ranks.
	Roster control.Roster
	// PublishRoster spreads a roster this node's coordinator decided, and
	// RefuseClaim tells a node why it gets no ranks; nil on a node with
	// no peers.
	PublishRoster func(r control.Roster, claimant string)
	RefuseClaim   func(node string, err error)
	// Key is this node's identity in the roster (its --node-id, or else
	// its gossip address); empty for a node that holds no ranks there.
	Key string
	// NodeID is the --node-id this node gossips; empty when its gossip
	// address is its identity.
	NodeID string
	// Experts is the model's expert count under expert parallelism: an
	// elastic deployment's size must divide it. 0 when not checked.
	Experts int
	// AwaitMembership holds the coordinator election until
	// MembershipReady: a node that has not yet heard of the cluster it
	// joins would elect itself. Off for a node that has no peers.
	AwaitMembership bool
	// Registry receives the node's metrics.
	Registry prometheus.Registerer
	Logger   *slog.Logger
}

// DefaultNodeConfig fills everything but the model, topology, devices and
// executor.
func DefaultNodeConfig() NodeConfig {
	return NodeConfig{
		Name:      "local",
		Scheduler: engine.DefaultSchedulerConfig(),
		Restart:   DefaultRestartPolicy(),
		// Long enough to ride out a few restarts with backoff; shorter
		// than a client's usual timeout, so the client hears why.
		ParkTimeout:   30 * time.Second,
		Migration:     true,
		MaxMigrations: 3,
		Publish:       dp.DefaultPublishConfig(),
		StartTimeout:  time.Minute,
		// Far above a step (tens of ms on GPUs), far below a client's
		// patience.
		CollectiveTimeout: 5 * time.Second,
		Logger:            slog.Default(),
	}
}

func (c *NodeConfig) validate() error {
	if err := c.Topology.Validate(); err != nil {
		return err
	}
	switch {
	case c.Model == "":
		return errors.New("actors: the node needs a model name")
	case c.Name == "":
		return errors.New("actors: the node needs a name")
	case len(c.Devices) != c.Topology.LocalSize:
		return fmt.Errorf("actors: %d local ranks but %d devices", c.Topology.LocalSize, len(c.Devices))
	case c.NewExecutor == nil && c.Topology.LocalSize > 0:
		return errors.New("actors: the node needs an executor factory")
	case c.Registry == nil:
		return errors.New("actors: the node needs a metrics registry")
	}
	if c.Policy == nil {
		c.Policy = dp.NewLiveLoad(c.Scheduler.MaxNumBatchedTokens)
	}
	if c.Roster.Elastic() && c.Roster.Version == 0 && !c.Topology.Elastic {
		// No roster given: the topology's fixed size.
		c.Roster = control.Roster{Fixed: c.Topology.Size}
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c.Scheduler.Validate()
}

// PendingMeta is what the node gossips before its actors run: what it
// serves and how, without ranks or addresses. A node whose ranks are
// given out at the join joins so, and gossips its whole metadata once its
// actors run.
func (c *NodeConfig) PendingMeta() *dpnodev1.NodeMeta {
	topo := c.Topology
	size := uint32(topo.Size)
	if topo.Elastic {
		size = 0
	}
	return &dpnodev1.NodeMeta{
		DataParallelSize: size,
		BootUnixNano:     time.Now().UnixNano(),
		Mode:             topo.Mode.String(),
		Headless:         topo.Headless,
		Model:            c.Model,
		ExpertParallel:   c.ExpertParallel,
		Engine:           c.Engine,
		Profile:          c.Profile,
		NodeId:           c.NodeID,
	}
}

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
	timeout := time.Second
	if d, ok := ctx.Deadline(); ok {
		timeout = time.Until(d)
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
	n.cfg, n.metrics = cfg, NewMetrics(cfg.Registry, cfg.Model)
	n.roster.Store(&cfg.Roster)
	n.meta = cfg.PendingMeta()
	n.meta.ActorAddress, n.meta.HttpAddress = system.Address(), cfg.HTTPAddress
	n.meta.StartRank, n.meta.LocalSize = uint32(cfg.Topology.StartRank), uint32(cfg.Topology.LocalSize)
	props := actor.PropsFromProducer(func() actor.Actor {
		return &nodeActor{cfg: cfg, self: n.meta, metrics: n.metrics, fail: n.fail, roster: &n.roster}
	},
		actor.WithSupervisor(actor.NewOneForOneStrategy(10, time.Minute, actor.DefaultDecider)))
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

type getChildren struct{}

type children struct {
	apiServer *actor.PID
}

// nodeUp and nodeDown tell the API server about other nodes.
type nodeUp struct {
	name string
	meta *dpnodev1.NodeMeta
}

type nodeDown struct {
	name string
}

// coordinatorStarted tells the node that its coordinator (re)started and
// must be told to everyone.
type coordinatorStarted struct{}

type membershipReady struct{}

// apiServerStarted asks the node actor to tell a (re)started API server
// what it knows: the members and the coordinator.
type apiServerStarted struct{}

// endpointLost tells the node that the actor transport lost its
// connection to a peer's address; peerGone, that the peer's port refused
// a connection since: its process is gone.
type endpointLost struct {
	address string
}

type peerGone struct {
	name, address string
	err           error
}

// dropRanks tells the coordinator that ranks left the cluster.
type dropRanks struct {
	ranks []int
}

type getMembers struct{}

// rosterChanged tells the node actor that Node.roster moved on.
type rosterChanged struct{}

// claimRanks is a node's claim, for the leader to decide.
type claimRanks struct {
	claim   control.Claim
	release bool
}

// SizeChange is one change of the deployment's size this node heard of.
type SizeChange struct {
	Version uint64    `json:"version"`
	Size    int       `json:"size"`
	From    int       `json:"from"`
	At      time.Time `json:"at"`
}

// membersView is the node actor's part of the cluster view.
type membersView struct {
	members  map[string]*dpnodev1.NodeMeta
	election control.Election
	running  bool
	roster   control.Roster
	changes  []SizeChange
}

// nodeActor is the root of a node. It owns the membership as seen by this
// node: it elects the coordinator (the oldest live member, with a
// majority of the ranks), runs it when the lot falls here, tells the API
// server and the other nodes where it runs, and turns a gossip death into
// protoactor Terminated messages for anyone watching the dead node's
// actors.
type nodeActor struct {
	cfg      NodeConfig
	self     *dpnodev1.NodeMeta
	metrics  *Metrics
	members  map[string]*dpnodev1.NodeMeta
	api      *actor.PID
	coord    *actor.PID
	election control.Election
	// coordAddr and coordEpoch are the coordinator this node follows, as
	// the API server was told last: empty and 0 while there is none.
	coordAddr  string
	coordEpoch uint64
	coordTold  bool
	// followed is the last nonzero epoch followed, to count failovers.
	followed uint64
	// deposed is the coordinator this node stopped, until it has.
	deposed *actor.PID
	// fail reports that the node cannot serve any more.
	fail     func(error)
	stopping bool
	// electing is false until the node knows its cluster.
	electing bool
	// gone are the members whose process was found gone before gossip
	// declared them dead, with what they gossiped last; gossip about them
	// is ignored until it declares them dead too.
	gone map[string]*dpnodev1.NodeMeta
	// probing are the addresses being probed.
	probing map[string]bool
	// endpoints delivers the actor transport's lost connections.
	endpoints *eventstream.Subscription
	// roster is the Node's newest roster; known is the one this actor
	// acts on, and changes are the size's recent changes.
	roster  *atomic.Pointer[control.Roster]
	known   control.Roster
	changes []SizeChange
	// keys are the members' roster keys; pending, the members in gossip
	// that have not started their actors (they wait for their ranks, or
	// load their model).
	keys    map[string]string
	pending map[string]pendingMember
}

type pendingMember struct {
	key  string
	boot int64
}

func (n *nodeActor) Receive(ctx actor.Context) {
	switch msg := ctx.Message().(type) {
	case *actor.Started:
		n.start(ctx)
	case *actor.Stopping:
		n.stopping = true
		if n.endpoints != nil {
			ctx.ActorSystem().EventStream.Unsubscribe(n.endpoints)
		}
	case *endpointLost:
		n.probe(ctx, msg.address)
	case *peerGone:
		n.peerGone(ctx, msg)
	case *recheckGone:
		if m := n.gone[msg.name]; m != nil {
			n.probeMember(ctx, msg.name, m.ActorAddress)
		}
	case *actor.Terminated:
		n.terminated(ctx, msg.Who)
	case *control.MemberEvent:
		n.memberEvent(ctx, msg)
	case *coordinatorStarted:
		n.announceCoordinator(ctx)
	case *membershipReady:
		n.electing = true
		n.reelect(ctx)
	case *apiServerStarted:
		ctx.Send(n.api, &rosterUpdate{roster: n.known})
		for name, m := range n.members {
			if name != n.cfg.Name {
				ctx.Send(n.api, &nodeUp{name: name, meta: m})
			}
		}
		if n.coordTold {
			ctx.Send(n.api, &dpnodev1.CoordinatorChanged{ActorAddress: n.coordAddr, Epoch: n.coordEpoch})
		}
	case *dpnodev1.CoordinatorChanged:
		// The coordinator this node elected restarted in place: same
		// epoch, but its subscribers and stats are gone. Announcements of
		// any other coordinator are not this node's to follow.
		if msg.ActorAddress != "" && msg.ActorAddress == n.coordAddr && msg.Epoch == n.coordEpoch {
			ctx.Send(n.api, msg)
		} else if msg.Epoch > n.coordEpoch && n.coordAddr != "" && n.coordAddr != n.self.ActorAddress {
			// Another node runs a newer coordinator: it may know that
			// the one this node follows is gone. Look for itself.
			n.probe(ctx, n.coordAddr)
		}
	case *getChildren:
		ctx.Respond(&children{apiServer: n.api})
	case *getMembers:
		ctx.Respond(&membersView{members: clone(n.members), election: n.election, running: n.coord != nil,
			roster: n.known, changes: slices.Clone(n.changes)})
	case *rosterChanged:
		n.adoptRoster(ctx)
	case *claimRanks:
		n.claim(ctx, msg)
	case *dpnodev1.RankClaim:
		// Another node's claim, over the actor transport: only a node
		// that gossip counts (a member, or one that waits for its ranks)
		// claims or gives back ranks, and only its own.
		if msg.Count > dp.MaxRanks || !n.keyLive(msg.Node) {
			n.cfg.Logger.Debug("ignored a claim for ranks from a node gossip does not count", "node", msg.Node)
			return
		}
		n.claim(ctx, &claimRanks{claim: control.Claim{Node: msg.Node, Start: int(msg.StartRank), Count: int(msg.Count), Experts: int(msg.Experts)}, release: msg.Release})
	}
}

func clone[K comparable, V any](m map[K]V) map[K]V {
	c := make(map[K]V, len(m))
	for k, v := range m {
		c[k] = v
	}
	return c
}

func (n *nodeActor) start(ctx actor.Context) {
	cfg := n.cfg
	n.members = map[string]*dpnodev1.NodeMeta{cfg.Name: n.self}
	n.keys = map[string]string{cfg.Name: cfg.Key}
	n.pending = map[string]pendingMember{}
	n.known = *n.roster.Load()
	n.metrics.dpSize.Set(float64(n.known.Size()))
	n.metrics.rosterVersion.Set(float64(n.known.Version))
	engines := make([]EngineConfig, cfg.Topology.LocalSize)
	for i := range engines {
		rank, dev := cfg.Topology.StartRank+i, cfg.Devices[i]
		engines[i] = EngineConfig{
			Rank:              rank,
			Device:            fmt.Sprintf("%d:%s (%s)", dev.Index, dev.UUID, dev.Name),
			Scheduler:         cfg.Scheduler,
			NewExecutor:       func(ctx context.Context) (engine.Executor, error) { return cfg.NewExecutor(ctx, rank, dev) },
			ExpertParallel:    cfg.ExpertParallel,
			CollectiveTimeout: cfg.CollectiveTimeout,
			Logger:            cfg.Logger.With("rank", rank),
		}
	}
	api, err := ctx.SpawnNamed(actor.PropsFromProducer(NewAPIServerProducer(APIServerConfig{
		Node:           cfg.Name,
		Engines:        engines,
		Roster:         n.known,
		BalanceRemote:  cfg.Topology.BalancesRemote(),
		ExpertParallel: cfg.ExpertParallel,
		MaxNumSeqs:     cfg.Scheduler.MaxNumSeqs,
		Policy:         cfg.Policy,
		BlockSize:      cfg.Scheduler.BlockSize,
		Restart:        cfg.Restart,
		ParkTimeout:    cfg.ParkTimeout,
		Migration:      cfg.Migration,
		MaxMigrations:  cfg.MaxMigrations,
		Metrics:        n.metrics,
		Logger:         cfg.Logger,
	})), "api-server")
	if err != nil {
		panic(fmt.Errorf("actors: spawning the API server: %w", err))
	}
	n.api = api
	n.electing = !cfg.AwaitMembership
	n.gone, n.probing = map[string]*dpnodev1.NodeMeta{}, map[string]bool{}
	self, system := ctx.Self(), ctx.ActorSystem()
	n.endpoints = system.EventStream.SubscribeWithPredicate(func(ev any) {
		system.Root.Send(self, &endpointLost{address: ev.(*remote.EndpointTerminatedEvent).Address})
	}, func(ev any) bool {
		_, ok := ev.(*remote.EndpointTerminatedEvent)
		return ok
	})
	n.reelect(ctx)
}

func (n *nodeActor) memberEvent(ctx actor.Context, ev *control.MemberEvent) {
	if ev.Name == n.cfg.Name || ev.Meta == nil {
		return
	}
	if ev.Meta.ActorAddress == "" {
		// A node that joined gossip to be given its ranks, and has not
		// started its actors: not a member to send to yet, but its ranks
		// count for the quorum once they are the deployment's.
		if ev.Kind == control.MemberLeft {
			delete(n.pending, ev.Name)
			if !n.keyLive(ev.Key) {
				n.dropJoining(ctx, ev.Key)
			}
		} else {
			n.pending[ev.Name] = pendingMember{key: ev.Key, boot: ev.Meta.BootUnixNano}
		}
		n.reelect(ctx)
		return
	}
	delete(n.pending, ev.Name)
	if ev.Meta.ActorAddress == n.self.ActorAddress {
		// An earlier incarnation of this node, restarted before gossip
		// declared it dead: it is not a peer, and its death must not cut
		// this incarnation's connections.
		return
	}
	switch ev.Kind {
	case control.MemberJoined, control.MemberUpdated:
		if n.gone[ev.Name] != nil {
			return
		}
		if _, known := n.members[ev.Name]; !known {
			n.metrics.events.add(EventNodeJoined, ev.Name, -1, fmt.Sprintf("ranks %s", metaRanks(ev.Meta)))
		}
		n.members[ev.Name] = ev.Meta
		n.keys[ev.Name] = ev.Key
		ctx.Send(n.api, &nodeUp{name: ev.Name, meta: ev.Meta})
		n.commitJoining(ctx, ev.Key, ev.Meta)
	case control.MemberLeft:
		delete(n.gone, ev.Name)
		if m, known := n.members[ev.Name]; known {
			n.metrics.events.add(EventNodeLeft, ev.Name, -1, fmt.Sprintf("ranks %s", metaRanks(m)))
		}
		n.memberGone(ctx, ev.Name, true)
		delete(n.keys, ev.Name)
		if !n.keyLive(ev.Key) {
			n.dropJoining(ctx, ev.Key)
		}
	}
	n.reelect(ctx)
}

// keyLive reports whether a member or a pending node has the roster
// identity key: the new incarnation of a node whose old one just left
// (--node-id at another address), whose ranks must stay its own.
func (n *nodeActor) keyLive(key string) bool {
	for name, k := range n.keys {
		if k == key && n.members[name] != nil {
			return true
		}
	}
	for _, p := range n.pending {
		if p.key == key {
			return true
		}
	}
	return false
}

// memberGone forgets a member that left, was declared dead by gossip or
// was found gone: the coordinator stops waiting for its ranks, whoever
// watches its actors hears Terminated (when cut: a hung node's
// connections may still be open), and the API server stops sending to
// it.
func (n *nodeActor) memberGone(ctx actor.Context, name string, cut bool) {
	left, known := n.members[name]
	if !known {
		return
	}
	delete(n.members, name)
	if n.coord != nil && left.LocalSize > 0 {
		// Its ranks will not report again: the waves go on without
		// them now rather than after a collective timeout.
		var ranks []int
		for r := int(left.StartRank); r < int(left.StartRank+left.LocalSize); r++ {
			ranks = append(ranks, r)
		}
		ctx.Send(n.coord, &dropRanks{ranks: ranks})
	}
	// Whoever watches its actors hears Terminated now, not when a TCP
	// timeout fires (a hung process keeps its connections open). Not when
	// a new incarnation already holds the address (a node restarted
	// before its death was declared): that would cut the new one's
	// connections, and the messages on them.
	if addr := left.ActorAddress; cut && addr != "" && n.memberAt(addr) == "" {
		ctx.ActorSystem().EventStream.Publish(&remote.EndpointTerminatedEvent{Address: addr})
	}
	ctx.Send(n.api, &nodeDown{name: name})
}

// reelect runs the election on the members this node sees, starts or
// stops the local coordinator to match, and tells the API server where the
// coordinator runs when that changed.
func (n *nodeActor) reelect(ctx actor.Context) {
	if !n.electing {
		return
	}
	var ms []control.Member
	for name, m := range n.members {
		ms = append(ms, control.Member{Name: name, Boot: m.BootUnixNano, StartRank: int(m.StartRank), LocalSize: int(m.LocalSize), Key: n.keys[name]})
	}
	for name, p := range n.pending {
		ms = append(ms, control.Member{Name: name, Boot: p.boot, Key: p.key, Pending: true})
	}
	e := control.Elect(ms, n.known)
	decided := n.decides()
	n.election = e
	if !decided && n.decides() {
		// Joining holds a previous leader left behind.
		defer n.sweepJoining(ctx)
	}
	mine := e.Quorum && e.Leader.Name == n.cfg.Name
	switch {
	case mine && n.coord == nil:
		pid, err := ctx.SpawnNamed(actor.PropsFromProducer(NewCoordinatorProducer(CoordinatorConfig{
			Epoch:          e.Epoch,
			Publish:        n.cfg.Publish,
			ExpertParallel: n.cfg.ExpertParallel,
			Roster:         n.known,
			Metrics:        n.metrics,
			Logger:         n.cfg.Logger,
		})), "coordinator")
		if err != nil {
			// The previous incarnation is still stopping; Terminated
			// brings us back here.
			n.cfg.Logger.Debug("coordinator not started yet", "error", err)
		} else {
			n.coord = pid
			n.metrics.coordHere.Set(1)
			n.cfg.Logger.Info("this node runs the coordinator", "epoch", e.Epoch, "ranks_seen", e.RanksSeen)
		}
	case !mine && n.coord != nil:
		n.cfg.Logger.Info("this node stops its coordinator", "leader", e.Leader.Name, "quorum", e.Quorum)
		// Poison, not Stop: what was sent to it before (the ranks of a
		// node that just left) is handled first, so the group it leaves
		// behind has no dead ranks in it. The API server, and through it
		// the engines, hear that it is gone once it is: a group it sends
		// on its way out is still its epoch's, and heard.
		ctx.Poison(n.coord)
		n.deposed, n.coord = n.coord, nil
		n.metrics.coordHere.Set(0)
	}
	if n.deposed != nil {
		return
	}
	addr, epoch := "", uint64(0)
	if e.Quorum {
		addr, epoch = n.members[e.Leader.Name].ActorAddress, e.Epoch
	}
	if !n.coordTold || addr != n.coordAddr || epoch != n.coordEpoch {
		if epoch != 0 && n.followed != 0 && epoch != n.followed {
			n.metrics.coordFailovers.Inc()
		}
		switch {
		case epoch != 0:
			n.metrics.events.add(EventCoordinator, e.Leader.Name, -1, fmt.Sprintf("coordinates (epoch %d)", epoch))
		case n.coordTold:
			n.metrics.events.add(EventCoordinator, "", -1, fmt.Sprintf("no coordinator: this node sees %d of %d ranks, no majority", e.RanksSeen, n.known.Size()))
		}
		if epoch != 0 {
			n.followed = epoch
		}
		n.metrics.coordEpoch.Set(float64(epoch) / 1e9)
		n.coordTold, n.coordAddr, n.coordEpoch = true, addr, epoch
		ctx.Send(n.api, &dpnodev1.CoordinatorChanged{ActorAddress: addr, Epoch: epoch})
	}
}

// announceCoordinator tells this node's API server and every other node
// that the coordinator here (re)started, so that they subscribe to it and
// their engines report to it afresh.
func (n *nodeActor) announceCoordinator(ctx actor.Context) {
	if n.coord == nil {
		return
	}
	msg := &dpnodev1.CoordinatorChanged{ActorAddress: n.self.ActorAddress, Epoch: n.election.Epoch}
	ctx.Send(n.api, msg)
	for name, m := range n.members {
		if name != n.cfg.Name {
			ctx.Send(actor.NewPID(m.ActorAddress, nodeID), msg)
		}
	}
}

func (n *nodeActor) terminated(ctx actor.Context, who *actor.PID) {
	if n.stopping {
		return
	}
	if n.api != nil && who.Equal(n.api) {
		// The API server stops only when its supervisor gives up on it
		// after repeated crashes; then the node is broken, and saying so
		// (the process exits) beats serving nothing.
		n.cfg.Logger.Error("the API server crashed too often and was stopped")
		n.fail(fmt.Errorf("%w (it crashed too often)", ErrAPIServerGone))
		return
	}
	// A coordinator we stopped, or one that crashed too often: the
	// election decides whether one runs here again.
	if n.coord != nil && who.Equal(n.coord) {
		n.coord = nil
	}
	if n.deposed != nil && who.Equal(n.deposed) {
		n.deposed = nil
	}
	n.reelect(ctx)
}

// maxSizeChanges is how many of the size's changes the view keeps.
const maxSizeChanges = 32

// adoptRoster acts on a newer roster: the size and its change are
// recorded, the API server learns which ranks exist, and the election
// counts the new ranks.
func (n *nodeActor) adoptRoster(ctx actor.Context) {
	r := *n.roster.Load()
	if !r.Newer(n.known) {
		return
	}
	from, to := n.known.Size(), r.Size()
	n.known = r
	n.metrics.dpSize.Set(float64(to))
	n.metrics.rosterVersion.Set(float64(r.Version))
	if to != from {
		if to > from {
			n.metrics.scaleUps.Inc()
		} else {
			n.metrics.scaleDowns.Inc()
		}
		n.changes = append(n.changes, SizeChange{Version: r.Version, Size: to, From: from, At: time.Now()})
		if len(n.changes) > maxSizeChanges {
			n.changes = n.changes[len(n.changes)-maxSizeChanges:]
		}
		n.cfg.Logger.Info("the deployment's size changed", "from", from, "to", to, "roster_version", r.Version)
		n.metrics.events.add(EventSize, "", -1, fmt.Sprintf("%d ranks to %d (roster version %d)", from, to, r.Version))
	}
	ctx.Send(n.api, &rosterUpdate{roster: r})
	if n.coord != nil {
		ctx.Send(n.coord, &rosterUpdate{roster: r})
	}
	n.reelect(ctx)
}

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
